"""Read YAML into validated pydantic models, turning every failure into one clear line."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from simulator.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


# libyaml is faster and bounds nesting depth itself; the pure-Python loader is the fallback.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_MAGNITUDE = 2**53
"""Largest number accepted in a file: doubles (and JSON) hold integers exactly up to here."""


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a missing, empty or malformed file is a :class:`ConfigError`.

    A key repeated in one mapping is an error too (YAML loaders otherwise keep the last).
    """
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=file) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a YAML file", file=file) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file ({exc.__class__.__name__})", file=file) from None
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError("file is empty, expected a mapping of keys", file=file)
        _check_duplicate_keys(node, file)
        _check_expanded_size(node, file)
        data = loader.construct_document(node)
    except yaml.reader.ReaderError as exc:
        char = exc.character if isinstance(exc.character, int) else ord(exc.character or "?")
        raise ConfigError(f"malformed YAML: {exc.reason} (character U+{char:04X} at offset "
                          f"{exc.position})", file=file) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"malformed YAML{where}: {problem}", file=file) from None
    except RecursionError:
        raise ConfigError("malformed YAML: nested too deeply", file=file) from None
    except (ValueError, OverflowError) as exc:  # e.g. a date 2024-13-45, a 5000-digit int
        reason = str(exc).split(";")[0].splitlines()[0]
        raise ConfigError(f"malformed YAML: unreadable value ({reason})", file=file) from None
    finally:
        loader.dispose()
    if data is None:
        raise ConfigError("file is empty, expected a mapping of keys", file=file)
    return data


MAX_EXPANDED_VALUES = 1_000_000
"""Most values a file may hold once its aliases are expanded (a scenario has ~100)."""


def _check_expanded_size(root: yaml.Node, file: str) -> None:
    """Refuse an alias bomb: a few lines whose aliases expand to billions of values.

    Sizes are memoised per node, so the count costs one visit per node however deep the
    aliases nest.
    """
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in size:
            continue
        kids: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            kids = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            kids = list(node.value)
        if not children_done:
            if id(node) in open_nodes:  # reached again below itself
                raise ConfigError("an alias refers to a mapping or list that contains it "
                                  "(a recursive alias); write the values out", file=file)
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in size)
            continue
        open_nodes.discard(id(node))
        size[id(node)] = 1 + sum(size.get(id(k), 1) for k in kids)
        if size[id(node)] > MAX_EXPANDED_VALUES:
            raise ConfigError(f"the file expands to more than {MAX_EXPANDED_VALUES:,} values "
                              "through its aliases (&anchor / *alias); write the values out "
                              "or use fewer nested aliases", file=file)


def _check_duplicate_keys(root: yaml.Node, file: str) -> None:
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:  # aliases share nodes; visit each once
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[tuple[str, str]] = set()
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                    stack.append((value_node, path))
                    continue
                child = f"{path}.{key_node.value}" if path else str(key_node.value)
                ident = (key_node.tag, key_node.value)
                if ident in keys:
                    line = key_node.start_mark.line + 1
                    raise ConfigError(f"duplicate key (again at line {line}); each key may "
                                      "appear once in a mapping", file=file, key=child)
                keys.add(ident)
                stack.append((value_node, child))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))


def check_numbers(data: Any, file: str | None = None, prefix: str = "") -> None:
    """Reject NaN, infinities and numbers beyond +-2**53 anywhere in ``data``.

    No field means "unbounded" by a huge number, and such values only overflow later
    (in sampling, in int64 arrays) far from the key that caused them.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(data, prefix)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict | list):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, list):
                stack.extend((value, f"{path}[{i}]") for i, value in enumerate(node))
            else:
                stack.extend((value, f"{path}.{key}" if path else str(key))
                             for key, value in node.items())
        elif isinstance(node, int | float) and not isinstance(node, bool) and not (
                -MAX_MAGNITUDE <= node <= MAX_MAGNITUDE):  # NaN fails both comparisons
            shown = f"an integer of {node.bit_length()} bits" if isinstance(node, int) \
                else repr(node)
            raise ConfigError(f"number out of range (got {shown}); numbers must be finite "
                              f"and at most 2**53 = {MAX_MAGNITUDE} in magnitude",
                              file=file, key=path or None)


def format_loc(loc: tuple[Any, ...], data: Any = None, kind: str = "") -> str:
    """Turn a pydantic error location into a dotted key path (`a.b[0].c`).

    With the validated ``data``, segments that are not keys of the document (the member
    labels pydantic adds inside a union, such as ``int`` or ``literal['auto']``) are
    dropped; a discriminated union's tag (``arrival.poisson.rate_per_s``) is kept.
    """
    parts: list[str] = []
    node = data
    for i, item in enumerate(loc):
        if isinstance(item, str) and item.startswith(("function-", "tagged-union[")):
            continue
        if data is not None:
            last = i == len(loc) - 1
            if isinstance(node, dict):
                if item in node:
                    node = node[item]
                elif node.get("kind") == item:
                    pass  # discriminator tag: stay on this mapping
                elif not (last and kind in {"missing", "extra_forbidden"}):
                    continue  # a union member's label, not a key of the file
            elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
                node = node[item]
            else:
                break  # below a scalar: only labels can follow
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "<top level>"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, unions, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _model_at(root: type[BaseModel] | None, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose mapping holds the last key of ``loc`` (None if it cannot be told)."""
    if root is None:
        return None
    candidates: list[type[BaseModel]] = [root]
    for item in loc[:-1]:
        if isinstance(item, int):
            continue  # a list index: the element type was taken with the field
        tagged = [m for m in candidates if m.model_fields.get("kind") is not None
                  and m.model_fields["kind"].default == item]
        if tagged:  # a discriminated union's tag
            candidates = tagged
            continue
        fields = [m.model_fields[item] for m in candidates if item in m.model_fields]
        if not fields:
            continue  # a union member's label (`int`, `function-after[...]`)
        candidates = _models_in(fields[0].annotation)
        if not candidates:
            return None
    return candidates[0] if len(candidates) == 1 else None


