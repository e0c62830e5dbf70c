"""Fuzzing input files: every bad one exits with code 2 and one clear line, valid ones run.

Strategies start from valid scenario documents (``Target.bases``) and break each one in
a single way: an unknown key at any nesting level, a value of the wrong type, a number
outside its field's bounds, a required key dropped, a cross-field rule broken, a profile
name that does not exist, a model or prompt that cannot fit, a non-finite or huge number,
a duplicated key, malformed YAML, arbitrary text or bytes, an empty file, a top level
that is not a mapping. Each file is written to a temporary folder and fed in-process to
``simulator.cli.main([command, path])``. A bad file must exit with code 2 and print
exactly one line on stderr that starts with ``error: <file>:``, names the key path where
the problem sits at a key, and is never a traceback or an "internal error". The same
machinery, drawing values inside the fields' bounds or dropping optional keys, must give
files that run (exit 0, nothing on stderr).

What is generated is driven by the pydantic model the file validates against (required
keys, bounds, field types) and by the document itself, so the machinery (tests/fuzzing.py)
is generic over a ``Target``: a CLI command, its root model and its base documents. Sweep
files plug in as one more target (and, where their keys need them, more families).

The number of files tried per family is printed in pytest's terminal summary
(``fuzz_tally`` in tests/conftest.py).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import typer
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from simulator.cli import app
from simulator.hardware.engines import engine_names
from simulator.hardware.registry import device_names, link_names
from simulator.models.catalog import model_names
from simulator.runner.sweep import SweepSpec
from simulator.scenario.schema import Scenario
from tests.fuzzing import (
    Case,
    DocPath,
    accepts,
    bounds,
    check_bad,
    check_runs,
    doc_case,
    dropped,
    dump,
    get,
    is_number,
    key_path,
    model_at,
    replaced,
    slot,
    walk,
)

# ----- valid base documents ----------------------------------------------------------
COLOCATED: dict[str, Any] = {
    "name": "fuzz-colocated",
    "description": "two colocated H100 instances",
    "seed": 3,
    "model": "Llama-3.1-8B",
    "precision": {"weights": "bf16", "activations": "bf16", "kv_cache": "bf16"},
    "engine": "vllm",
    "workload": {
        "arrival": {"kind": "poisson", "rate_per_s": 20.0},
        "input_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 256},
        "output_tokens": {"kind": "fixed", "tokens": 4},
        "num_requests": 4,
        "duration_s": 60.0,
        "shared_prefix": {"tokens": 32, "groups": 2, "fraction": 0.5},
    },
    "cluster": {
        "pools": [{
            "name": "main", "role": "colocated", "device": "H100-SXM", "instances": 2,
            "parallelism": {"tp": 1, "pp": 1, "ep": 1},
            "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 2048,
                          "chunked_prefill": True, "block_size": 16,
                          "memory_utilization": 0.9},
        }],
        "router": {"policy": "least_outstanding", "decode_policy": "least_kv"},
    },
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "e2e_s": 10.0},
    "simulation": {"max_time_s": 100.0, "fast_forward": True},
}
DISAGGREGATED: dict[str, Any] = {
    "name": "fuzz-disaggregated",
    "model": "Llama-3.1-8B",
    "workload": {
        "arrival": {"kind": "gamma", "rate_per_s": 10.0, "cv": 2.0},
        "input_tokens": {"kind": "lognormal", "mean_tokens": 200.0, "cv": 0.5,
                         "min_tokens": 8, "max_tokens": 1024},
        "output_tokens": {"kind": "empirical", "values": [2, 5, 9], "weights": [1.0, 2.0, 1.0]},
        "num_requests": 5,
    },
    "cluster": {
        "pools": [
            {"name": "prefill", "role": "prefill", "device": "H100-SXM", "instances": 1,
             "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 4096,
                           "chunked_prefill": False}},
            {"name": "decode", "role": "decode", "device": "H200-SXM", "instances": 2,
             "parallelism": {"tp": 2}, "scheduler": {"max_num_seqs": 32}},
        ],
        "router": {"policy": "round_robin", "decode_policy": "least_kv"},
        "kv_transfer": {"mode": "layerwise", "link": "ib-ndr", "conversion_us_per_mb": 1.0},
    },
    "slo": {"ttft_s": 2.0},
}
CLOSED_LOOP: dict[str, Any] = {
    "model": "Llama-3.1-8B",
    "workload": {
        "arrival": {"kind": "closed_loop", "concurrency": 2, "think_time_s": 0.1},
        "input_tokens": {"kind": "fixed", "tokens": 100},
        "output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 6},
        "num_requests": 5,
    },
    "cluster": {"pools": [{"name": "a", "device": "L40S", "parallelism": {"tp": 2}}]},
}
ON_OFF: dict[str, Any] = {
    "model": "Llama-3.1-8B",
    "engine": "vllm",
    "workload": {
        "arrival": {"kind": "on_off", "on_rate_per_s": 50.0, "off_rate_per_s": 1.0,
                    "on_s": 0.5, "off_s": 0.5},
        "input_tokens": {"kind": "empirical", "values": [10, 300]},
        "output_tokens": {"kind": "fixed", "tokens": 3},
        "num_requests": 5,
    },
    "cluster": {"pools": [{"name": "x", "device": "A100-SXM-80GB", "instances": 2},
                          {"name": "y", "device": "H100-SXM"}]},
}


OPERATIONS: dict[str, Any] = {
    "model": "Llama-3.1-8B",
    "workload": {
        "arrival": {"kind": "constant", "rate_per_s": 10.0},
        "input_tokens": {"kind": "fixed", "tokens": 64},
        "output_tokens": {"kind": "fixed", "tokens": 4},
        "num_requests": 5,
        "prefix_block_tokens": 16,
    },
    "cluster": {
        "pools": [{
            "name": "main", "device": "H100-SXM", "instances": 2, "engine": "vllm",
            "precision": {"weights": "bf16", "activations": "bf16", "kv_cache": "fp8"},
            "placement": {"nodes_per_instance": 1},
            "kv_budget_tokens": 4096, "moe_imbalance": 1.0,
            "scheduler": {"max_num_seqs": 16, "prefix_caching": True},
            "autoscale": {"min_instances": 1, "max_instances": 3, "signal": "queue_length",
                          "scale_out_above": 2.0, "scale_in_below": 0.5, "interval_s": 1.0,
                          "cooldown_s": 1.0, "load_bandwidth_gb_per_s": 5.0,
                          "startup_s": 1.0},
        }],
        "kv_transfer": {"conversion_us_per_token": 0.5, "network": "roce-400g"},
    },
    "faults": [
        {"kind": "straggler", "target": "main/0", "at_s": 0.1, "duration_s": 0.2,
         "slowdown": 2.0},
        {"kind": "instance_failure", "target": "main/1", "at_s": 0.2, "duration_s": 0.1},
        {"kind": "link_degradation", "target": "main/0", "at_s": 0.0, "duration_s": 1.0,
         "bandwidth_factor": 0.5},
        {"kind": "random_failures", "pool": "main", "mtbf_s": 100.0, "mttr_s": 1.0},
    ],
}


@dataclass(frozen=True)
class Target:
    """A CLI command, the model its file validates against, and valid documents of it."""

    command: str
    model: type[BaseModel]
    bases: tuple[dict[str, Any], ...]
    skip: frozenset[str] = frozenset()
    """Families whose expectations assume a typed document all the way down."""


RUN = Target("run", Scenario, (COLOCATED, DISAGGREGATED, CLOSED_LOOP, ON_OFF, OPERATIONS))
# Sweep files: the sweep's own keys are fuzzed; its inline base scenario is a free-form
# mapping to the sweep model, so its keys are fuzzed through RUN above.
SWEEP_GRID = {
    "name": "fuzz-sweep",
    "base": COLOCATED,
    "overrides": {"workload.num_requests": 3},
    "grid": {"workload.arrival.rate_per_s": [2.0, 4.0]},
    "seeds": [0, 1],
}
SWEEP_ZIP = {
    "name": "fuzz-zip",
    "base": DISAGGREGATED,
    "zip": [{"cluster.pools.decode.instances": [1, 2],
             "workload.arrival.rate_per_s": [1.0, 3.0]}],
    "frames": False,
}
# The families below build their expectation (which key the error names) from the
# schema; a sweep's axes and overrides are free-form mappings, and a mutated sweep can
# carry two faults (pydantic then reports either), so they only run against `run`.
SWEEP = Target("sweep", SweepSpec, (SWEEP_GRID, SWEEP_ZIP), skip=frozenset({
    "unknown_key", "missing_required", "cross_field", "missing_reference",
    "impossible_fit"}))
TARGETS = (RUN, SWEEP)


# ----- where each family can strike (computed once per target) -----------------------
@dataclass(frozen=True)
class Spot:
    base: dict[str, Any]
    path: DocPath

    @property
    def value(self) -> Any:
        return get(self.base, self.path)


@dataclass(frozen=True)
class Index:
    mappings: tuple[Spot, ...]  # every mapping, the top level included
    values: tuple[Spot, ...]  # every key or list item with a non-null value
    bounded: tuple[Spot, ...]  # numbers (or strings/lists) the model bounds
    required: tuple[Spot, ...]  # keys the model requires (and union `kind`s)
    numbers: tuple[Spot, ...]
    changeable: tuple[Spot, ...]  # scalars with a sane in-bounds strategy (SANE)
    droppable: tuple[Spot, ...]  # optional keys whose default keeps the file valid
    names: tuple[str, ...]  # every key spelled in the bases


def build_index(target: Target) -> Index:
    mappings: list[Spot] = []
    values: list[Spot] = []
    bounded: list[Spot] = []
    required: list[Spot] = []
    numbers: list[Spot] = []
    changeable: list[Spot] = []
    droppable: list[Spot] = []
    names: set[str] = set()
    for base in target.bases:
        mappings.append(Spot(base, ()))
        for path, value in walk(base):
            spot = Spot(base, path)
            info = slot(target.model, base, path)
            limits = bounds(info.field)
            if isinstance(value, dict):
                mappings.append(spot)
            if value is not None:
                values.append(spot)
            if limits and (is_number(value) or "min_length" in limits):
                bounded.append(spot)
            if is_number(value):
                numbers.append(spot)
            if not isinstance(value, dict | list) and _sane_for(base, path) is not None:
                changeable.append(spot)
            if isinstance(path[-1], str):
                names.add(path[-1])
                is_required = info.field is not None and info.field.is_required()
                if is_required or (path[-1] == "kind" and info.in_union):
                    required.append(spot)
                elif path[-1] not in KEEP:
                    droppable.append(spot)
    return Index(*(tuple(x) for x in (mappings, values, bounded, required, numbers,
                                      changeable, droppable)), tuple(sorted(names)))


def _error_key(target: Target, spot: Spot) -> DocPath:
    """Where pydantic reports a problem with ``spot``: a bad `kind` is the union's."""
    if spot.path[-1] == "kind" and slot(target.model, spot.base, spot.path).in_union:
        return spot.path[:-1]
    return spot.path


