"""Find and load device and link profiles by name.

Shipped profiles live in ``hardware_profiles/``; a scenario may also name a YAML path,
so users can add devices without touching the package.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from simulator._paths import data_dir
from simulator.config_io import load_model
from simulator.errors import ConfigError
from simulator.hardware.profiles import DeviceProfile, LinkProfile


def profiles_dir() -> Path:
    return data_dir("hardware_profiles")


def _index(sub: str) -> dict[str, Path]:
    folder = profiles_dir() / sub
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def device_names() -> list[str]:
    return [load_device(n).name for n in _index("devices")]


def link_names() -> list[str]:
    return [load_link(n).name for n in _index("links")]


def _resolve(sub: str, name: str, what: str) -> Path:
    candidate = Path(name)
    if candidate.suffix in {".yaml", ".yml"} and candidate.is_file():
        return candidate
    index = _index(sub)
    by_key = {k.lower(): v for k, v in index.items()}
    path = by_key.get(name.lower())
    if path is None:
        raise ConfigError(
            f"unknown {what} profile {name!r}; shipped: {', '.join(index) or 'none'} "
            f"(or give a path to a YAML file)"
        )
    return path


@cache
def load_device(name: str) -> DeviceProfile:
    return load_model(DeviceProfile, _resolve("devices", name, "device"))


@cache
def load_link(name: str) -> LinkProfile:
    return load_model(LinkProfile, _resolve("links", name, "link"))