def _unknown_key(key: Any, model: type[BaseModel] | None, schema_kind: str | None) -> str:
    if model is None:
        return "unknown key (check the spelling; see `disagg-sim schema` for allowed keys)"
    allowed = list(model.model_fields)
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.5)
    if not close:  # `rate` -> `rate_per_s`: a prefix is a likely near miss too
        close = [a for a in allowed if a.startswith(str(key)) or str(key).startswith(a)][:1]
    hint = f"did you mean {close[0]!r}? " if close else ""
    where = ""
    if schema_kind is not None:
        flag = "" if schema_kind == "scenario" else f" --kind {schema_kind}"
        where = f"; see $defs.{model.__name__} in `disagg-sim schema{flag}`"
    return f"unknown key {str(key)!r} ({hint}allowed here: {', '.join(allowed)}){where}"


def _describe(error: dict[str, Any], root: type[BaseModel] | None = None,
              schema_kind: str | None = None) -> str:
    kind = error.get("type", "")
    msg = str(error.get("msg", "invalid value"))
    if kind == "extra_forbidden":
        loc = tuple(error.get("loc", ()))
        return _unknown_key(loc[-1] if loc else "?", _model_at(root, loc), schema_kind)
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        ctx = error.get("ctx", {})
        tag = str(ctx.get("tag"))
        expected = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
        close = difflib.get_close_matches(tag, expected, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown kind {tag!r}{hint}; allowed: {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return "missing `kind` key that selects the variant"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    value = error.get("input")
    if kind not in {"model_type", "dict_type"} and not isinstance(value, dict | list):
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return f"{msg} (got {shown})"
    return msg


SCHEMA_KINDS = {"Scenario": "scenario", "SweepSpec": "sweep", "PlanSpec": "plan"}
"""Root models that `disagg-sim schema --kind` prints."""


def validation_to_config_error(exc: ValidationError, file: str | None,
                                data: Any = None, model: type[BaseModel] | None = None
                                ) -> ConfigError:
    """Every pydantic error, in one line: the first names the key, the others follow.

    ``data`` (what was validated) lets the key paths follow the document's own keys;
    ``model`` (what it was validated as) lets an unknown key list the keys allowed there.
    """
    kind = SCHEMA_KINDS.get(model.__name__) if model is not None else None
    # An unknown key first: a misspelt key is also why its right spelling is "missing".
    errors = sorted(exc.errors(), key=lambda e: e.get("type") != "extra_forbidden")
    first = errors[0]
    message = _describe(first, model, kind)  # type: ignore[arg-type]
    key = format_loc(tuple(first["loc"]), data, str(first.get("type", "")))
    for other in errors[1:]:
        where = format_loc(tuple(other["loc"]), data, str(other.get("type", "")))
        message += f"; also {where}: {_describe(other, model, kind)}"  # type: ignore[arg-type]
    return ConfigError(message, file=file, key=key)


def validate(model: type[M], data: Any, file: str | None = None, prefix: str = "") -> M:
    """Validate ``data`` as ``model``; errors name ``file`` and the key path.

    Numbers are checked first (:func:`check_numbers`), so NaN, infinities and numbers
    beyond 2**53 are reported at their own key rather than overflowing later.
    """
    check_numbers(data, file, prefix)
    try:
        validated = model.model_validate(data)
    except ValidationError as exc:
        err = validation_to_config_error(exc, file, data, model)
        if prefix:
            err = ConfigError(err.message, file=err.file, key=f"{prefix}.{err.key}")
        raise err from None
    # Text becomes a number in validation too (`"inf"`, `1e400`, which YAML 1.1 reads as a
    # string): check what came out, so the rule holds whatever the spelling.
    check_numbers(validated.model_dump(mode="python"), file, prefix)
    return validated


def load_model(model: type[M], path: str | Path) -> M:
    return validate(model, read_yaml(path), file=str(path))