Strategy = Callable[[Target], st.SearchStrategy[Case]]


# ----- strategies: bad documents -----------------------------------------------------
BOOLISH = {"y", "n", "yes", "no", "on", "off", "true", "false", "t", "f", "1", "0"}
WORDS = st.from_regex(r"[a-z]{3,10}", fullmatch=True).filter(
    lambda s: s not in BOOLISH | {"inf", "nan", "infinity", "auto", "null"})
SMALL_LISTS = st.lists(st.integers(0, 9), max_size=3)
SMALL_DICTS = st.dictionaries(st.from_regex(r"[a-z]{1,5}", fullmatch=True), st.integers(0, 9),
                              min_size=1, max_size=2)
FRACTIONS = st.floats(0.01, 1e6).filter(lambda x: x != int(x))
INTS = st.integers(-10**6, 10**6)
WRONG_FOR: dict[type, st.SearchStrategy[Any]] = {
    bool: st.one_of(WORDS, SMALL_LISTS, SMALL_DICTS, st.integers(2, 10**6),
                    st.floats(0.01, 0.99)),
    int: st.one_of(WORDS, SMALL_LISTS, SMALL_DICTS, FRACTIONS),
    float: st.one_of(WORDS, SMALL_LISTS, SMALL_DICTS),
    str: st.one_of(SMALL_LISTS, SMALL_DICTS, INTS, st.floats(-1e6, 1e6), st.booleans()),
    dict: st.one_of(WORDS, INTS, SMALL_LISTS, st.booleans()),
    list: st.one_of(WORDS, INTS, SMALL_DICTS, st.booleans()),
}
"""Values of another type than the one in the base (filtered again by the annotation)."""


