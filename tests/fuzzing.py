"""Generic machinery of the input fuzzing (tests/test_fuzz_inputs.py).

Documents are nested dicts and lists addressed by paths (tuples of keys and indices);
what the pydantic model declares at a path (its annotation, bounds, whether it is
required, which union variant applies) drives what a strategy generates there. A ``Case``
is one generated file and what must come of it; ``feed`` runs the CLI on it in-process and
``check_bad`` / ``check_runs`` state the outcome a bad or a valid file must have.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import re
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import click
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from simulator.cli import main
from simulator.errors import EXIT_BAD_INPUT, EXIT_OK

DocPath = tuple[str | int, ...]


# ----- documents ---------------------------------------------------------------------
def walk(node: Any, path: DocPath = ()) -> Iterator[tuple[DocPath, Any]]:
    """Every (path, value) below ``node``, parents before children."""
    items = node.items() if isinstance(node, dict) else (
        enumerate(node) if isinstance(node, list) else ())
    for key, value in items:
        yield (*path, key), value
        yield from walk(value, (*path, key))


def get(doc: Any, path: DocPath) -> Any:
    for seg in path:
        doc = doc[seg]
    return doc


def replaced(doc: dict[str, Any], path: DocPath, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    get(out, path[:-1])[path[-1]] = value
    return out


def dropped(doc: dict[str, Any], path: DocPath) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    del get(out, path[:-1])[path[-1]]
    return out


def key_path(path: DocPath) -> str:
    """The spelling error messages use: ``cluster.pools[0].device``."""
    out = ""
    for seg in path:
        out += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if out else str(seg))
    return out


def parse_key_path(text: str) -> DocPath:
    return tuple(int(m[1:-1]) if m.startswith("[") else m
                 for m in re.findall(r"\[\d+\]|[^.\[\]]+", text))


def normalise(reported: str, doc: Any) -> str:
    """Drop the discriminator segment pydantic adds after a union (``arrival.poisson.x``)."""
    out: list[str | int] = []
    node = doc
    for seg in parse_key_path(reported):
        if isinstance(node, dict) and seg not in node and node.get("kind") == seg:
            continue
        out.append(seg)
        node = node[seg] if isinstance(node, dict | list) and _has(node, seg) else None
    return key_path(tuple(out))


def _has(node: Any, seg: str | int) -> bool:
    if isinstance(node, dict):
        return seg in node
    return isinstance(seg, int) and 0 <= seg < len(node)


# ----- what the model says about a path ----------------------------------------------
def _models(annotation: Any) -> list[type[BaseModel]]:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _models(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [m for a in get_args(annotation) for m in _models(a)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _item(annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin is list:
        return get_args(annotation)[0]
    if origin in (Annotated, Union, types.UnionType):
        for arg in get_args(annotation):
            found = _item(arg)
            if found is not None:
                return found
    return None


def _variant(models: list[type[BaseModel]], node: Any) -> type[BaseModel]:
    if len(models) == 1:
        return models[0]
    kind = node.get("kind") if isinstance(node, dict) else None
    for m in models:
        field = m.model_fields.get("kind")
        if field is not None and field.default == kind:
            return m
    raise LookupError(f"no variant for kind {kind!r} among {models}")


def _scenario_model() -> Any:
    from simulator.scenario.schema import Scenario

    return Scenario


# Mappings a model accepts as free-form but validates later against another model:
# a sweep's inline `base` is a scenario.
FREE_FORM: dict[tuple[str, str], Any] = {("SweepSpec", "base"): _scenario_model()}


@dataclass(frozen=True)
class Slot:
    """What the root model declares at one document path."""

    annotation: Any
    field: FieldInfo | None  # None for list elements
    in_union: bool  # the parent mapping is one variant of a discriminated union


def slot(model: type[BaseModel], doc: Any, path: DocPath) -> Slot:
    annotation: Any = model
    field: FieldInfo | None = None
    in_union = False
    node = doc
    for seg in path:
        if isinstance(seg, int):
            annotation, field, in_union = _item(annotation), None, False
        else:
            models = _models(annotation)
            if not models:  # a free-form mapping (sweep axes): no schema below here
                return Slot(Any, None, False)
            in_union = len(models) > 1
            cls = _variant(models, node)
            field = cls.model_fields[seg]
            annotation = FREE_FORM.get((cls.__name__, seg), field.annotation)
        node = node[seg]
    return Slot(annotation, field, in_union)


def model_at(model: type[BaseModel], doc: Any, path: DocPath) -> type[BaseModel]:
    """The model class that validates the mapping at ``path``."""
    annotation = slot(model, doc, path).annotation if path else model
    return _variant(_models(annotation), get(doc, path))


def accepts(annotation: Any, value: Any) -> bool:
    try:
        TypeAdapter(annotation).validate_python(value)
    except ValidationError:
        return False
    return True


def bounds(field: FieldInfo | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for meta in field.metadata if field is not None else ():
        for name in ("gt", "ge", "lt", "le", "min_length"):
            if hasattr(meta, name):
                out[name] = getattr(meta, name)
    return out


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ----- one generated file and what must come of it -----------------------------------
@dataclass(frozen=True)
class Case:
    what: str
    content: str | bytes
    key: str | tuple[str, ...] | None = None
    """The key path the error must name (document spelling; one of several where the
    problem can rightly be blamed on more than one key), if the problem sits at a key."""
    says: str | tuple[str, ...] | None = None
    """Text the message must contain (one of several)."""
    doc: Any = None


def dump(doc: Any) -> str:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(doc, Dumper=dumper, sort_keys=False, allow_unicode=True)


def doc_case(what: str, doc: Any, key: DocPath | None,
             says: str | tuple[str, ...] | None = None) -> Case:
    return Case(what, dump(doc), None if key is None else key_path(key), says, doc)


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def feed(cli: click.Command, command: str, path: Path) -> Outcome:
    """Run the CLI in-process on one file (see :func:`feed_argv`)."""
    argv = [command, str(path)]
    if command == "sweep":  # runs inline; one results folder per distinct file
        digest = hashlib.sha1(path.read_bytes()).hexdigest()[:12]
        argv += ["--out", str(path.parent / f"sweep-out-{digest}"), "--workers", "1"]
    return feed_argv(cli, argv)


def feed_argv(cli: click.Command, argv: list[str]) -> Outcome:
    """Run the CLI in-process; warnings count as stderr lines, as they would in a shell."""
    out, err = io.StringIO(), io.StringIO()
    with (contextlib.redirect_stdout(out), contextlib.redirect_stderr(err),
          warnings.catch_warnings(record=True) as caught):
        warnings.simplefilter("always")
        try:
            main(argv, cli)
            code = EXIT_OK
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    shown = [f"{w.category.__name__}: {w.message}" for w in caught
             if not issubclass(w.category, DeprecationWarning | PendingDeprecationWarning)]
    return Outcome(code, out.getvalue(), err.getvalue() + "".join(f"{s}\n" for s in shown))


def write(folder: Path, content: str | bytes) -> Path:
    path = folder / "fuzzed scenario.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def check_bad(cli: click.Command, command: str, folder: Path, case: Case) -> None:
    path = write(folder, case.content)
    got = feed(cli, command, path)
    about = f"[{case.what}] exit {got.code}, stderr {got.err!r}"
    assert got.code == EXIT_BAD_INPUT, about
    lines = got.err.splitlines()
    assert len(lines) == 1, about
    line = lines[0]
    assert "Traceback" not in line, about
    assert "internal error" not in line, about
    prefix = f"error: {path}: "
    assert line.startswith(prefix), about
    rest = line[len(prefix):]
    if case.key is not None:
        reported = rest.split(": ", 1)[0]
        allowed = (case.key,) if isinstance(case.key, str) else case.key
        assert normalise(reported, case.doc) in allowed, about
    if case.says is not None:
        texts = (case.says,) if isinstance(case.says, str) else case.says
        assert any(text in rest for text in texts), about


def check_runs(cli: click.Command, command: str, folder: Path, case: Case) -> None:
    got = feed(cli, command, write(folder, case.content))
    assert got.code == EXIT_OK, f"[{case.what}] exit {got.code}, stderr {got.err!r}"
    if command == "run":
        assert got.err == "", f"[{case.what}] stderr {got.err!r}"
        assert "simulated" in got.out
    else:  # a sweep draws its progress bar on stderr; nothing else may appear there
        noise = [ln for ln in got.err.splitlines() if "runs," not in ln and ln.strip()]
        assert not noise, f"[{case.what}] stderr {got.err!r}"
