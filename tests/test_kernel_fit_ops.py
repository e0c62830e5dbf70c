"""``kernel_fit --ops``: fitting some operator families and keeping the others' constants."""

from simulator.hardware.registry import load_device
from simulator.validation.kernel_fit import _merge_rows, _with_committed, selected


def test_selected_patterns_and_the_kv_cache_pairs():
    assert selected("moe_fp8", None)
    assert selected("moe_fp8", ["moe*"])
    assert not selected("gemm_fp8", ["moe*"])
    assert selected("allreduce", ["allreduce"])
    assert not selected("allreduce", ["moe*"])
    # attention over both KV caches is scored together: one picks the other
    assert selected("attention_decode", ["attention_decode_kv_fp8"])
    assert selected("attention_decode_kv_fp8", ["attention_decode"])
    assert selected("attention_decode_all_kv", ["attention_decode"])
    assert not selected("attention_decode_mla", ["attention_decode"])
    assert not selected("attention_prefill", ["attention_decode*"])


def _row(device, op, ape):
    return {"device": device, "engine": "sglang", "op": op, "median_ape_after": ape}


def test_merge_rows_replaces_only_the_fitted_families_on_the_fitted_devices():
    old = [_row("B200", "gemm", 9.5), _row("B200", "moe", 16.6), _row("B200", "moe_tuned", 7.5),
           _row("H100-SXM", "moe", 9.9), _row("B200", "allreduce_8", 6.5)]
    new = [_row("B200", "moe", 12.6), _row("B200", "moe_fp8", 6.0)]
    out = _merge_rows(old, new, ["B200"], ["moe*"])
    assert [(r["device"], r["op"], r["median_ape_after"]) for r in out] == [
        ("B200", "gemm", 9.5),  # another family: kept
        ("B200", "moe", 12.6),  # refitted: replaced in place
        # B200 moe_tuned was picked and fitted but has no new row (no longer scored): dropped
        ("H100-SXM", "moe", 9.9),  # another device: kept
        ("B200", "allreduce_8", 6.5),
        ("B200", "moe_fp8", 6.0),  # new: at the end
    ]


def test_with_committed_keeps_the_other_families_constants():
    device = load_device("H100-SXM")
    committed = device.operators["sglang"]
    gemm = committed.fits["gemm"]
    moe_ops = [op for op in committed.fits if str(op).startswith("moe")]
    assert moe_ops  # the profile has SGLang MoE fits to replace
    fits, curves = _with_committed(device, "sglang", {"moe": gemm}, [], ["moe*"])
    assert fits["gemm"] == gemm
    assert fits["moe"] is gemm  # the new fit
    assert not any(str(op).startswith("moe") and op != "moe" for op in fits)  # picked, not kept
    assert curves == list(committed.allreduce)  # the all-reduce was not picked
    _, curves = _with_committed(device, "sglang", {}, [], ["allreduce"])
    assert curves == []