def unknown_keys(target: Target) -> st.SearchStrategy[Case]:
    idx = build_index(target)
    spots = st.sampled_from(idx.mappings)
    names = st.one_of(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True),
        st.builds(lambda n, how: (n + "s", n.upper(), n.replace("_", ""), n[:-1] or "x")[how],
                  st.sampled_from(idx.names), st.integers(0, 3)))
    values = st.one_of(st.integers(-100, 100), WORDS, st.booleans(), st.none())

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        spot = draw(spots)
        name = draw(names)
        assume(name not in model_at(target.model, spot.base, spot.path).model_fields)
        doc = copy.deepcopy(spot.base)
        get(doc, spot.path)[name] = draw(values)
        return doc_case(f"unknown key {key_path((*spot.path, name))}", doc,
                        (*spot.path, name), "unknown key")

    return gen()


def wrong_types(target: Target) -> st.SearchStrategy[Case]:
    spots = st.sampled_from(build_index(target).values)

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        spot = draw(spots)
        value = draw(WRONG_FOR[type(spot.value)])
        assume(not accepts(slot(target.model, spot.base, spot.path).annotation, value))
        return doc_case(f"{key_path(spot.path)} = {value!r}",
                        replaced(spot.base, spot.path, value), _error_key(target, spot))

    return gen()


