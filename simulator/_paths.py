"""Where the shipped data folders live, for editable and wheel installs alike."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Return the shipped folder ``name`` (``hardware_profiles`` or ``scenarios``).

    A wheel carries the folders inside the package (``simulator/_data/NAME``); an editable
    install or a source checkout finds them beside the package, at the repository root.
    """
    packaged = _PACKAGE_DIR / "_data" / name
    if packaged.is_dir():
        return packaged
    return _PACKAGE_DIR.parent / name
