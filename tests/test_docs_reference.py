"""docs/reference/ is generated from the pydantic models and must not drift from them;
`disagg-sim schema` exports the same models as JSON Schema."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any, get_args

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from simulator.cli import app, main
from simulator.docs_gen import REFERENCES, load_model, references, render, stale_references
from simulator.scenario.schema import Scenario
from tests.conftest import REPO

REFERENCE_DIR = REPO / "docs" / "reference"
runner = CliRunner()


def test_reference_files_match_the_models() -> None:
    stale = stale_references(REFERENCE_DIR)
    assert not stale, (f"{stale} in docs/reference/ differ from the models: run "
                       "`python -m simulator.docs_gen` and commit the result")
    assert "scenario.md" in references()


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    """Every model reachable from ``model`` through field annotations."""
    if model in seen:
        return
    seen.add(model)

    def walk(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            _models(annotation, seen)
        for arg in get_args(annotation):
            walk(arg)

    for info in model.model_fields.values():
        walk(info.annotation)


@pytest.mark.parametrize("filename", [r[0] for r in REFERENCES])
def test_reference_documents_every_field(filename: str) -> None:
    target = next(r[1] for r in REFERENCES if r[0] == filename)
    root = load_model(target)
    if root is None:  # the model has not landed: there must be no stale file for it either
        assert not (REFERENCE_DIR / filename).exists()
        return
    text = (REFERENCE_DIR / filename).read_text()
    models: set[type[BaseModel]] = set()
    _models(root, models)
    assert len(models) > 1
    for model in models:
        assert f"({model.__name__})" in text, f"no section for {model.__name__}"
        for name, info in model.model_fields.items():
            assert f"| `{name}` |" in text, f"{model.__name__}.{name} missing"
            if info.description:
                assert " ".join(info.description.split()).replace("|", "\\|") in text


def test_discriminated_unions_list_their_variants() -> None:
    text = (REFERENCE_DIR / "scenario.md").read_text()
    arrival = Scenario.model_fields["workload"].annotation.model_fields["arrival"].annotation

    def variants(annotation: object) -> list[type]:
        """The models of a (possibly optional, annotated) union."""
        if isinstance(annotation, type):
            return [] if annotation is type(None) else [annotation]
        return [m for arg in get_args(annotation) for m in variants(arg)]

    kinds = [typing.get_args(m.model_fields["kind"].annotation)[0] for m in variants(arrival)]
    assert len(kinds) >= 5
    for kind in kinds:
        assert f"`{kind}` → [" in text
        assert f"`kind: {kind}`" in text


def test_generation_follows_the_models() -> None:
    """A field added to a model shows up in the generated text (so drift is caught)."""

    class Extended(Scenario):
        warmup_s: float = Field(0.0, ge=0, description="Ignore the first seconds.")

    before = render(Scenario, "t", "i")
    after = render(Extended, "t", "i")
    assert "warmup_s" not in before
    assert "| `warmup_s` | number | `0.0` | ≥ 0 | Ignore the first seconds. |" in after


def test_stale_file_is_reported(tmp_path: Path) -> None:
    for name, text in references().items():
        (tmp_path / name).write_text(text)
    assert stale_references(tmp_path) == []
    (tmp_path / "scenario.md").write_text("edited by hand\n")
    assert stale_references(tmp_path) == ["scenario.md"]
    res = runner.invoke(app, ["docs-reference", "--check", "--out", str(tmp_path)])
    assert res.exit_code == 1
    res = runner.invoke(app, ["docs-reference", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert stale_references(tmp_path) == []


# ----- JSON Schema export -------------------------------------------------------------------
def _schema(*args: str) -> dict[str, Any]:
    res = runner.invoke(app, ["schema", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _shipped() -> tuple[list[Path], list[Path], list[Path]]:
    """(scenario files, sweep files, plan files) under scenarios/.

    A sweep file names a `base`; a scenario file has a `cluster`; a plan file lists the
    `hardware` to choose from.
    """
    scenarios, sweeps, plans = [], [], []
    for path in sorted((REPO / "scenarios").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict):
            continue
        if "base" in data:
            sweeps.append(path)
        elif "cluster" in data:
            scenarios.append(path)
        elif "hardware" in data:
            plans.append(path)
    return scenarios, sweeps, plans


def test_scenario_schema_accepts_shipped_scenarios_and_rejects_typos() -> None:
    schema = _schema()
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["additionalProperties"] is False
    assert {"model", "workload", "cluster"} <= set(schema["required"])
    validator = jsonschema.Draft202012Validator(schema)
    scenarios, _, _ = _shipped()
    assert scenarios
    for path in scenarios:
        errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
        assert not errors, f"{path}: {errors[0].message}"
    bad = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    bad["cluster"]["pools"][0]["instnces"] = 2
    assert not validator.is_valid(bad)
    bad = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    bad["workload"]["arrival"]["kind"] = "poison"
    assert not validator.is_valid(bad)


@pytest.mark.parametrize(("kind", "target", "index"), [
    ("sweep", "simulator.runner.sweep:SweepSpec", 1),
    ("plan", "simulator.runner.planner:PlanSpec", 2),
])
def test_sweep_and_plan_schemas_accept_shipped_files(kind: str, target: str, index: int) -> None:
    files = _shipped()[index]
    if load_model(target) is None:
        assert not files, f"{kind} files are shipped but {target} is missing"
        return
    validator = jsonschema.Draft202012Validator(_schema("--kind", kind))
    for path in files:
        errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
        assert not errors, f"{path}: {errors[0].message}"
    assert not validator.is_valid({"typo_key": 1})


def test_schema_to_file_and_sweep_kind(tmp_path: Path) -> None:
    out = tmp_path / "scenario.schema.json"
    res = runner.invoke(app, ["schema", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["title"] == "Scenario"
    res = runner.invoke(app, ["schema", "--kind", "sweep"])
    sweep_model = load_model("simulator.runner.sweep:SweepSpec")
    if sweep_model is None:
        assert res.exit_code == 2
    else:
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["title"] == sweep_model.__name__


def test_schema_unknown_kind_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["schema", "--kind", "scenaro"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'scenaro'" in err
    assert "allowed: ['plan', 'scenario', 'sweep']" in err


# ----- the hand-written pages ------------------------------------------------------------
DOCS = REPO / "docs"
OWN_PAGES = ["README.md", "concepts.md", "architecture.md", "metrics.md", "tutorial.md"]


@pytest.mark.parametrize("page", OWN_PAGES)
def test_relative_links_resolve(page: str) -> None:
    text = (DOCS / page).read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if link.startswith(("http://", "https://", "#")):
            continue
        target, _, anchor = link.partition("#")
        path = (DOCS / target).resolve()
        assert path.exists(), f"{page}: broken link {link}"
        if anchor and path.suffix == ".md":
            headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                        for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}
            ids = set(re.findall(r'<a id="([^"]+)"', path.read_text()))
            assert anchor in headings | ids, f"{page}: no anchor #{anchor} in {target}"


def test_yaml_examples_in_docs_are_valid_scenarios() -> None:
    blocks = [b for page in OWN_PAGES
              for b in re.findall(r"```yaml\n(.*?)```", (DOCS / page).read_text(), re.S)]
    scenarios = [yaml.safe_load(b) for b in blocks if "cluster:" in b]
    assert scenarios
    for data in scenarios:
        Scenario.model_validate(data)


def test_every_summary_metric_is_defined_in_metrics_md(tiny: Scenario) -> None:
    import simulator

    text = (DOCS / "metrics.md").read_text()
    summary = simulator.run(tiny.with_(**{"workload.num_requests": 5})).summary
    pools = {p.name for p in tiny.cluster.pools}
    for raw in summary:
        key = raw
        if key.startswith("util_") and key[len("util_"):] in pools:
            key = "util_<pool>"
        base = re.sub(r"_(mean|p50|p90|p99)_s$", "", key)
        assert f"`{key}`" in text or f"`{base}" in text, f"{raw} is not defined in metrics.md"