def _outside(draw: Callable[..., Any], kind: type, limits: dict[str, Any]) -> Any:
    """A number of type ``kind`` that breaks one of ``limits`` (magnitudes up to 1e9)."""
    step = 1 if kind is int else 1e-6
    edges = []
    if "gt" in limits:
        edges.append(("below", limits["gt"]))
    if "ge" in limits:
        edges.append(("below", limits["ge"] - step))
    if "lt" in limits:
        edges.append(("above", limits["lt"]))
    if "le" in limits:
        edges.append(("above", limits["le"] + step))
    side, edge = draw(st.sampled_from(edges))
    lo, hi = (-10**9, edge) if side == "below" else (edge, 10**9)
    return draw(st.integers(int(lo), int(hi)) if kind is int else st.floats(lo, hi))


def out_of_range(target: Target) -> st.SearchStrategy[Case]:
    spots = st.sampled_from(build_index(target).bounded)

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        spot = draw(spots)
        limits = bounds(slot(target.model, spot.base, spot.path).field)
        value = spot.value
        if "min_length" in limits and not is_number(value):
            bad = type(value)()  # "" or []
        else:
            bad = _outside(draw, int if isinstance(value, int) else float, limits)
        return doc_case(f"{key_path(spot.path)} = {bad!r} outside {limits}",
                        replaced(spot.base, spot.path, bad), spot.path)

    return gen()


def missing_required(target: Target) -> st.SearchStrategy[Case]:
    spots = st.sampled_from(build_index(target).required)

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        spot = draw(spots)
        says = "missing `kind`" if spot.path[-1] == "kind" else "required key is missing"
        doc = dropped(spot.base, spot.path)
        doc["seed"] = draw(st.integers(0, 2**31))  # many distinct files, one missing key
        return doc_case(f"drop {key_path(spot.path)}", doc, _error_key(target, spot), says)

    return gen()


