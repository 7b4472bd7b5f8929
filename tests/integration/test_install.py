"""eyas installs next to packages that own generic top-level names: `pip install` adds only
`eyas` (and the `eyas` command), so llama-index-workflows' `workflows` stays importable as
itself, and the command still runs the checkout's pipeline.

A fresh venv sees this environment's packages through a path file (eyas's dependencies are not
installed again); eyas is installed into it editable, as README says, from a copy of the
checkout, and llama-index-workflows (with the two packages it needs that this environment
lacks) from the package index, without dependencies; the installed command then runs the
prepare stage on Ray from outside the checkout. About a minute and a half.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NEIGHBOURS = ["llama-index-workflows==2.26.1", "llama-index-instrumentation==0.6.0",
              "deprecated==1.3.1"]
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "runs", "build", "__pycache__", "*.egg-info",
                                  ".pytest_cache")


def _run(cmd, cwd, timeout=300) -> subprocess.CompletedProcess:
    """In a user's environment: no path to the checkout, no Ray cluster to join."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RAY_ADDRESS", "EYAS_DEBUG")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("install") / "eyas"
    shutil.copytree(ROOT, copy, ignore=LEFT_OUT)
    return copy


def test_the_wheel_holds_only_eyas(checkout, tmp_path):
    out = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                "-w", tmp_path, checkout], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = tmp_path.glob("eyas-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"eyas"}, top
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "eyas = eyas.cli:main" in entry_points


def test_eyas_and_llama_index_workflows_share_an_environment(checkout, tmp_path, target_cache):
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path).returncode == 0
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    # after the venv's own packages: this environment's (pip, setuptools, eyas's dependencies)
    (site / "_base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [python, "-m", "pip", "install", "-q", "--no-deps"]
    out = _run([*pip, "--no-build-isolation", "-e", checkout], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    out = _run([*pip, *NEIGHBOURS], cwd=tmp_path)
    if out.returncode != 0 and "No matching distribution" in out.stderr + out.stdout:
        pytest.skip(f"the package index is out of reach: {out.stderr[-500:]}")
    assert out.returncode == 0, out.stderr[-3000:]
    installed = {p.name for p in site.iterdir()}
    assert "tasks" not in installed and "workflows" in installed  # llama-index's

    # both import, each as itself, from a directory that is not the checkout
    both = _run([python, "-c", "import workflows, eyas.cli; "
                 "print(workflows.Workflow.__module__, workflows.__file__, eyas.cli.__file__)"],
                cwd=tmp_path)
    assert both.returncode == 0, both.stderr[-3000:]
    module, workflows_file, cli_file = both.stdout.split()
    assert module == "workflows.workflow" and workflows_file.startswith(str(site))
    assert cli_file == str(checkout / "eyas" / "cli.py")

    eyas = venv / "bin" / "eyas"
    listed = _run([eyas, "--help"], cwd=tmp_path)
    assert listed.returncode == 0
    assert all(f"  {c} " in listed.stdout for c in ("run", "doctor", "export", "replay", "bench"))
    # the command reaches the checkout's pipeline, not the `workflows` installed beside it
    refused = _run([eyas, "run", "trian.lr=1"], cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "unknown config key 'trian'; did you mean 'train'?" in refused.stderr
    # a stage on Ray: its workers import the checkout's tasks/ and workflows/ too
    run_dir = tmp_path / "run"
    ran = _run([eyas, "run", "experiment=tiny", "stages=[prepare]", f"run_dir={run_dir}",
                f"target.builtin.cache_dir={target_cache}"], cwd=tmp_path, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (run_dir / "prepare" / "_COMPLETE.json").exists()
