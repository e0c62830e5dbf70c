"""Write fitted constants into the device profiles (:mod:`simulator.validation.kernel_fit`)."""

from __future__ import annotations

import re
from pathlib import Path

from simulator.hardware.operator_fits import CollectiveCurve, OperatorFit
from simulator.hardware.profiles import DeviceProfile
from simulator.hardware.registry import load_device, profiles_dir


def write_profile(device: DeviceProfile, fits: dict[str, OperatorFit],
                  curves: list[CollectiveCurve], engine: str, source: str) -> Path:
    """Rewrite the ``operators:`` block at the end of the device's YAML (other engines kept
    as the file holds them now, so fits of different engines may run side by side)."""
    load_device.cache_clear()
    path = next(p for p in sorted((profiles_dir() / "devices").glob("*.yaml"))
                if load_device(p.stem).name == device.name)
    engines: dict[str, tuple[str, dict[str, OperatorFit], list[CollectiveCurve]]] = {
        name: (f.source, {str(k): v for k, v in f.fits.items()}, list(f.allreduce))
        for name, f in (load_device(path.stem).operators or {}).items()}
    engines[engine] = (source, fits, curves)
    text = path.read_text()
    text = re.sub(r"\n# Per-operator roofline.*\Z", "\n", text, flags=re.S).rstrip() + "\n"
    block = ["", "# Per-operator roofline fitted on measured kernel tables, per serving engine;",
             "# regenerate with: python -m simulator.validation.kernel_fit --write", "operators:"]
    for name, (src, engine_fits, engine_curves) in sorted(engines.items()):
        block += [f"  {name}:", f"    source: \"{src}\"", "    fits:" if engine_fits else "    fits: {}"]
        for op, f in sorted(engine_fits.items()):
            dumped = f.model_dump()
            if dumped["row_unit"] == "query_head":  # the default: keep the lines short
                del dumped["row_unit"]
            for off in ("tile_m", "tile_n", "split_k", "tile_k0", "pack_gqa", "head_dim_exp",
                        "tile_dispatch", "moe_kernel", "causal_tail", "softmax_dim",
                        "per_unit_ns", "head_tile", "resident_blocks", "exposed", "per_group_ns",
                        "expanded_block_ns",
                        "group_row_step", "group_row_head_dim_exp", "rope_kernel_us",
                        "block_gbs", "q_copy_us", "head_block", "head_block_rows",
                        "head_block_reread", "tile_load_rows", "per_k_ps", "kv_write_ps",
                        "expert_block_gbs", "expert_block_m", "expert_block_n",
                        "expert_blocks_per_sm"):
                if not dumped[off]:
                    del dumped[off]
            if not dumped["sustained_us"]:
                del dumped["sustained_us"]
            for one in ("kv_reread_share", "l2_speedup", "sustained_rate"):  # 1: term off
                if dumped[one] == 1.0:
                    del dumped[one]
            for flag in ("remote_slots", "slot_kernels"):
                if not dumped[flag]:
                    del dumped[flag]
            if not dumped["key_tiles"]:
                del dumped["key_tiles"]
            if not dumped["group_limit"]:  # one decode kernel: its group constants unused
                for off in ("group_limit", "group_reread", "group_row_share", "row_overlap",
                            "group_memory", "group_q_rows", "group_floor_us", "group_step"):
                    del dumped[off]
            if dumped.get("group_floor_us", 0) is None:  # the grouped kernel's floor
                del dumped["group_floor_us"]
            fields = ", ".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}"
                               for k, v in dumped.items())
            block.append(f"      {op}: {{{fields}}}")
        if engine_curves:
            block.append("    allreduce:   # [bytes, microseconds]")
        for c in engine_curves:
            knots = ", ".join(f"[{b:.0f}, {t:g}]" for b, t in c.points)
            block.append(f"      - {{ranks: {c.ranks}, points: [{knots}]}}")
    path.write_text(text + "\n".join(block) + "\n")
    load_device.cache_clear()
    return path