# Cross-field rules (model validators): (base, updates, key reported, text).
CROSS_FIELD: tuple[tuple[dict[str, Any], dict[DocPath, Any], DocPath, str], ...] = (
    (COLOCATED, {("workload", "input_tokens", "min_tokens"): 300}, ("workload", "input_tokens"),
     "min_tokens (300) > max_tokens (256)"),
    (COLOCATED, {("cluster", "pools", 0, "parallelism", "tp"): 3,
                 ("cluster", "pools", 0, "parallelism", "ep"): 2},
     ("cluster", "pools", 0, "parallelism"), "must divide tp"),
    (COLOCATED, {("cluster", "pools", 0, "parallelism", "pp"): 0},
     ("cluster", "pools", 0, "parallelism"), "pp must be >= 1"),
    (DISAGGREGATED, {("cluster", "pools", 1, "name"): "prefill"}, ("cluster",),
     "pool names must be unique"),
    (DISAGGREGATED, {("cluster", "pools", 1, "role"): "prefill"}, ("cluster",),
     "need a decode pool"),
    (DISAGGREGATED, {("cluster", "pools", 0, "role"): "decode"}, ("cluster",),
     "need a prefill pool"),
    (DISAGGREGATED, {("cluster", "pools", 0, "role"): "colocated"}, ("cluster",),
     "mixing colocated"),
    (ON_OFF, {("cluster", "pools", 1, "role"): "decode"}, ("cluster",), "mixing colocated"),
    (DISAGGREGATED, {("workload", "output_tokens", "weights"): [1.0]},
     ("workload", "output_tokens"), "one entry per value"),
    (DISAGGREGATED, {("workload", "output_tokens", "weights"): [0.0, 0.0, 0.0]},
     ("workload", "output_tokens"), "positive sum"),
    (ON_OFF, {("workload", "input_tokens", "values"): [10, 0]}, ("workload", "input_tokens"),
     "must all be > 0"),
    (COLOCATED, {("workload", "num_requests"): None, ("workload", "duration_s"): None},
     ("workload",), "bound the workload"),
    (ON_OFF, {("workload", "output_tokens"): None}, ("workload",), "are required"),
    (CLOSED_LOOP, {("workload", "num_requests"): None, ("workload", "duration_s"): 5.0},
     ("workload",), "needs num_requests"),
)


def cross_field(target: Target) -> st.SearchStrategy[Case]:
    rules = st.sampled_from([r for r in CROSS_FIELD if r[0] in target.bases])

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        base, updates, key, says = draw(rules)
        doc = copy.deepcopy(base)
        for path, value in updates.items():
            if value is None:
                get(doc, path[:-1]).pop(path[-1], None)
            else:
                get(doc, path[:-1])[path[-1]] = value
        doc["seed"] = draw(st.integers(0, 2**31))
        return doc_case(f"cross-field {updates}", doc, key, says)

    return gen()


KNOWN = {n.lower() for n in (*model_names(), *engine_names(), *device_names(), *link_names())}
UNKNOWN_NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9 ._-]{0,24}", fullmatch=True).filter(
    lambda n: n.lower() not in KNOWN and not n.endswith((".json", ".yaml", ".yml"))
    and not Path(n).exists() and n.strip() == n)


def _references(base: dict[str, Any]) -> list[DocPath]:
    refs: list[DocPath] = [("model",), ("engine",)]
    refs += [("cluster", "pools", i, "device") for i in range(len(base["cluster"]["pools"]))]
    for key in ("link", "network"):
        if key in base["cluster"].get("kv_transfer", {}):
            refs.append(("cluster", "kv_transfer", key))
    for i, fault in enumerate(base.get("faults", [])):
        refs.append(("faults", i, "pool" if "pool" in fault else "target"))
    return refs


def missing_references(target: Target) -> st.SearchStrategy[Case]:
    spots = st.sampled_from([Spot(b, p) for b in target.bases for p in _references(b)])

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        spot = draw(spots)
        name = draw(UNKNOWN_NAMES)
        return doc_case(f"{key_path(spot.path)} = {name!r}",
                        replaced(spot.base, spot.path, name), spot.path, "unknown")

    return gen()


# Models far larger than one device of any kind in bf16 at tp=1.
TOO_LARGE = ("Llama-3.1-405B", "DeepSeek-V3", "OPT-175B")
GPUS = ("A100-SXM-80GB", "B200", "H100-PCIe", "H100-SXM", "H200-SXM", "L40S", "MI300X")


FIT_WORDS = ("does not fit", "no room for KV cache", "devices per instance", "less than the")
"""What every memory-fit message says in one way or another (build checks several ways)."""


