"""Read YAML into validated pydantic models, turning every failure into one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from simulator.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a missing, empty or malformed file is a :class:`ConfigError`."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=file) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a YAML file", file=file) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file ({exc.__class__.__name__})", file=file) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"malformed YAML{where}: {problem}", file=file) from None
    if data is None:
        raise ConfigError("file is empty, expected a mapping of keys", file=file)
    return data


def format_loc(loc: tuple[Any, ...]) -> str:
    """Turn a pydantic error location into a dotted key path (`a.b[0].c`)."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif isinstance(item, str) and item.startswith(("function-", "tagged-union[")):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "<top level>"


def _describe(error: dict[str, Any]) -> str:
    kind = error.get("type", "")
    msg = str(error.get("msg", "invalid value"))
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; see `disagg-sim schema` for allowed keys)"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        ctx = error.get("ctx", {})
        return f"unknown kind {ctx.get('tag')!r}; allowed: {ctx.get('expected_tags')}"
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


def validation_to_config_error(exc: ValidationError, file: str | None) -> ConfigError:
    """The first pydantic error as a ConfigError (the others are counted, not dropped)."""
    errors = exc.errors()
    first = errors[0]
    message = _describe(first)  # type: ignore[arg-type]
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error(s) in this file)"
    return ConfigError(message, file=file, key=format_loc(tuple(first["loc"])))


def validate(model: type[M], data: Any, file: str | None = None, prefix: str = "") -> M:
    """Validate ``data`` as ``model``; errors name ``file`` and the key path."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = validation_to_config_error(exc, file)
        if prefix:
            err = ConfigError(err.message, file=err.file, key=f"{prefix}.{err.key}")
        raise err from None


def load_model(model: type[M], path: str | Path) -> M:
    return validate(model, read_yaml(path), file=str(path))
