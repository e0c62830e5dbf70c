"""NCCL's algorithm and protocol choice per link (simulator.cost.nccl)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from simulator.config_io import load_model
from simulator.cost import allgather_time, allreduce_time, alltoall_time
from simulator.cost.nccl import candidates, choose, nccl_time
from simulator.errors import ConfigError
from simulator.hardware.profiles import LinkProfile, NcclTuning
from simulator.hardware.registry import load_link, profiles_dir

MIB = 2**20
OPS = ("allreduce", "allgather", "reducescatter", "alltoall")
NVLINKS = ("nvlink3", "nvlink4", "nvlink5")


def _tuning(**edit: object) -> NcclTuning:
    base = {"hardware": "nvlink", "bus_bandwidth_gb_per_s": 300.0,
            "ll_bandwidth_gb_per_s": 150.0, "fitted_on": "test"}
    return NcclTuning.model_validate({**base, **edit})


@pytest.mark.parametrize("link", NVLINKS)
def test_shipped_nvlinks_use_nccl(link: str) -> None:
    assert load_link(link).nccl is not None


@pytest.mark.parametrize("link", NVLINKS)
def test_small_messages_run_ll_large_ones_bandwidth_bound(link: str) -> None:
    """Latency-bound LL for a few KiB, a bandwidth-bound Simple algorithm (ring or NVLS) for
    hundreds of MiB: the protocol switch NCCL's tuner makes."""
    t = load_link(link).nccl
    assert t is not None
    for n in (2, 4, 8):
        small = choose("allreduce", 4096, n, t)
        big = choose("allreduce", 256 * MIB, n, t)
        assert small is not None
        assert big is not None
        assert small.protocol == "ll"
        assert big.protocol == "simple"
        # Small: the time is the latency (bytes add under 10 %); large: the bytes.
        assert nccl_time("allreduce", 4096, n, t) < 1.1 * nccl_time("allreduce", 8, n, t)
        big_t = nccl_time("allreduce", 512 * MIB, n, t)
        assert big_t - nccl_time("allreduce", 256 * MIB, n, t) > 0.45 * big_t


def test_nvls_only_where_the_link_enables_it_and_above_two_gpus() -> None:
    off = _tuning()
    on = _tuning(nvls=True, nvls_bandwidth_gb_per_s=400.0)
    for op in ("allreduce", "allgather", "reducescatter"):
        assert all(c.algorithm != "nvls" for n in (2, 4, 8)
                   for c in candidates(op, 64 * MIB, n, off))
        assert all(c.algorithm != "nvls" for c in candidates(op, 64 * MIB, 2, on))
        assert any(c.algorithm == "nvls" for c in candidates(op, 64 * MIB, 8, on))
    # A 400 GB/s NVLS all-reduce beats a 300 GB/s ring (which moves 14/8 of the buffer).
    big = choose("allreduce", 512 * MIB, 8, on)
    assert big is not None
    assert big.algorithm == "nvls"
    assert all(c.algorithm != "nvls" for c in candidates("alltoall", 64 * MIB, 8, on))
    # NVLS runs Simple only.
    assert {c.protocol for c in candidates("allreduce", MIB, 8, on)
            if c.algorithm == "nvls"} == {"simple"}


def test_nvls_on_the_fabrics_that_have_it() -> None:
    """NVSwitch with multicast (HGX H100/H200, B200): yes; A100's NVSwitch: no."""
    t3, t4, t5 = (load_link(name).nccl for name in NVLINKS)
    assert t3 is not None
    assert t4 is not None
    assert t5 is not None
    assert not t3.nvls
    assert t4.nvls
    assert t5.nvls


def test_ll128_only_where_enabled() -> None:
    on, off = _tuning(), _tuning(ll128=False)
    assert any(c.protocol == "ll128" for c in candidates("allreduce", MIB, 4, on))
    assert all(c.protocol != "ll128" for c in candidates("allreduce", MIB, 4, off))


@pytest.mark.parametrize("link", NVLINKS)
@pytest.mark.parametrize("op", OPS)
def test_monotonic_in_size(link: str, op: str) -> None:
    t = load_link(link).nccl
    assert t is not None
    for n in (2, 4, 8):
        times = [nccl_time(op, 2.0**k, n, t) for k in range(4, 31)]  # type: ignore[arg-type]
        assert all(b >= a for a, b in itertools.pairwise(times)), (op, n)