def impossible_fits(target: Target) -> st.SearchStrategy[Case]:
    bases = st.sampled_from(target.bases)
    hows = st.sampled_from(["model", "prompt", "prefix", "batch", "block"])

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        doc = copy.deepcopy(draw(bases))
        pool = doc["cluster"]["pools"][0]
        how = draw(hows)
        if how == "model":
            doc["model"] = draw(st.sampled_from(TOO_LARGE))
            pool["device"] = draw(st.sampled_from(GPUS))
            pool["parallelism"] = {"tp": 1}
            what = f"{doc['model']} on one {pool['device']}"
        elif how == "prompt":
            tokens = draw(st.integers(10**8, 2**53))
            doc["workload"]["input_tokens"] = {"kind": "fixed", "tokens": tokens}
            what = f"prompts of {tokens} tokens"
        elif how == "prefix":
            tokens = draw(st.integers(10**8, 2**53))
            doc["workload"]["shared_prefix"] = {"tokens": tokens}
            what = f"a prefix of {tokens} tokens on every prompt"
        else:
            key = "max_num_batched_tokens" if how == "batch" else "block_size"
            pool.setdefault("scheduler", {})[key] = draw(st.integers(10**9, 2**53))
            what = f"scheduler {pool['scheduler']}"
        # The pool that cannot hold it is named, at its parallelism (pp with a KV budget).
        keys = tuple(key_path(("cluster", "pools", i, "parallelism", *tail))
                     for i in range(len(doc["cluster"]["pools"])) for tail in ((), ("pp",)))
        return dataclasses.replace(doc_case(what, doc, None, FIT_WORDS), key=keys)

    return gen()


HUGE = st.one_of(
    st.sampled_from([math.inf, -math.inf, math.nan]),
    st.integers(2**53 + 1, 10**400),
    st.integers(-(10**400), -(2**53) - 1),
    st.floats(2.0**53 * 1.001, 1.7e308),
    st.floats(-1.7e308, -(2.0**53) * 1.001),
)
SENTINEL = "zz_fuzz_sentinel"


def huge_numbers(target: Target) -> st.SearchStrategy[Case]:
    spots = st.sampled_from(build_index(target).numbers)

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        spot = draw(spots)
        if draw(st.integers(0, 9)):
            value = draw(HUGE)
            return doc_case(f"{key_path(spot.path)} = {value!r}",
                            replaced(spot.base, spot.path, value), spot.path, "out of range")
        # Longer than Python turns into an int by default (4300 digits): only as text.
        digits = "9" * draw(st.integers(4301, 20_000))
        doc = replaced(spot.base, spot.path, SENTINEL)
        return Case(f"{key_path(spot.path)} = <{len(digits)} digits>",
                    dump(doc).replace(SENTINEL, digits), None, "malformed YAML", doc)

    return gen()


def duplicate_keys(target: Target) -> st.SearchStrategy[Case]:
    spots = st.sampled_from([s for s in build_index(target).mappings if s.value])

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        spot = draw(spots)
        key = draw(st.sampled_from(sorted(spot.value)))
        doc = copy.deepcopy(spot.base)
        get(doc, spot.path)[SENTINEL] = copy.deepcopy(spot.value[key])
        text = dump(doc).replace(SENTINEL, key)
        where = key_path((*spot.path, key))
        return Case(f"duplicate {where}", text, where, "duplicate key", doc)

    return gen()


BREAKERS = (
    "{k}: [unclosed",
    "{k}: {{unclosed: 1",
    '{k}: "unterminated',
    "{k}: a: b",
    "\t{k}: 1",
    "{k}: *undefined_alias",
    "{k}: !!python/object:os.system echo",
    "{k}: 2024-13-45",  # a date YAML resolves, then cannot build
    "{k}: &a [*a, *b]",
)
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def malformed_yaml(target: Target) -> st.SearchStrategy[Case]:
    texts = st.sampled_from([dump(b) for b in target.bases])
    hows = st.sampled_from(["insert", "deep", "documents", "control", "binary"])

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        base = draw(texts)
        how = draw(hows)
        lines = base.splitlines()
        content: str | bytes
        if how == "insert":
            key = draw(st.from_regex(r"[a-z_]{1,10}", fullmatch=True))
            lines.insert(draw(st.integers(0, len(lines))),
                         draw(st.sampled_from(BREAKERS)).format(k=key))
            content = "\n".join(lines) + "\n"
        elif how == "deep":
            depth = draw(st.integers(2_000, 50_000))
            opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}")]))
            content = "model: " + opener * depth + closer * depth + "\n"
        elif how == "documents":
            content = base + "---\n" + base
        elif how == "control":
            char = draw(st.sampled_from(["\x00", "\x01", "\x07", "\x1b", "\ufffe"]))
            lines.insert(draw(st.integers(0, len(lines))), f"key: a{char}b")
            content = "\n".join(lines)
        else:
            content = base.encode() + draw(st.binary(max_size=8)) + b"\xff\xfe"
        if isinstance(content, str) and how != "deep":
            # A breaker can land where it is still valid YAML (inside a multi-line plain
            # or block scalar); such a file is not malformed, so draw another.
            try:
                yaml.load(content, Loader=LOADER)  # a safe loader
            except (yaml.YAMLError, ValueError):
                pass
            else:
                assume(False)
        return Case(f"malformed YAML ({how})", content)

    return gen()


