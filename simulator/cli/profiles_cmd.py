"""`disagg-sim profiles list|show NAME`."""

from __future__ import annotations

from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Table

from simulator.cli.app import profiles_app
from simulator.errors import ConfigError


@profiles_app.command("list")
def list_profiles() -> None:
    """List shipped devices, links, serving engines and models."""
    from simulator.hardware.engines import engine_names, load_engine
    from simulator.hardware.registry import device_names, link_names, load_device, load_link
    from simulator.models.catalog import CATALOG

    console = Console()
    t = Table(title="Devices")
    for col in ("name", "memory", "GiB", "GB/s", "bf16 TFLOP/s", "fp8", "fp4", "$/h"):
        t.add_column(col)
    for name in device_names():
        d = load_device(name)
        t.add_row(d.name, d.memory_kind, f"{d.memory_capacity_gib:g}",
                  f"{d.memory_bandwidth_gb_per_s:g}", f"{d.peak_tflops.get('bf16', 0):g}",
                  f"{d.peak_tflops.get('fp8', 0):g}", f"{d.peak_tflops.get('fp4', 0):g}",
                  f"{d.price.usd_per_hour:g}" if d.price else "-")
    console.print(t)
    t = Table(title="Links")
    for col in ("name", "kind", "GB/s per dir", "efficiency", "latency us"):
        t.add_column(col)
    for name in link_names():
        link = load_link(name)
        t.add_row(link.name, link.kind, f"{link.bandwidth_gb_per_s:g}", f"{link.efficiency:g}",
                  f"{link.latency_us:g}")
    console.print(t)
    t = Table(title="Serving engines")
    for col in ("name", "version", "step overhead us", "block size"):
        t.add_column(col)
    for name in engine_names():
        e = load_engine(name)
        t.add_row(e.name, e.version, f"{e.step_overhead_us:g}", str(e.block_size))
    console.print(t)
    t = Table(title="Models")
    for col in ("name", "params (B)", "active (B)", "layers", "KV/token (KiB, bf16)"):
        t.add_column(col)
    for m in CATALOG.values():
        t.add_row(m.name, f"{m.params_total() / 1e9:.2f}", f"{m.params_active() / 1e9:.2f}",
                  str(m.num_layers), f"{m.kv_bytes_per_token() / 1024:.1f}")
    console.print(t)


@profiles_app.command("show")
def show_profile(name: Annotated[str, typer.Argument(help="Device, link, engine or model name.")]) -> None:
    """Show one profile in full (YAML)."""
    from simulator.hardware.engines import load_engine
    from simulator.hardware.registry import load_device, load_link
    from simulator.models.catalog import CATALOG, get_model

    loaders = (load_device, load_link, load_engine)
    for loader in loaders:
        try:
            obj = loader(name)
        except ConfigError:
            continue
        typer.echo(yaml.safe_dump(obj.model_dump(mode="json"), sort_keys=False))
        return
    if name.lower() in {k.lower() for k in CATALOG}:
        m = get_model(name)
        data = m.model_dump(mode="json")
        data["derived"] = {
            "params_total": m.params_total(),
            "params_active": m.params_active(),
            "kv_bytes_per_token_bf16": m.kv_bytes_per_token("bf16"),
        }
        typer.echo(yaml.safe_dump(data, sort_keys=False))
        return
    raise ConfigError(f"no device, link, engine or model named {name!r}; "
                      "see `disagg-sim profiles list`")
