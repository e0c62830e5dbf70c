"""`disagg-sim profiles list|show NAME`."""

from __future__ import annotations

from typing import Annotated

import typer
import yaml
from rich.table import Table

from simulator.cli.app import profiles_app
from simulator.cli.render import make_console
from simulator.errors import ConfigError


@profiles_app.command("list")
def list_profiles() -> None:
    """List shipped devices, links, serving engines and models."""
    from simulator.hardware.engines import engine_names, load_engine
    from simulator.hardware.registry import device_names, link_names, load_device, load_link
    from simulator.models.catalog import CATALOG, HF_IDS, released_precisions
    from simulator.report.numbers import fmt
    from simulator.units import BYTES_PER_ELEMENT

    console = make_console()
    t = Table(title="Devices (dense peak rates, in the precisions the chip has units for)")
    for col in ("name", "memory", "GiB", "GB/s", "TFLOP/s by precision", "$/h"):
        t.add_column(col, justify="left" if col in ("name", "memory", "TFLOP/s by precision")
                     else "right", no_wrap=col != "TFLOP/s by precision")
    for name in device_names():
        d = load_device(name)
        rates = ", ".join(f"{p} {fmt(r)}" for p, r in sorted(
            d.peak_tflops.items(), key=lambda kv: -BYTES_PER_ELEMENT[kv[0]]))
        t.add_row(d.name, d.memory_kind, fmt(d.memory_capacity_gib),
                  fmt(d.memory_bandwidth_gb_per_s), rates,
                  f"{d.price.usd_per_hour:,.2f}" if d.price else "-")
    console.print(t)
    t = Table(title="Links")
    for col in ("name", "kind", "GB/s per dir", "efficiency", "latency us"):
        t.add_column(col)
    for name in link_names():
        link = load_link(name)
        t.add_row(link.name, link.kind, fmt(link.bandwidth_gb_per_s) if link.bandwidth_gb_per_s
                  else "unlimited", fmt(link.efficiency), fmt(link.latency_us))
    console.print(t)
    t = Table(title="Serving engines")
    for col in ("name", "version", "step overhead us", "block size"):
        t.add_column(col)
    for name in engine_names():
        e = load_engine(name)
        t.add_row(e.name, e.version, fmt(e.step_overhead_us), str(e.block_size))
    console.print(t)
    t = Table(title="Models (`model:` takes the name or a Hugging Face id)")
    for col in ("name", "params (B)", "active (B)", "layers", "released", "KV/token (KiB)",
                "Hugging Face id"):
        t.add_column(col, justify="left" if col in ("name", "released", "Hugging Face id")
                     else "right", no_wrap=col != "Hugging Face id", overflow="fold")
    for m in CATALOG.values():
        kv = released_precisions(m)["kv_cache"]
        ids = [i for i, n in HF_IDS.items() if n == m.name]
        hf = next((h for e in ids for h in _original_ids() if h.lower() == e), "-")
        t.add_row(m.name, f"{m.params_total() / 1e9:.2f}", f"{m.params_active() / 1e9:.2f}",
                  str(m.num_layers), m.released_precision,
                  f"{fmt(m.kv_bytes_per_token(kv) / 1024)} {kv}", hf)
    console.print(t)


def _original_ids() -> list[str]:
    """Hugging Face ids as their repositories spell them."""
    from simulator.models.catalog import hf_ids

    return hf_ids()


@profiles_app.command("show")
def show_profile(name: Annotated[str, typer.Argument(help="Device, link, engine or model name.")]) -> None:
    """Show one profile in full (YAML)."""
    from simulator.hardware.engines import load_engine
    from simulator.hardware.registry import load_device, load_link
    from simulator.models.catalog import (
        CATALOG,
        HF_IDS,
        get_model,
        hf_ids,
        released_precisions,
    )

    loaders = (load_device, load_link, load_engine)
    for loader in loaders:
        try:
            obj = loader(name)
        except ConfigError:
            continue
        typer.echo(yaml.safe_dump(obj.model_dump(mode="json"), sort_keys=False))
        return
    if name.lower() in {k.lower() for k in CATALOG} or name.lower() in HF_IDS:
        m = get_model(name)
        data = m.model_dump(mode="json")
        data["derived"] = {
            "params_total": m.params_total(),
            "params_active": m.params_active(),
            "kv_bytes_per_token_bf16": m.kv_bytes_per_token("bf16"),
            "default_precision": released_precisions(m),
            "hugging_face_ids": [i for i in hf_ids() if HF_IDS[i.lower()] == m.name],
        }
        typer.echo(yaml.safe_dump(data, sort_keys=False))
        return
    raise ConfigError(f"no device, link, engine or model named {name!r}; "
                      "see `disagg-sim profiles list`")
