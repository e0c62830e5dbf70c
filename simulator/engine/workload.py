"""Request sources: open-loop arrival processes, closed loop, offline, and trace replay."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from simulator.engine.request import Request, State
from simulator.engine.sessions import Sessions
from simulator.engine.traces import Trace, load_trace
from simulator.engine.workload_spec import (
    AllAtOnce,
    Arrival,
    ClosedLoop,
    ConstantArrival,
    EmpiricalLength,
    FixedLength,
    GammaArrival,
    Length,
    LognormalLength,
    OnOffArrival,
    PoissonArrival,
    RequestClass,
    SharedPrefix,
    TraceArrival,
    UniformLength,
    WorkloadSpec,
)

_CHUNK = 4096


def sample_lengths(spec: Length, rng: np.random.Generator, n: int) -> np.ndarray:
    if isinstance(spec, FixedLength):
        return np.full(n, spec.tokens, dtype=np.int64)
    if isinstance(spec, UniformLength):
        return rng.integers(spec.min_tokens, spec.max_tokens + 1, size=n, dtype=np.int64)
    if isinstance(spec, LognormalLength):
        sigma2 = np.log1p(spec.cv**2)
        mu = np.log(spec.mean_tokens) - sigma2 / 2
        raw = rng.lognormal(mu, np.sqrt(sigma2), size=n)
        return np.clip(np.rint(raw), spec.min_tokens, spec.max_tokens).astype(np.int64)
    if isinstance(spec, EmpiricalLength):
        values = np.asarray(spec.values, dtype=np.int64)
        p = None
        if spec.weights is not None:
            w = np.asarray(spec.weights, dtype=float)
            p = w / w.sum()
        return rng.choice(values, size=n, p=p)
    raise TypeError(f"unknown length spec {spec!r}")


def length_stream(input_tokens: Length, output_tokens: Length, prefix: SharedPrefix | None,
                  rngs: dict[str, np.random.Generator]) -> Iterator[tuple[int, int, int, int]]:
    """(prompt, output, prefix group or -1, prefix tokens) of each request, drawn in chunks."""
    while True:
        n = _CHUNK
        ins = sample_lengths(input_tokens, rngs["input"], n)
        outs = sample_lengths(output_tokens, rngs["output"], n)
        if prefix is not None:
            rng = rngs["prefix"]
            has = rng.random(n) < prefix.fraction
            group = np.where(has, rng.integers(0, prefix.groups, size=n), -1)
        else:
            group = np.full(n, -1)
        for i in range(n):
            p_tokens = 0
            prompt = int(ins[i])
            if group[i] >= 0:
                p_tokens = prefix.tokens  # type: ignore[union-attr]
                prompt += p_tokens
            yield prompt, int(outs[i]), int(group[i]), p_tokens


def gaps(a: Arrival, rng: np.random.Generator, horizon: float | None) -> Iterator[float]:
    """Inter-arrival gaps of an open-loop arrival process."""
    if isinstance(a, AllAtOnce):
        while True:
            yield 0.0
    if isinstance(a, ConstantArrival):
        while True:
            yield 1.0 / a.rate_per_s
    if isinstance(a, PoissonArrival):
        while True:
            yield from rng.exponential(1.0 / a.rate_per_s, size=_CHUNK).tolist()
    if isinstance(a, GammaArrival):
        shape = 1.0 / a.cv**2
        scale = 1.0 / (a.rate_per_s * shape)
        while True:
            yield from rng.gamma(shape, scale, size=_CHUNK).tolist()
    if isinstance(a, OnOffArrival):
        yield from _on_off_gaps(a, rng, horizon)
    raise ValueError(f"no gap generator for {a.kind}")


def _on_off_gaps(a: OnOffArrival, rng: np.random.Generator,
                 horizon: float | None) -> Iterator[float]:
    """Poisson arrivals at the ON rate in ON windows and the OFF rate in OFF windows.

    Each window's count is Poisson(rate x length) and its arrivals are uniform in it,
    drawn for many periods at once, so tiny or empty windows cost nothing per window.
    """
    period = a.on_s + a.off_s
    per_period = a.on_rate_per_s * a.on_s + a.off_rate_per_s * a.off_s
    # About _CHUNK arrivals per draw: many periods when they are quiet, one when busy.
    periods = int(min(_CHUNK, max(1.0, _CHUNK / per_period)))
    first, last = 0, 0.0
    while True:
        k = np.arange(first, first + periods)
        on_n = rng.poisson(a.on_rate_per_s * a.on_s, size=periods)
        off_n = rng.poisson(a.off_rate_per_s * a.off_s, size=periods)
        starts = np.concatenate([np.repeat(k * period, on_n),
                                 np.repeat(k * period + a.on_s, off_n)])
        widths = np.concatenate([np.full(on_n.sum(), a.on_s), np.full(off_n.sum(), a.off_s)])
        times = np.sort(starts + rng.random(len(starts)) * widths)
        for t in times.tolist():
            yield t - last
            last = t
        first += periods
        if horizon is not None and first * period > horizon:
            return


class Workload:
    """Issues requests into the cluster through ``submit``."""

    def __init__(self, env: simpy.Environment, spec: WorkloadSpec,
                 rngs: dict[str, np.random.Generator], submit: Callable[[Request], None],
                 base_dir: Path | None = None, max_prompt_tokens: int | None = None,
                 cancel: Callable[[Request], None] | None = None,
                 class_rngs: dict[str, dict[str, np.random.Generator]] | None = None) -> None:
        self.env = env
        self.spec = spec
        self.rngs = rngs
        self.submit = submit
        self.base_dir = base_dir or Path.cwd()
        self.max_prompt_tokens = max_prompt_tokens
        self.issued = 0
        self.finished = 0
        self.exhausted = False  # no more requests will be issued
        self.done = env.event()  # every issued request has ended
        self.trace: Trace | None = None
        # Request classes: each issues from its own generators (class_rngs, by name); a
        # client whose request times out cancels it (``cancel``) and may retry.
        self.cancel = cancel or (lambda _r: None)
        self.classes = {c.name: c for c in spec.classes or ()}
        self.class_rngs = class_rngs or {}
        self._sources_left = len(self.classes)
        self._retries_pending = 0
        self._sends_pending = 0  # closed-loop requests whose slot is taken, still unsent
        self._first_attempts = 0
        if isinstance(spec.arrival, TraceArrival):
            path = Path(spec.arrival.path)
            if not path.is_absolute():
                path = self.base_dir / path
            self.trace = load_trace(path, skip_bad_rows=spec.arrival.skip_bad_rows)
        self._sessions = Sessions(self) if spec.sessions is not None else None
        self._closed_left = 0
        self._warmup_left = 0
        self._warmup_unsent = 0
        self.measure_from_id = 0  # requests with lower ids are warm-ups, not results
        self._lengths = self._length_iter()

    # ----- lengths ----------------------------------------------------------------------
    def _length_iter(self) -> Iterator[tuple[int, int, int, int]]:
        spec = self.spec
        return length_stream(spec.input_tokens, spec.output_tokens,  # type: ignore[arg-type]
                             spec.shared_prefix, self.rngs)

    def _make(self, t: float, prompt: int, output: int, group: int = -1,
              prefix_tokens: int = 0) -> Request:
        req = Request(self.issued, t, prompt, output, group, prefix_tokens)
        if group >= 0:
            # A shared prefix is a chain of hash blocks named by its group; negative ids
            # never collide with trace hash ids (which are >= 0).
            blocks = prefix_tokens // self.spec.prefix_block_tokens
            req.block_hashes = [-(group * 1_000_003 + i) - 1 for i in range(blocks)]
        self.issued += 1
        return req

    # ----- processes ----------------------------------------------------------------
    def start(self) -> None:
        if self.classes:
            for cls in self.classes.values():
                self.env.process(self._issue_class(cls))
            return
        assert self.spec.arrival is not None
        kind = self.spec.arrival.kind
        if kind == "closed_loop":
            self._start_closed_loop()
        else:
            self.env.process(self._issue_all())

    def _issue_all(self) -> Generator[simpy.Event, Any, None]:
        yield from self._open_loop()
        self.exhausted = True
        self._check_done()

    def _check_done(self) -> None:
        if self._sessions is not None and self._sessions.open:
            return  # sessions still have turns to send
        if (self.exhausted and self.finished >= self.issued and not self._retries_pending
                and not self._sends_pending and not self.done.triggered):
            self.done.succeed()

    # ----- request classes -------------------------------------------------------------
    def _issue_class(self, cls: RequestClass) -> Generator[simpy.Event, Any, None]:
        env = self.env
        rngs = self.class_rngs[cls.name]
        lengths = length_stream(cls.input_tokens, cls.output_tokens, cls.shared_prefix, rngs)
        bounds = [b for b in (cls.duration_s, self.spec.duration_s) if b is not None]
        horizon = min(bounds) if bounds else None
        t = 0.0
        total = self.spec.num_requests
        # Each pass that does not stop issues one request: ``sent`` counts them.
        for sent, gap in enumerate(gaps(cls.arrival, rngs["arrival"], horizon)):
            if cls.num_requests is not None and sent >= cls.num_requests:
                break
            if total is not None and self._first_attempts >= total:
                break
            t += gap
            if horizon is not None and t > horizon:
                break
            if t > env.now:
                yield env.timeout(t - env.now)
            prompt, output, group, p_tokens = next(lengths)
            req = self._make(env.now, prompt, output, group, p_tokens)
            self._first_attempts += 1
            self._send(req, cls)
        self._sources_left -= 1
        if not self._sources_left:
            self.exhausted = True
            self._check_done()

    def _send(self, req: Request, cls: RequestClass) -> None:
        req.klass, req.priority = cls.name, cls.priority
        if cls.timeout_s is not None:
            # The client's timer starts before the request reaches the cluster, so a step
            # ending at the same instant as the timeout ends after the client gave up.
            self.env.timeout(cls.timeout_s).callbacks.append(lambda _e: self._give_up(req))
        self.submit(req)

    def _give_up(self, req: Request) -> None:
        if not req.ended:
            self.cancel(req)

    def _retry(self, req: Request, cls: RequestClass) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(cls.retry_backoff_s * 2.0 ** req.attempt)
        new = self._make(self.env.now, req.prompt_tokens, req.output_tokens,
                         req.prefix_group, req.prefix_tokens)
        new.block_hashes = req.block_hashes
        new.attempt, new.root_id = req.attempt + 1, req.root_id
        self._retries_pending -= 1
        self._send(new, cls)

    def _open_loop(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        limit = self.spec.num_requests
        horizon = self.spec.duration_s
        if self.trace is not None:
            yield from self._replay(limit, horizon)
            return
        t = 0.0
        sessions = self._sessions
        assert self.spec.arrival is not None
        for gap in gaps(self.spec.arrival, self.rngs["arrival"], horizon):
            sent = sessions.planned if sessions is not None else self.issued
            if limit is not None and sent >= limit:
                return
            t += gap
            if horizon is not None and t > horizon:
                return
            if t > env.now:
                yield env.timeout(t - env.now)
            if sessions is not None:
                sessions.start(limit)
                continue
            prompt, output, group, p_tokens = next(self._lengths)
            self.submit(self._make(env.now, prompt, output, group, p_tokens))

    def _replay(self, limit: int | None, horizon: float | None) -> Generator[simpy.Event, Any, None]:
        env = self.env
        tr = self.trace
        assert tr is not None
        a = self.spec.arrival
        assert isinstance(a, TraceArrival)
        mask = tr.times_s >= a.start_s
        times = (tr.times_s[mask] - a.start_s) * a.time_scale
        ins, outs = tr.input_tokens[mask], tr.output_tokens[mask]
        hashes = [h for h, m in zip(tr.block_hashes, mask, strict=True) if m] if tr.block_hashes else None
        for i in range(len(times)):
            if limit is not None and self.issued >= limit:
                return
            t = float(times[i])
            if horizon is not None and t > horizon:
                return
            if t > env.now:
                yield env.timeout(t - env.now)
            req = self._make(env.now, int(ins[i]), int(outs[i]))
            if hashes is not None:
                # Only full blocks: a trace's last id names a partly filled prompt block,
                # which the reply's tokens would fill with content the id does not cover.
                req.block_hashes = hashes[i][: req.prompt_tokens // self.spec.prefix_block_tokens]
            self.submit(req)

    # ----- closed loop -----------------------------------------------------------------
    # Each of `concurrency` clients keeps one request in flight, as `vllm bench serve
    # --max-concurrency` (vllm/benchmarks/serve.py: a semaphore around every request)
    # and aiperf's concurrency mode do (aiperf/timing/request_rate_strategy.py: in
    # CONCURRENCY_BURST mode the first `concurrency` credits go out at once, the next
    # one whenever a credit comes back; a ramp, `ramp_s`, only with
    # --concurrency-ramp-duration). Between a reply and the next request the client
    # and the API server take a turnaround drawn per request (gamma, mean turnaround_s,
    # CV turnaround_cv); with fixed lengths and no spread every client would finish in
    # the same engine step and prefill its next prompt with all the others, forever.
    def _start_closed_loop(self) -> None:
        a = self.spec.arrival
        assert isinstance(a, ClosedLoop)
        self.measure_from_id = a.warmup_requests
        self._closed_left = self.spec.num_requests or 0
        if a.warmup_requests:
            self._warmup_left = a.warmup_requests  # warm-ups not yet ended
            first = min(a.concurrency, a.warmup_requests)
            self._warmup_unsent = a.warmup_requests - first
            self._open_clients(first)
        else:
            self._fill_clients()

    def _fill_clients(self) -> None:
        a = self.spec.arrival
        assert isinstance(a, ClosedLoop)
        first = min(a.concurrency, self._closed_left)
        self._closed_left -= first
        self.exhausted = self._closed_left == 0
        self._open_clients(first)
        self._check_done()

    def _open_clients(self, n: int) -> None:
        """Start ``n`` clients: all at once, or one by one over the ramp (aiperf's
        ``--concurrency-ramp-duration``: concurrency 1 at the start, +1 at even intervals,
        the target reached at the ramp's end)."""
        a = self.spec.arrival
        assert isinstance(a, ClosedLoop)
        gap = a.ramp_s / (a.concurrency - 1) if a.concurrency > 1 else 0.0
        for k in range(n):
            self._later(k * gap)

    def _issue_next(self) -> None:
        prompt, output, group, p_tokens = next(self._lengths)
        self.submit(self._make(self.env.now, prompt, output, group, p_tokens))

    def _turnaround(self) -> float:
        a = self.spec.arrival
        assert isinstance(a, ClosedLoop)
        delay = a.think_time_s
        if a.turnaround_s > 0:
            if a.turnaround_cv > 0:
                shape = 1.0 / a.turnaround_cv**2
                delay += float(self.rngs["arrival"].gamma(shape, a.turnaround_s / shape))
            else:
                delay += a.turnaround_s
        return delay

    def on_finished(self, req: Request) -> None:
        """A request ended (completed, failed, rejected, shed or cancelled): a closed-loop
        client sends the next one, a class client may retry a shed or timed-out request;
        the run is over once nothing more will be issued and all have ended."""
        self.finished += 1
        if self._sessions is not None:
            self._sessions.on_finished(req)
        cls = self.classes.get(req.klass)
        if cls is not None and req.status in {State.CANCELLED, State.SHED} and req.attempt < cls.retries:
            self._retries_pending += 1
            self.env.process(self._retry(req, cls))
        if self.spec.arrival is None or self.spec.arrival.kind != "closed_loop":
            self._check_done()
            return
        if self._warmup_left:
            # Warm-up phase: each client sends warm-ups until they are all sent; the
            # measured phase starts once every warm-up has ended.
            self._warmup_left -= 1
            if self._warmup_unsent:
                self._warmup_unsent -= 1
                self._later(self._turnaround())
            elif not self._warmup_left:
                self._fill_clients()
            return
        if self._closed_left <= 0:
            self._check_done()
            return
        self._closed_left -= 1
        self.exhausted = self._closed_left == 0
        self._later(self._turnaround())

    def _later(self, delay: float) -> None:
        if delay > 0:
            self._sends_pending += 1  # the run is not over while it waits to be sent
            self.env.process(self._after(delay))
        else:
            self._issue_next()

    def _after(self, delay: float) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(delay)
        self._sends_pending -= 1
        self._issue_next()
