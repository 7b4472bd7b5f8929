"""eyas/ is plain PyTorch/pyarrow: importable and testable without Ray, MLflow or OmegaConf."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EDGE_ONLY = {"ray", "mlflow", "omegaconf"}


def _modules():
    for path in sorted((ROOT / "eyas").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        yield path, ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def test_no_edge_imports_in_source():
    offenders = []
    for path, _ in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                          for n in names if n.split(".")[0] in EDGE_ONLY]
    assert not offenders, offenders
    assert len(list(_modules())) >= 10  # the scan really saw the package


def test_importing_every_module_loads_no_edge_package():
    names = [name for _, name in _modules()]
    code = ("import sys\n" + "".join(f"import {n}\n" for n in names) +
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {EDGE_ONLY!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
