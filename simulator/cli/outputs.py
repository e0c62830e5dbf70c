"""Output paths of the commands: checked before any simulation, written all or nothing.

A ``run --out`` folder is written into a fresh temporary folder beside it and swapped in
when complete, so a reused folder never mixes files of two runs and an interrupted run
leaves the previous results whole. Only an empty folder or an earlier output of the same
command is ever replaced; a folder holding anything else is refused, not emptied.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from simulator.errors import ConfigError

RUN_MARKERS = ("summary.json", "scenario.resolved.yaml")
"""Files every ``run --out`` folder holds; a folder with both is an earlier run's output."""


def _probe_parent(path: Path, key: str) -> Path:
    """The folder ``path`` will be created in, made if missing; it must be writable."""
    parent = path.parent
    for ancestor in (parent, *parent.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise ConfigError(f"{ancestor} is a file, not a folder; choose another path",
                                  file=str(path), key=key)
            break
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write in {parent} ({exc.strerror or exc}); choose a "
                          "writable folder", file=str(path), key=key) from None
    return parent


def _check_name(path: Path, key: str) -> None:
    """Names the file system cannot hold fail here, not in ``stat`` further on."""
    longest = 255  # NAME_MAX of Linux, macOS and Windows file systems
    for part in path.parts:
        if len(os.fsencode(part)) + 32 > longest:  # room for a temporary name's suffix
            raise ConfigError(f"name too long ({len(os.fsencode(part))} bytes; at most "
                              f"{longest - 32})", file=str(path)[:120] + "...", key=key)


def check_out_file(path: Path, key: str) -> None:
    """A file the command will write (``--trace``): not a folder, in a writable folder."""
    _check_name(path, key)
    if path.is_dir():
        raise ConfigError("is a folder; give a file name", file=str(path), key=key)
    _probe_parent(path, key)


def check_out_folder(path: Path, key: str = "--out", markers: tuple[str, ...] = RUN_MARKERS
                     ) -> None:
    """A folder the command will replace: absent, empty, or an earlier output (``markers``)."""
    _check_name(path, key)
    if path.exists() and not path.is_dir():
        raise ConfigError("is a file; give a folder (created if missing)", file=str(path),
                          key=key)
    if path.is_dir() and any(path.iterdir()) and not all((path / m).is_file() for m in markers):
        raise ConfigError("folder holds other files (not an earlier output of this command); "
                          "give a new or empty folder", file=str(path), key=key)
    _probe_parent(path.resolve(), key)


@contextlib.contextmanager
def staged_folder(path: Path, key: str = "--out") -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``path``; on success it replaces ``path``.

    On an exception (or Ctrl-C) the temporary folder is removed and ``path`` is left as
    it was.
    """
    check_out_folder(path, key)
    target = path.resolve()
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    except OSError as exc:
        raise ConfigError(f"cannot create a folder beside it ({exc.strerror or exc})",
                          file=str(path), key=key) from None
    umask = os.umask(0o022)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a results folder is not
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)
