"""The measured rows of one engine's operator family on one device, with the shipped fit: what
the tests of shipped fits on held-out shapes score (they need the ``kernels`` extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from simulator.hardware import load_device

if TYPE_CHECKING:
    from simulator.hardware.operator_fits import OperatorFit
    from simulator.hardware.profiles import DeviceProfile
    from simulator.validation.kernel_fit_samples import Samples


def measured_cell(engine: str, device: str, op: str, version: str | None = None
                  ) -> tuple[DeviceProfile, Samples, OperatorFit]:
    """The device, the family's samples from the engine's newest table holding them (or
    ``version``) and the committed fit; skips the test without the kernel tables."""
    from simulator.runner.kernel_tables import _pick_version, tables_root
    from simulator.validation.kernel_fit_samples import attention_samples, gemm_samples

    root = tables_root()
    if root is None:
        pytest.skip("needs the kernels extra (aiconfigurator-core)")
    dev = load_device(device)
    assert dev.kernel_tables is not None
    if op.startswith("gemm"):
        kind, needs, reader = "gemm", "gemm_perf.parquet", gemm_samples
    elif op.startswith("attention_prefill"):
        kind, needs, reader = "attention", "context_attention_perf.parquet", attention_samples
    else:
        kind, needs, reader = "attention", "generation_attention_perf.parquet", attention_samples
    folder = _pick_version(root / dev.kernel_tables / kind / engine, version, needs)
    assert folder is not None
    samples = next(s for s in reader(folder) if s.op == op)
    return dev, samples, dev.operator_fits(engine)[op]
