"""Where sweep runs execute: in this process, a local process pool, or a Dask cluster.

An executor takes a picklable function and a list of items and yields ``(item, outcome)``
as runs finish, in completion order; ``outcome`` is the function's return value or the
exception that stopped it (a crashed worker, a lost connection). The sweep decides what
to do with either. Nothing here knows about scenarios.

- ``inline``: the calling process, one run after another (``--workers 1``); for debugging.
- ``local``: :class:`concurrent.futures.ProcessPoolExecutor` with the ``spawn`` start
  method, so workers never inherit the parent's threads (progress bar, Dask).
- ``dask``: a :class:`distributed.Client` connected to ``scheduler`` (``tcp://host:8786``),
  or, without an address, to a :class:`distributed.LocalCluster` it starts and stops.
  Workers must have disagg-sim installed (``pip install 'disagg-sim[distributed]'``) and
  see the same trace files. Install with the ``[distributed]`` extra.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any, Literal, Protocol, TypeVar

from simulator.errors import EXIT_TERMINATED, ConfigError

T = TypeVar("T")
ExecutorKind = Literal["local", "dask"]


class Executor(Protocol):
    """Runs ``fn`` over ``items``; yields ``(item, result or exception)`` as each ends."""

    def map_unordered(self, fn: Callable[[T], Any], items: Sequence[T]
                      ) -> Iterator[tuple[T, Any]]: ...

    def close(self) -> None: ...

    def terminate(self) -> None:
        """Stop at once (after Ctrl-C or SIGTERM): no new runs, running ones ended."""
        ...


class InlineExecutor:
    def map_unordered(self, fn: Callable[[T], Any], items: Sequence[T]
                      ) -> Iterator[tuple[T, Any]]:
        for item in items:
            try:
                yield item, fn(item)
            except Exception as exc:
                yield item, exc

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        pass


PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be (so runs in progress are not blamed for it)."""

    exit_code = EXIT_TERMINATED


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:  # the parent died; we were handed to init
            os._exit(1)
        time.sleep(0.5)


def worker_init(parent: int) -> None:
    """Run first in every local worker: the parent alone handles Ctrl-C, and a worker
    never outlives its parent, even one killed with SIGKILL.

    On Linux the kernel delivers SIGKILL to the worker when the parent dies
    (``prctl(PR_SET_PDEATHSIG)``); everywhere a thread also watches the parent's pid, which
    covers other systems and a parent that died before the ``prctl`` call.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                     name="watch-parent").start()


class LocalExecutor:
    def __init__(self, workers: int) -> None:
        self._pool = ProcessPoolExecutor(max_workers=workers,
                                         mp_context=multiprocessing.get_context("spawn"),
                                         initializer=worker_init, initargs=(os.getpid(),))

    def map_unordered(self, fn: Callable[[T], Any], items: Sequence[T]
                      ) -> Iterator[tuple[T, Any]]:
        futures: dict[Future[Any], T] = {self._pool.submit(fn, item): item for item in items}
        try:
            for fut in as_completed(futures):
                exc = fut.exception()
                yield futures[fut], (exc if exc is not None else fut.result())
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def terminate(self) -> None:
        """Stop now: cancel what has not started and end the runs in progress."""
        procs = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)


class DaskExecutor:
    def __init__(self, workers: int, scheduler: str | None) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ConfigError("the dask executor needs the `distributed` package: "
                              "pip install 'disagg-sim[distributed]'",
                              key="--executor") from None
        self._cluster = None
        if scheduler:
            try:
                self._client = Client(scheduler, timeout="20s")
            except OSError as exc:
                raise ConfigError(f"cannot reach the Dask scheduler at {scheduler!r}: {exc}",
                                  key="--scheduler") from None
        else:
            self._cluster = LocalCluster(n_workers=workers, threads_per_worker=1,
                                         processes=True, dashboard_address=None)
            self._client = Client(self._cluster)

    def map_unordered(self, fn: Callable[[T], Any], items: Sequence[T]
                      ) -> Iterator[tuple[T, Any]]:
        from distributed import as_completed as dask_completed

        futures = {self._client.submit(fn, item, pure=False): item for item in items}
        try:
            for fut in dask_completed(list(futures)):
                if fut.status == "error":
                    yield futures[fut], fut.exception()
                else:
                    yield futures[fut], fut.result()
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()

    def terminate(self) -> None:
        self.close()  # closing the client releases its futures; the cluster stops its workers


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While running, SIGTERM stops the sweep the way Ctrl-C does (exit 143, not 130)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_signum: int, _frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


MAX_WORKERS = 1024
"""Most worker processes one sweep may start (each holds a Python interpreter)."""


def check_executor(kind: str = "local", workers: int | None = None,
                   scheduler: str | None = None) -> None:
    """Refuse bad executor options up front (even when every run is already done)."""
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"workers must be 1..{MAX_WORKERS}, got {workers}", key="--workers")
    if kind not in ("local", "dask"):
        raise ConfigError(f"unknown executor {kind!r}; allowed: local, dask", key="--executor")
    if scheduler and kind != "dask":
        raise ConfigError("--scheduler is for the dask executor; add --executor dask",
                          key="--scheduler")


def make_executor(kind: str = "local", workers: int | None = None,
                  scheduler: str | None = None) -> Executor:
    """The executor named ``kind``; ``local`` with one worker runs inline."""
    check_executor(kind, workers, scheduler)
    n = workers or default_workers()
    if kind == "dask":
        return DaskExecutor(n, scheduler)
    return InlineExecutor() if n == 1 else LocalExecutor(n)
