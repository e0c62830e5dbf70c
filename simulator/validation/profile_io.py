"""Writing a calibration to disk and reading it back for ``validate --calibration``.

A calibration is three kinds of YAML in one folder:

* ``<device>-calibrated.yaml``: a device profile (loadable like any other; a scenario can
  name its path), whose ``efficiency.calibrated_on`` records the data it was fitted on;
* ``<link>-<device>-calibrated.yaml``: one link profile per link the collectives crossed;
* ``<device>-calibration.yaml``: the manifest: which files, what was fitted on (file,
  sha256, rows, date), the fitted terms, alpha/beta per collective and group size, and the
  errors before and after (on the fitted rows and on held-out rows when there were any).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from simulator.config_io import load_model, read_yaml
from simulator.errors import ConfigError
from simulator.hardware.profiles import DeviceProfile, LinkProfile
from simulator.validation.calibrate import Calibration
from simulator.validation.ops import HardwareSet

MANIFEST_KIND = "disagg-sim-calibration"


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _dump(data: dict[str, Any], header: str) -> str:
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    return lines + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def write_calibration(cal: Calibration, out_dir: str | Path) -> list[Path]:
    """Write the device profile, link profiles and manifest; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    link_files: dict[str, str] = {}
    for name, link in cal.links.items():
        fname = f"{link.name}.yaml"
        (out / fname).write_text(_dump(link.model_dump(mode="json", exclude_none=True),
                                       f"Written by disagg-sim calibrate; see {cal.device}-"
                                       "calibration.yaml for the fit."))
        link_files[name] = fname
        written.append(out / fname)
    device = cal.calibrated.model_dump(mode="json", exclude_none=True)
    # The device points at its calibrated links by path (relative to where calibrate ran).
    for key in ("scale_up_link", "scale_out_link"):
        if device.get(key) in link_files:
            device[key] = str(out / link_files[device[key]])
    device_file = f"{cal.calibrated.name}.yaml"
    (out / device_file).write_text(_dump(
        device, "Written by disagg-sim calibrate. Link fields name the calibrated link files "
                "by path,\nrelative to the directory calibrate ran in."))
    written.append(out / device_file)
    manifest = {
        "kind": MANIFEST_KIND,
        "device": cal.device,
        "device_profile": device_file,
        "links": link_files,
        "fitted_on": _plain(cal.fitted_on),
        "compute": None if cal.compute is None else {
            "eta_by_precision": {k: round(v, 4) for k, v in cal.compute.eta_by_precision.items()},
            "half_flops": float(f"{cal.compute.half_flops:.4g}"),
            "eta_memory": round(cal.compute.eta_memory, 4),
            "kernel_launch_us": round(cal.compute.kernel_launch_us, 3),
            "rows": cal.compute.rows,
        },
        "collective_groups": _plain(cal.collective_groups),
        "errors": {k: _records(v) for k, v in cal.errors.items()},
    }
    path = out / f"{cal.device}-calibration.yaml"
    path.write_text(_dump(manifest, "disagg-sim calibration manifest (see docs/VALIDATION.md)."))
    written.append(path)
    return written


def _records(frame: Any) -> list[dict[str, Any]]:
    return _plain(frame.to_dict("records"))


def _plain(obj: Any) -> Any:
    """Built-in types only (YAML's safe dumper refuses numpy scalars)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalar
        obj = obj.item()
    if isinstance(obj, float):
        return round(obj, 4)
    return obj


def load_calibration(manifest: str | Path) -> HardwareSet:
    """The calibrated device and links of a manifest, as overrides for predictions."""
    path = Path(manifest)
    data = read_yaml(path)
    file = str(path)
    if not isinstance(data, dict) or data.get("kind") != MANIFEST_KIND:
        raise ConfigError(f"not a calibration manifest (expected kind: {MANIFEST_KIND}; "
                          "give the <device>-calibration.yaml that calibrate wrote)",
                          file=file, key="kind")
    for key in ("device", "device_profile"):
        if not isinstance(data.get(key), str):
            raise ConfigError("required key is missing or not a string", file=file, key=key)
    device = load_model(DeviceProfile, path.parent / data["device_profile"])
    links = data.get("links") or {}
    if not isinstance(links, dict):
        raise ConfigError("must map link names to files", file=file, key="links")
    overrides = {(data["device"], str(name)): load_model(LinkProfile, path.parent / str(fname))
                 for name, fname in links.items()}
    return HardwareSet({data["device"]: device}, overrides)