def arbitrary_content(_target: Target) -> st.SearchStrategy[Case]:
    return st.one_of(st.text(max_size=200), st.binary(max_size=200)).map(
        lambda c: Case(f"arbitrary {c!r}", c))


def empty_files(_target: Target) -> st.SearchStrategy[Case]:
    comments = st.from_regex(r"# [ -~]{0,30}", fullmatch=True)
    parts = st.lists(st.one_of(st.just(""), st.just(" "), comments), max_size=6)
    bodies = st.sampled_from(["", "~", "null", "Null", "---", "--- ~"])

    def build(head: list[str], body: str, tail: str) -> Case:
        text = "\n".join([*head, body]) + tail
        return Case(f"empty {text!r}", text, says="empty")

    return st.builds(build, parts, bodies, st.sampled_from(["", "\n"]))


def not_mappings(_target: Target) -> st.SearchStrategy[Case]:
    values = st.one_of(st.lists(st.integers(), min_size=1, max_size=3), st.integers(),
                       WORDS, st.booleans(), st.floats(allow_nan=False, allow_infinity=False))
    return values.map(lambda v: Case(f"top level {v!r}", dump(v), says="expected a mapping"))


# ----- strategies: valid documents from the same machinery ---------------------------
SANE: dict[str, st.SearchStrategy[Any]] = {
    "seed": st.integers(0, 2**32),
    "rate_per_s": st.floats(0.5, 100),
    "on_rate_per_s": st.floats(1, 100),
    "off_rate_per_s": st.floats(0, 10),
    "on_s": st.floats(0.05, 5),
    "off_s": st.floats(0.05, 5),
    "cv": st.floats(0.25, 3),
    "concurrency": st.integers(1, 8),
    "think_time_s": st.floats(0, 1),
    "tokens": st.integers(1, 512),
    "mean_tokens": st.floats(1, 512),
    "num_requests": st.integers(1, 5),
    "duration_s": st.floats(1, 100),
    "groups": st.integers(1, 8),
    "fraction": st.floats(0, 1),
    "instances": st.integers(1, 3),
    "tp": st.sampled_from([1, 2, 4]),
    "pp": st.sampled_from([1, 2]),
    "max_num_seqs": st.integers(1, 256),
    "max_num_batched_tokens": st.integers(64, 16384),
    "block_size": st.integers(1, 64),
    "memory_utilization": st.floats(0.5, 0.95),
    "conversion_us_per_mb": st.floats(0, 100),
    "ttft_s": st.floats(0.001, 100),
    "tpot_s": st.floats(0.001, 100),
    "e2e_s": st.floats(0.001, 100),
    "max_time_s": st.floats(0.01, 1000),
    "values": st.integers(1, 512),
    "weights": st.floats(0.1, 10),
    "chunked_prefill": st.booleans(),
    "fast_forward": st.booleans(),
    "policy": st.sampled_from(["round_robin", "least_outstanding", "least_tokens",
                               "power_of_two", "least_kv", "random"]),
    "mode": st.sampled_from(["bulk", "layerwise"]),
    "kv_cache": st.sampled_from(["bf16", "fp16", "fp8"]),
    "activations": st.sampled_from(["bf16", "fp16", "fp8"]),
}
SANE["decode_policy"] = SANE["policy"]
PRECISIONS = st.sampled_from(["fp32", "bf16", "fp16", "fp8", "int8", "fp4", "int4"])
# Dropping these changes what the workload means (validators require them here).
KEEP = {"arrival", "input_tokens", "output_tokens", "num_requests", "role", "kind"}


