"""Shipped data folders are found from a regular wheel install, not only from the checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from simulator._paths import data_dir
from tests.conftest import REPO


def test_editable_install_finds_data() -> None:
    assert (data_dir("hardware_profiles") / "devices" / "H100-SXM.yaml").is_file()
    assert (data_dir("scenarios") / "quickstart.yaml").is_file()


def test_wheel_carries_data_and_finds_it(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w",
                    str(wheel_dir), str(REPO)], check=True)
    (wheel,) = wheel_dir.glob("disagg_sim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "simulator/_data/hardware_profiles/devices/H100-SXM.yaml" in names
    assert "simulator/_data/scenarios/quickstart.yaml" in names
    assert "simulator/_data/scenarios/traces/azure_llm_2023_conv.csv" in names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target",
                    str(target), str(wheel)], check=True)
    code = ("import simulator, simulator._paths as p; "
            "from simulator.hardware import load_device; "
            "print(simulator.__file__); print(p.data_dir('hardware_profiles')); "
            "print(load_device('H200-SXM').memory_capacity_gib)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, cwd=tmp_path, env={"PYTHONPATH": str(target)}).stdout
    lines = out.strip().splitlines()
    assert lines[0].startswith(str(target))
    assert lines[1].startswith(str(target))
    assert float(lines[2]) == 139.8
    # `disagg-sim init` copies the examples out of the installed wheel, and they run there
    code = "from simulator.cli import main; main(['init', 'examples'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(target)}, check=False)
    assert done.returncode == 0, done.stderr
    for name in ("quickstart.yaml", "sweeps/tp_size_llama70b.yaml", "plans/llama8b_chat.yaml",
                 "traces/azure_llm_2023_conv.csv"):
        assert (tmp_path / "examples" / name).is_file(), name
    code = ("import simulator; r = simulator.run('examples/phase_split/1p1d_conv.yaml', "
            "**{}); print(r.summary['completed'] > 0)")
    out = subprocess.run([sys.executable, "-c", code.replace(", **{}", "")], check=True,
                         capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(target)}).stdout
    assert out.strip() == "True"


def test_init_refuses_a_folder_with_files(tmp_path: Path) -> None:
    import pytest

    from simulator.cli import main

    (tmp_path / "mine.yaml").write_text("x: 1\n")
    with pytest.raises(SystemExit) as exc:
        main(["init", str(tmp_path)])
    assert exc.value.code == 2
    assert (tmp_path / "mine.yaml").read_text() == "x: 1\n"
