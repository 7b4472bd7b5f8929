"""eyas's packages form layers a newcomer can draw from the folder names, and every import
(function bodies included) points down: a module never imports a package of its own layer or
above (so the stage libraries share only what sits below them: train does not import
evaluate)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# bottom to top; README's "Repository" section says what lives in each
LAYERS = [
    ("config", "fingerprint", "files", "nn", "progress"),  # plain helpers
    ("layout",),  # the contract
    ("conventions",),  # each engine's id convention and checkpoint schema
    ("acceptance",),  # acceptance counted once
    ("store",),  # the stored hidden states: format, writer, reader
    ("targets",),  # the built-in target, identity, the parts a draft uses
    ("draft",),  # draft families (EAGLE-3's: model, TTT, checkpoint, readers), the one loader
    ("engines",),  # engines booted and driven: vLLM, and eyas's reference engine
    ("conversations",),  # chat data and the prepare stage: token ids, loss masks
    ("extract",),  # the extractor: online training and evaluation run it on demand
    ("doctor",),  # the skew doctor: which tensors a draft was trained on, and is fed
    ("train", "evaluate"),  # stage libraries
    ("serve",),  # the serve stage: parity through the doctor, then the benchmark
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)


def test_every_package_has_a_layer():
    units = {p.stem for p in (ROOT / "eyas").iterdir()
             if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__")}
    assert units == set(RANK), (units - set(RANK), set(RANK) - units)


def test_imports_point_down():
    upward = []
    for path in (ROOT / "eyas").rglob("*.py"):
        mine = path.relative_to(ROOT / "eyas").parts[0].removesuffix(".py")
        for line, module in _imports(path):
            parts = module.split(".")
            if parts[0] == "eyas" and len(parts) > 1 and parts[1] != mine \
                    and RANK[parts[1]] >= RANK[mine]:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not upward, upward
