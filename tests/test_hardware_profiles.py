"""Shipped device and link profiles: they load, cite sources, reference real links, and
carry the datasheet and measured figures their sources publish."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from simulator.config_io import load_model
from simulator.errors import ConfigError
from simulator.hardware import DeviceProfile, LinkProfile, load_device, load_link
from simulator.hardware.registry import profiles_dir

DEVICE_FILES = sorted((profiles_dir() / "devices").glob("*.yaml"))
LINK_FILES = sorted((profiles_dir() / "links").glob("*.yaml"))

EXPECTED_DEVICES = {
    "GB200-NVL72",
    "A100-SXM-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H200-SXM",
    "B200",
    "L40S",
    "MI300X",
    "GroqLPU-v1",
}
EXPECTED_LINKS = {
    "nvlink3",
    "nvlink4",
    "nvlink5",
    "pcie-gen4",
    "pcie-gen5",
    "ib-hdr",
    "ib-ndr",
    "ib-xdr",
    "roce-400g",
    "infinity-fabric",
    "lpu-c2c",
    "ethernet-100g",
    "ideal",
}


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def test_every_expected_profile_is_shipped() -> None:
    assert {p.stem for p in DEVICE_FILES} == EXPECTED_DEVICES
    assert {p.stem for p in LINK_FILES} == EXPECTED_LINKS


@pytest.mark.parametrize("path", DEVICE_FILES, ids=_ids(DEVICE_FILES))
def test_device_loads_and_is_named_after_its_file(path: Path) -> None:
    device = load_device(path.stem)
    assert isinstance(device, DeviceProfile)
    assert device.name == path.stem
    # loading by path gives the same profile as loading by name
    assert load_device(str(path)) == device


@pytest.mark.parametrize("path", LINK_FILES, ids=_ids(LINK_FILES))
def test_link_loads_and_is_named_after_its_file(path: Path) -> None:
    link = load_link(path.stem)
    assert isinstance(link, LinkProfile)
    assert link.name == path.stem
    assert load_link(str(path)) == link


@pytest.mark.parametrize("path", DEVICE_FILES + LINK_FILES, ids=_ids(DEVICE_FILES + LINK_FILES))
def test_every_profile_cites_a_source(path: Path) -> None:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    sources = raw["source"]
    assert isinstance(sources, list)
    assert sources
    assert all(isinstance(s, str) and s.strip() for s in sources)


@pytest.mark.parametrize("path", DEVICE_FILES, ids=_ids(DEVICE_FILES))
def test_device_links_exist(path: Path) -> None:
    device = load_device(path.stem)
    for field in ("scale_up_link", "scale_out_link", "host_link"):
        name = getattr(device, field)
        if name is not None:
            assert name in EXPECTED_LINKS, f"{device.name}.{field} = {name!r}"
            assert load_link(name).name == name
    # a multi-device domain needs a link to connect it
    if device.scale_up_domain > 1:
        assert device.scale_up_link is not None


@pytest.mark.parametrize("path", DEVICE_FILES, ids=_ids(DEVICE_FILES))
def test_device_sub_records_are_sourced(path: Path) -> None:
    device = load_device(path.stem)
    assert device.efficiency.calibrated_on.strip()
    if device.power is not None:
        assert device.power.source.strip()
    if device.price is not None:
        assert device.price.source.strip()
        assert device.price.date.strip()
    # peaks are dense rates: a lower precision never runs slower than a wider one
    rates = device.peak_tflops
    for wide, narrow in (("bf16", "fp8"), ("fp16", "int8"), ("fp8", "fp4")):
        if wide in rates and narrow in rates:
            assert rates[narrow] >= rates[wide]


@pytest.mark.parametrize(
    ("device", "precision", "tflops"),
    [
        ("H100-SXM", "bf16", 989),
        ("H100-SXM", "fp8", 1979),
        ("H100-PCIe", "bf16", 756),
        ("H200-SXM", "bf16", 989),
        ("A100-SXM-80GB", "bf16", 312),
        ("B200", "bf16", 2250),
        ("B200", "fp4", 9000),
        ("L40S", "bf16", 362),
        ("MI300X", "bf16", 1307),
        ("GroqLPU-v1", "fp16", 188),
        ("GroqLPU-v1", "int8", 750),
    ],
)
def test_datasheet_peak_rates(device: str, precision: str, tflops: float) -> None:
    assert load_device(device).peak_flops(precision) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(
    ("device", "capacity_gib", "bandwidth_gb_per_s"),
    [
        ("H100-SXM", 79.1, 3350),
        ("H200-SXM", 139.8, 4800),
        ("A100-SXM-80GB", 79.2, 2039),
        ("B200", 178.5, 7700),
        ("L40S", 44.4, 864),
        ("MI300X", 192, 5300),
        ("GroqLPU-v1", 0.2142, 80_000),
    ],
)
def test_datasheet_memory(device: str, capacity_gib: float, bandwidth_gb_per_s: float) -> None:
    """Capacities are what the runtime reports, in binary units (80 GB H100 -> 79.1 GiB)."""
    profile = load_device(device)
    assert profile.memory_capacity_gib == pytest.approx(capacity_gib)
    assert profile.memory_bytes == pytest.approx(capacity_gib * 2**30)
    assert profile.memory_capacity_source
    assert profile.memory_bandwidth_gb_per_s == pytest.approx(bandwidth_gb_per_s)


def test_h100_memory_is_binary_not_decimal() -> None:
    """The runtime sees 79.1 GiB (84.9e9 bytes) on an H100, not 80e9 bytes."""
    assert load_device("H100-SXM").memory_bytes == pytest.approx(79.1 * 2**30)
    assert load_device("H100-SXM").memory_bytes > 84e9


def test_decimal_capacity_key_is_refused_with_the_replacement(tmp_path) -> None:
    import yaml

    from simulator.errors import ConfigError
    from simulator.hardware.registry import profiles_dir

    data = yaml.safe_load((profiles_dir() / "devices" / "H100-SXM.yaml").read_text())
    del data["memory_capacity_gib"]
    data["memory_capacity_gb"] = 80
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="memory_capacity_gib"):
        load_device(str(path))


def test_lpu_is_sram_only_and_unpriced() -> None:
    lpu = load_device("GroqLPU-v1")
    assert lpu.memory_kind == "sram"
    assert lpu.memory_bytes == pytest.approx(230e6, rel=1e-4)
    assert lpu.scale_up_link == "lpu-c2c"
    assert lpu.price is None  # no public per-chip rental price: nothing invented
    assert lpu.notes is not None
    assert "price" in lpu.notes.lower()


@pytest.mark.parametrize(
    ("device", "median_tflops", "peak_tflops", "stream_tb_s", "peak_tb_s"),
    [
        ("H100-SXM", 771, 989, 2.81, 3.35),
        ("H200-SXM", 774, 989, 4.00, 4.8),
        ("B200", 1471, 2250, 6.13, 7.7),
    ],
)
def test_efficiency_matches_measured_gemm_medians(
    device: str, median_tflops: float, peak_tflops: float, stream_tb_s: float, peak_tb_s: float
) -> None:
    """Reference section 1.6(b): AIConfigurator GEMM medians / datasheet peak."""
    eff = load_device(device).efficiency
    assert eff.compute == pytest.approx(median_tflops / peak_tflops, abs=0.01)
    assert eff.memory == pytest.approx(stream_tb_s / peak_tb_s, abs=0.01)
    assert "AIConfigurator" in eff.calibrated_on


@pytest.mark.parametrize("device", ["A100-SXM-80GB", "H100-PCIe", "L40S", "MI300X", "GroqLPU-v1"])
def test_unmeasured_devices_say_their_efficiency_is_an_assumption(device: str) -> None:
    eff = load_device(device).efficiency
    assert "assumption" in eff.calibrated_on.lower()
    # never more optimistic than the best-measured device (H100 SXM)
    h100 = load_device("H100-SXM").efficiency
    assert eff.compute <= h100.compute
    assert eff.memory <= h100.memory


@pytest.mark.parametrize(
    ("link", "kind", "gb_per_s"),
    [
        ("nvlink3", "nvlink", 300),
        ("nvlink4", "nvlink", 450),
        ("nvlink5", "nvlink", 900),
        ("pcie-gen4", "pcie", 32),
        ("pcie-gen5", "pcie", 64),
        ("ib-hdr", "infiniband", 25),
        ("ib-ndr", "infiniband", 50),
        ("ib-xdr", "infiniband", 100),
        ("roce-400g", "roce", 50),
        ("ethernet-100g", "ethernet", 12.5),
        ("lpu-c2c", "c2c", 14),
        ("infinity-fabric", "c2c", 448),
    ],
)
def test_link_line_rates(link: str, kind: str, gb_per_s: float) -> None:
    profile = load_link(link)
    assert profile.kind == kind
    assert profile.bandwidth_gb_per_s == pytest.approx(gb_per_s)
    assert 0 < profile.effective_bandwidth < profile.bandwidth_gb_per_s * 1e9


def test_ideal_link_costs_nothing() -> None:
    link = load_link("ideal")
    assert link.kind == "ideal"
    assert math.isinf(link.effective_bandwidth)
    assert link.latency_us == link.per_transfer_overhead_us == 0
    assert link.collective_base_us == link.collective_hop_us == 0


@pytest.mark.parametrize(
    ("link", "measured_us"),
    [
        ("nvlink3", {2: 10.0, 4: 14.5, 8: 22.6}),  # A100 SXM, NCCL 2.27.3
        ("nvlink4", {2: 6.2, 4: 9.4, 8: 15.5}),  # H100 SXM, NCCL 2.27.3
        ("nvlink5", {2: 9.1, 4: 14.4, 8: 26.6}),  # B200 SXM, NCCL 2.27.3
    ],
)
def test_collective_latency_fit_reproduces_small_allreduce(
    link: str, measured_us: dict[int, float]
) -> None:
    """Reference section 1.7(a): 512 B all-reduce time = base + 2(n-1) * hop, within 0.5 us."""
    profile = load_link(link)
    for n, t_us in measured_us.items():
        predicted = profile.collective_base_us + 2 * (n - 1) * profile.collective_hop_us
        assert predicted == pytest.approx(t_us, abs=0.5), f"{link} n={n}"


def _write_with(tmp_path: Path, source: Path, edit: dict[str, object]) -> Path:
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    for dotted, value in edit.items():
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    out = tmp_path / source.name
    out.write_text(yaml.safe_dump(data), encoding="utf-8")
    return out


def test_unknown_device_key_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = _write_with(tmp_path, profiles_dir() / "devices" / "H100-SXM.yaml", {"hbm_gb": 80})
    with pytest.raises(ConfigError) as caught:
        load_model(DeviceProfile, path)
    assert caught.value.key == "hbm_gb"
    assert "hbm_gb" in str(caught.value)
    assert str(path) in str(caught.value)


def test_unknown_nested_device_key_names_the_path(tmp_path: Path) -> None:
    path = _write_with(
        tmp_path, profiles_dir() / "devices" / "B200.yaml", {"efficiency.compte": 0.7}
    )
    with pytest.raises(ConfigError) as caught:
        load_model(DeviceProfile, path)
    assert caught.value.key == "efficiency.compte"
    assert "efficiency.compte" in str(caught.value)


def test_unknown_link_key_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = _write_with(tmp_path, profiles_dir() / "links" / "ib-ndr.yaml", {"bandwidth_gbps": 400})
    with pytest.raises(ConfigError) as caught:
        load_model(LinkProfile, path)
    assert caught.value.key == "bandwidth_gbps"
    assert "bandwidth_gbps" in str(caught.value)


def test_unedited_copy_still_loads(tmp_path: Path) -> None:
    """Control for the tests above: the round-trip through tmp_path itself is harmless."""
    path = _write_with(tmp_path, profiles_dir() / "devices" / "H100-SXM.yaml", {})
    assert load_model(DeviceProfile, path) == load_device("H100-SXM")
