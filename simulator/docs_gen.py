"""Generate the file reference (docs/reference/*.md) from the pydantic models.

    python -m simulator.docs_gen            # rewrite docs/reference/
    python -m simulator.docs_gen --check    # exit 1 if the files differ from the models

Every section is one model; every row one field with its YAML type, default, constraints
and the field's own ``description``. Discriminated unions (``kind: ...``) list their
variants, each with a section of its own. Nothing here is written by hand, so the
reference cannot drift from the schema: tests/test_docs_reference.py regenerates it and
compares.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from simulator.errors import ConfigError

# (file name, "module:Model", title, what the file is). A model that cannot be imported
# yet (a feature still landing) is skipped rather than failing the others.
REFERENCES: tuple[tuple[str, str, str, str], ...] = (
    ("scenario.md", "simulator.scenario.schema:Scenario", "Scenario file reference",
     "A scenario YAML describes one simulated deployment: the model, the traffic, the "
     "cluster (pools of instances, routing, KV hand-off), the latency targets and the "
     "clock. Load it with `simulator.load_scenario(path)` or run it with "
     "`disagg-sim run FILE`.\n\n"
     "Keys are written here as dotted paths, the way `Scenario.with_()` and sweep axes "
     "take them; `[]` marks a list item (pools can also be selected by name: "
     "`cluster.pools.decode.instances`). Unknown keys are errors. Units are in the key "
     "names (`_s` seconds, `_us` microseconds, `_per_s` per second)."),
    ("sweep.md", "simulator.runner.sweep:SweepSpec", "Sweep file reference",
     "A sweep YAML names a base scenario, the axes to vary (dotted paths to lists of "
     "values) and the seeds; `disagg-sim sweep FILE` runs the grid."),
    ("plan.md", "simulator.runner.planner:PlanSpec", "Plan file reference",
     "A plan YAML states a capacity question — model, traffic, SLO targets, the hardware "
     "allowed — and `disagg-sim plan FILE` searches colocated and disaggregated layouts "
     "for the cheapest ones that meet it."),
)

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "docs" / "reference"


def load_model(target: str) -> type[BaseModel] | None:
    """Import ``module:Model``; None if the module or the model does not exist (yet)."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None
        raise
    model = getattr(module, attr, None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


# ----- types as a YAML author reads them -----------------------------------------------
@dataclass
class _Section:
    model: type[BaseModel]
    path: str
    variant: str | None = None  # the `kind` value when the model is a union variant
    paths: list[str] = field(default_factory=list)
    children: list[_Section] = field(default_factory=list)
    table: list[str] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        text = self.path + (f"-{self.variant}" if self.variant else "")
        return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "top-level"

    @property
    def title(self) -> str:
        text = ", ".join(f"`{p}`" for p in self.paths if p) or "top level"
        return text + (f" — `kind: {self.variant}`" if self.variant else "")


class _Walker:
    """Registers one section per model class, at the first key path it appears under."""

    def __init__(self) -> None:
        self.sections: dict[type[BaseModel], _Section] = {}
        self.queue: list[_Section] = []
        self.current: _Section | None = None

    def section(self, model: type[BaseModel], path: str, variant: str | None = None) -> _Section:
        sec = self.sections.get(model)
        if sec is None:
            sec = _Section(model, path, variant)
            self.sections[model] = sec
            self.queue.append(sec)
            if self.current is not None:
                self.current.children.append(sec)
        if path not in sec.paths:
            sec.paths.append(path)
        return sec

    def link(self, model: type[BaseModel], path: str, variant: str | None = None) -> str:
        sec = self.section(model, path, variant)
        return f"[{model.__name__}](#{sec.anchor})"

    def type_text(self, annotation: Any, path: str, discriminator: str | None = None) -> str:
        origin = get_origin(annotation)
        if annotation is type(None):
            return "null"
        if origin is typing.Annotated:
            inner, *extra = get_args(annotation)
            disc = next((m.discriminator for m in extra
                         if isinstance(m, FieldInfo) and isinstance(m.discriminator, str)),
                        discriminator)
            return self.type_text(inner, path, disc)
        if origin in (Union, types.UnionType):
            args = get_args(annotation)
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            if discriminator and models:
                variants = []
                for m in models:
                    tag = _tag(m, discriminator)
                    variants.append(f"`{tag}` → {self.link(m, path, tag)}")
                rest = [self.type_text(a, path) for a in args if a not in models]
                text = f"one of (by `{discriminator}`): " + ", ".join(variants)
                return text + "".join(f"; or {r}" for r in rest)
            return " or ".join(self.type_text(a, path, discriminator) for a in args)
        if origin is Literal:
            return " | ".join(f"`{_yaml(v)}`" for v in get_args(annotation))
        if origin in (list, tuple, set, frozenset):
            items = [a for a in get_args(annotation) if a is not Ellipsis]
            item = self.type_text(items[0], path + "[]") if items else "any"
            return f"list of {item}"
        if origin is dict:
            key, value = get_args(annotation) or (str, Any)
            return (f"mapping of {self.type_text(key, path)} to "
                    f"{self.type_text(value, path + '.<key>')}")
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return self.link(annotation, path)
        names = {int: "integer", float: "number", str: "string", bool: "boolean", Path: "path"}
        if annotation in names:
            return names[annotation]
        if annotation is Any:
            return "any"
        return getattr(annotation, "__name__", str(annotation))


def _tag(model: type[BaseModel], discriminator: str) -> str:
    info = model.model_fields[discriminator]
    args = get_args(info.annotation)
    return str(args[0] if args else info.default)


def _yaml(value: Any) -> str:
    if isinstance(value, str):
        return value if value and re.fullmatch(r"[A-Za-z0-9_./:+-]+", value) else json.dumps(value)
    return json.dumps(value)


def _constraints(info: FieldInfo) -> str:
    words = []
    for m in info.metadata:
        if isinstance(m, at.Gt):
            words.append(f"> {m.gt}")
        elif isinstance(m, at.Ge):
            words.append(f"≥ {m.ge}")
        elif isinstance(m, at.Lt):
            words.append(f"< {m.lt}")
        elif isinstance(m, at.Le):
            words.append(f"≤ {m.le}")
        elif isinstance(m, at.MinLen):
            words.append(f"length ≥ {m.min_length}")
        elif isinstance(m, at.MaxLen):
            words.append(f"length ≤ {m.max_length}")
        elif isinstance(m, at.MultipleOf):
            words.append(f"multiple of {m.multiple_of}")
    return ", ".join(words)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        factory = info.default_factory
        if isinstance(factory, type) and issubclass(factory, BaseModel):
            return "(its fields' defaults)"
        value = factory()  # type: ignore[call-arg]
        return f"`{json.dumps(value, default=str)}`"
    value = info.default
    if value is PydanticUndefined:
        return "**required**"
    if value is None:
        return "`null`"
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return f"`{_yaml(value) if not isinstance(value, dict | list) else json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(walker: _Walker, sec: _Section) -> list[str]:
    model = sec.model
    lines = []
    if model.__doc__:
        lines += [" ".join(model.__doc__.split()), ""]
    lines += ["| key | type | default | constraints | description |",
              "|---|---|---|---|---|"]
    for name, info in model.model_fields.items():
        path = f"{sec.path}.{name}" if sec.path else name
        typ = walker.type_text(info.annotation, path, info.discriminator
                               if isinstance(info.discriminator, str) else None)
        description = info.description or ""
        if not description and name == "kind" and sec.variant:
            description = "Selects this variant."
        lines.append("| " + " | ".join(_cell(c) for c in (
            f"`{info.alias or name}`", typ, _default(info), _constraints(info),
            description)) + " |")
    checks = [d.func.__doc__ for d in model.__pydantic_decorators__.model_validators.values()
              if d.func.__doc__]
    if checks:
        lines += ["", "Checks: " + " ".join(" ".join(c.split()) for c in checks)]
    return lines


def _document_order(sec: _Section) -> list[_Section]:
    out = [sec]
    for child in sec.children:
        out += _document_order(child)
    return out


def render(model: type[BaseModel], title: str, intro: str) -> str:
    """The Markdown reference of ``model`` and everything it contains."""
    walker = _Walker()
    root = walker.section(model, "")
    done = 0
    while done < len(walker.queue):  # tables register the sections they link to
        sec = walker.queue[done]
        walker.current = sec
        sec.table = _table(walker, sec)
        done += 1
    ordered = _document_order(root)
    toc = [f"- [{s.title}](#{s.anchor})" for s in ordered]
    body: list[str] = []
    for sec in ordered:
        body += [f'<a id="{sec.anchor}"></a>', "", f"## {sec.title} ({sec.model.__name__})",
                 "", *sec.table, ""]
    source = f"{model.__module__}.{model.__name__}"
    head = [
        f"# {title}",
        "",
        f"<!-- Generated by `python -m simulator.docs_gen` from `{source}`. Do not edit: "
        "tests/test_docs_reference.py fails when this file and the models differ. -->",
        "",
        intro,
        "",
        "`disagg-sim schema` prints the same models as JSON Schema, for editor "
        "autocompletion (see docs/README.md).",
        "",
        "## Contents",
        "",
        *toc,
        "",
    ]
    return "\n".join(head + body).rstrip() + "\n"


def references() -> dict[str, str]:
    """File name -> generated Markdown, for every reference whose model exists."""
    out = {}
    for filename, target, title, intro in REFERENCES:
        model = load_model(target)
        if model is not None:
            out[filename] = render(model, title, intro)
    return out


def write_references(out_dir: Path = DEFAULT_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in references().items():
        path = out_dir / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_references(out_dir: Path = DEFAULT_DIR) -> list[str]:
    """Names of reference files that are missing or differ from a fresh generation."""
    stale = []
    for filename, text in references().items():
        path = out_dir / filename
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(filename)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.docs_gen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help="output folder")
    parser.add_argument("--check", action="store_true",
                        help="only compare; exit 1 if a file is missing or differs")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_references(args.out)
        for name in stale:
            sys.stderr.write(f"{args.out / name} is out of date: "
                             "run python -m simulator.docs_gen\n")
        return 1 if stale else 0
    try:
        for path in write_references(args.out):
            sys.stdout.write(f"wrote {path}\n")
    except OSError as exc:
        raise ConfigError(f"cannot write the reference ({exc})", file=str(args.out)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