@pytest.mark.parametrize("op", OPS)
def test_one_rank_or_no_bytes_costs_nothing(op: str) -> None:
    t = _tuning(nvls=True, nvls_bandwidth_gb_per_s=400.0)
    assert nccl_time(op, 1e9, 1, t) == 0.0  # type: ignore[arg-type]
    assert nccl_time(op, 0, 8, t) == 0.0  # type: ignore[arg-type]
    assert choose(op, 1e9, 1, t) is None  # type: ignore[arg-type]


def test_every_caller_of_the_link_model_gets_nccl() -> None:
    """allreduce_time / allgather_time / alltoall_time route through the nccl block."""
    link = load_link("nvlink4")
    t = link.nccl
    assert t is not None
    for b in (4096.0, 2.0 * MIB, 256.0 * MIB):
        assert allreduce_time(b, 8, link) == nccl_time("allreduce", b, 8, t)
        assert allgather_time(b, 8, link) == nccl_time("allgather", b, 8, t)
        assert allgather_time(b, 8, link, "reducescatter") == nccl_time("reducescatter", b, 8, t)
        assert alltoall_time(b, 8, link) == nccl_time("alltoall", b, 8, t)
    # Without the block the alpha-beta model answers, as before.
    plain = link.model_copy(update={"nccl": None})
    steps = 2 * 7
    expected = ((plain.collective_base_us + steps * plain.collective_hop_us) * 1e-6
                + 14 / 8 * MIB / plain.effective_bandwidth)
    assert allreduce_time(MIB, 8, plain) == pytest.approx(expected)


def test_mid_size_all_reduce_pays_the_protocol_switch() -> None:
    """The alpha-beta model prices a mid-size all-reduce at line-rate bytes plus LL hop
    latencies; NCCL's menu has no protocol that is both (LL moves a quarter of the bus
    bandwidth, Simple pays 3.4 us a hop), so it runs slower than that bound. Training-size
    check (not a validation size): 4 MiB on 2 x H100, 32.9 us in AIConfigurator's H100
    nccl_perf table (NCCL 2.27.3); the alpha-beta model said 17.5 us."""
    link = load_link("nvlink4")
    assert link.nccl is not None
    plain = link.model_copy(update={"nccl": None})
    assert allreduce_time(4 * MIB, 2, link) * 1e6 == pytest.approx(32.9, rel=0.2)
    assert allreduce_time(4 * MIB, 2, plain) * 1e6 < 0.6 * 32.9
    for n in (2, 4):
        assert allreduce_time(4 * MIB, n, link) > allreduce_time(4 * MIB, n, plain)


def _write_link_with(tmp_path: Path, edit: dict[str, object]) -> Path:
    source = profiles_dir() / "links" / "nvlink4.yaml"
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    data["nccl"].update(edit)
    out = tmp_path / source.name
    out.write_text(yaml.safe_dump(data), encoding="utf-8")
    return out


@pytest.mark.parametrize(("edit", "field"), [
    ({"bus_bandwidth_gb_per_s": 0}, "nccl.bus_bandwidth_gb_per_s"),
    ({"hardware": "nvswitch"}, "nccl.hardware"),
    ({"hop_scale": -1.0}, "nccl.hop_scale"),
    ({"nvls_bandwith_gb_per_s": 100.0}, "nccl.nvls_bandwith_gb_per_s"),
    ({"op_bus_bandwidth_gb_per_s": {"allgather": 0.0}}, "op_bus_bandwidth_gb_per_s.allgather"),
    ({"op_bus_bandwidth_gb_per_s": {"allreduce": 300.0}}, "op_bus_bandwidth_gb_per_s"),
])
def test_bad_nccl_block_names_the_field(tmp_path: Path, edit: dict[str, object],
                                        field: str) -> None:
    path = _write_link_with(tmp_path, edit)
    with pytest.raises(ConfigError) as caught:
        load_model(LinkProfile, path)
    assert field in str(caught.value)


def test_nvls_without_its_bandwidth_is_refused(tmp_path: Path) -> None:
    path = _write_link_with(tmp_path, {"nvls_bandwidth_gb_per_s": None})
    with pytest.raises(ConfigError, match="nvls_bandwidth_gb_per_s"):
        load_model(LinkProfile, path)


def test_unedited_link_copy_loads(tmp_path: Path) -> None:
    assert load_model(LinkProfile, _write_link_with(tmp_path, {})) == load_link("nvlink4")
