"""Multi-turn sessions: each turn carries the conversation so far, hash blocks chained."""

from __future__ import annotations

import pytest

from simulator import run
from simulator.errors import ConfigError
from simulator.scenario.load import load_scenario
from tests.conftest import make_scenario


def chat(**extra):
    return make_scenario(**{
        "workload.sessions": {"turns": {"kind": "uniform", "min_tokens": 2, "max_tokens": 5},
                              "think_time_s": 3.0},
        "workload.arrival.rate_per_s": 1.0,
        "workload.num_requests": 50,
        "workload.prefix_block_tokens": 64,
        "cluster.pools.main.scheduler": {"prefix_caching": True},
        **extra,
    })


def test_a_turn_carries_the_conversation_and_follows_the_reply() -> None:
    result = run(chat())
    r = result.requests
    assert len(r) == 50  # num_requests bounds the turns of all sessions
    assert (r["status"] == "completed").all()
    for _, group in r.groupby("session"):
        turns = group.sort_values("turn")
        assert list(turns["turn"]) == list(range(1, len(turns) + 1))
        prev = turns.iloc[:-1]
        nxt = turns.iloc[1:]
        # Turn k+1's prompt = turn k's prompt + reply + a new user message (50..400).
        grown = nxt["prompt_tokens"].to_numpy() - (prev["prompt_tokens"].to_numpy()
                                                   + prev["output_tokens"].to_numpy())
        assert ((grown >= 50) & (grown <= 400)).all()
        # The next turn is sent after the reply has ended.
        assert (nxt["arrival_s"].to_numpy() >= prev["completion_s"].to_numpy()).all()
    # Later turns find their history in the prefix cache; first turns find nothing.
    first = r[r["turn"] == 1]
    later = r[r["turn"] > 1]
    assert (first["cached_tokens"] == 0).all()
    assert later["cached_tokens"].sum() > 0.5 * later["prompt_tokens"].sum()


def test_sessions_are_reproducible() -> None:
    a, b = run(chat()).requests, run(chat()).requests
    assert a.equals(b)


def test_sessions_refuse_a_shared_prefix(tmp_path) -> None:
    bad = """
name: x
model: Llama-3.1-8B
workload:
  arrival: {kind: poisson, rate_per_s: 1}
  input_tokens: {kind: fixed, tokens: 100}
  output_tokens: {kind: fixed, tokens: 10}
  num_requests: 5
  shared_prefix: {tokens: 512}
  sessions: {turns: {kind: fixed, tokens: 3}}
cluster:
  pools: [{name: main, role: colocated, device: H100-SXM}]
"""
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    with pytest.raises(ConfigError, match="sessions and shared_prefix") as exc:
        load_scenario(path)
    assert exc.value.key == "workload"
    assert exc.value.file == str(path)
