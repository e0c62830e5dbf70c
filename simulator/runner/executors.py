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

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any, Literal, Protocol, TypeVar

from simulator.errors import ConfigError

T = TypeVar("T")
ExecutorKind = Literal["local", "dask"]


class Executor(Protocol):
    """Runs ``fn`` over ``items``; yields ``(item, result or exception)`` as each ends."""

    def map_unordered(self, fn: Callable[[T], Any], items: Sequence[T]
                      ) -> Iterator[tuple[T, Any]]: ...

    def close(self) -> None: ...


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


class LocalExecutor:
    def __init__(self, workers: int) -> None:
        self._pool = ProcessPoolExecutor(max_workers=workers,
                                         mp_context=multiprocessing.get_context("spawn"))

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


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


def make_executor(kind: str = "local", workers: int | None = None,
                  scheduler: str | None = None) -> Executor:
    """The executor named ``kind``; ``local`` with one worker runs inline."""
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}", key="--workers")
    n = workers or default_workers()
    if kind == "dask":
        return DaskExecutor(n, scheduler)
    if kind != "local":
        raise ConfigError(f"unknown executor {kind!r}; allowed: local, dask", key="--executor")
    if scheduler:
        raise ConfigError("--scheduler is for the dask executor; add --executor dask",
                          key="--scheduler")
    return InlineExecutor() if n == 1 else LocalExecutor(n)