def _sane_for(base: dict[str, Any], path: DocPath) -> st.SearchStrategy[Any] | None:
    name = path[-1] if isinstance(path[-1], str) else path[-2]
    parent = get(base, path[:-1])
    if name == "min_tokens":
        return st.integers(1, parent.get("max_tokens", 1024))
    if name == "max_tokens":
        return st.integers(parent.get("min_tokens", 1), 1024)
    if name == "weights" and path[-2] == "precision":
        return PRECISIONS
    return SANE.get(str(name))


def valid_variations(target: Target) -> st.SearchStrategy[Case]:
    idx = build_index(target)
    changes = st.sampled_from(idx.changeable)
    drops = st.sampled_from(idx.droppable)

    @st.composite
    def gen(draw: Callable[..., Any]) -> Case:
        if draw(st.booleans()):
            spot = draw(changes)
            value = draw(_sane_for(spot.base, spot.path))  # type: ignore[arg-type]
            return doc_case(f"{key_path(spot.path)} = {value!r}",
                            replaced(spot.base, spot.path, value), None)
        spot = draw(drops)
        return doc_case(f"drop {key_path(spot.path)}", dropped(spot.base, spot.path), None)

    return gen()


# ----- the tests ---------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    name: str
    strategy: Strategy
    examples: int
    """Examples asked of hypothesis."""
    floor: int
    """Examples that must have run (small families may exhaust their space sooner)."""


FAMILIES = (
    Family("unknown_key", unknown_keys, 150, 140),
    Family("wrong_type", wrong_types, 180, 170),
    Family("out_of_range", out_of_range, 120, 110),
    Family("missing_required", missing_required, 80, 70),
    Family("cross_field", cross_field, 60, 50),
    Family("missing_reference", missing_references, 100, 90),
    Family("impossible_fit", impossible_fits, 60, 50),
    Family("huge_number", huge_numbers, 150, 140),
    Family("duplicate_key", duplicate_keys, 60, 50),
    Family("malformed_yaml", malformed_yaml, 100, 90),
    Family("arbitrary_content", arbitrary_content, 60, 55),
    Family("empty_file", empty_files, 40, 20),
    Family("not_a_mapping", not_mappings, 40, 35),
)


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def cli() -> click.Command:
    """The click command behind ``main``, built once (building it costs more than a bad file)."""
    return typer.main.get_command(app)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.command)
def test_bases_are_valid_and_run(target: Target, tmp_path: Path, cli: click.Command) -> None:
    """The fuzzing starts from valid files; if one of them is broken, nothing else means much."""
    for i, base in enumerate(target.bases):
        check_runs(cli, target.command, tmp_path, Case(f"base {i}", dump(base)))


PAIRS = [pytest.param(t, f, id=f"{f.name}-{t.command}")
         for t in TARGETS for f in FAMILIES if f.name not in t.skip]


@pytest.mark.parametrize(("target", "family"), PAIRS)
def test_bad_file_gives_one_clear_line(target: Target, family: Family, tmp_path: Path,
                                       cli: click.Command, fuzz_tally: dict[str, int]) -> None:
    tally_key = f"bad/{target.command}/{family.name}"
    before = fuzz_tally.get(tally_key, 0)

    @fuzz_settings(family.examples)
    @given(family.strategy(target))
    def check(case: Case) -> None:
        fuzz_tally[tally_key] = fuzz_tally.get(tally_key, 0) + 1
        check_bad(cli, target.command, tmp_path, case)

    check()
    assert fuzz_tally.get(tally_key, 0) - before >= family.floor


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.command)
def test_valid_variations_run(target: Target, tmp_path: Path, cli: click.Command,
                              fuzz_tally: dict[str, int]) -> None:
    tally_key = f"valid/{target.command}/variations"

    @fuzz_settings(40)
    @given(valid_variations(target))
    def check(case: Case) -> None:
        fuzz_tally[tally_key] = fuzz_tally.get(tally_key, 0) + 1
        check_runs(cli, target.command, tmp_path, case)

    check()
