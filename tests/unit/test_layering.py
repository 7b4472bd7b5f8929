"""eyas's packages form layers a newcomer can draw from the folder names, and every import
(function bodies included) points down: a module never imports a package of its own layer or
above (so the stage libraries share only what sits below them: train does not import
evaluate). Above them all, the `eyas` command (eyas/cli.py) is the one module that reaches the
checkout's workflows/ and tasks/, by name, when a command runs."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# bottom to top; each package's docstring says what lives in it
LAYERS = [
    ("config", "fingerprint", "files", "nn", "precision", "progress"),  # plain helpers
    ("run_records",),  # records of the run directory several stages read
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
    ("cli",),  # the `eyas` command: runs the checkout's workflows/ and bench/ scripts
]
EDGE = ("workflows", "tasks")  # the Ray and MLflow adapters, above eyas/
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


def test_only_the_command_reaches_the_edge():
    """No eyas module imports workflows/ or tasks/ (which may import Ray and MLflow), nor names
    them for importlib; eyas/cli.py names them, and imports none at import time."""
    reaching = []
    for path in (ROOT / "eyas").rglob("*.py"):
        text = path.read_text()
        imported = [m for _, m in _imports(path) if m.split(".")[0] in EDGE]
        named = [e for e in EDGE if f'"{e}.' in text or f"'{e}." in text]
        if imported or (named and path.name != "cli.py"):
            reaching.append(f"{path.relative_to(ROOT)}: {imported or named}")
    assert not reaching, reaching


def _module_graph() -> dict[str, set[str]]:
    """Every module of eyas/, workflows/ and tasks/ -> the modules of those it imports
    (function bodies included; `from a import b` counts a, and a.b where that is a module)."""
    paths = {}
    for top in ("eyas", *EDGE):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            paths[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in paths.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {m for m in found if m in paths and m != name}
    return graph


def test_no_modules_import_each_other():
    """No chain of imports leads from a module back to itself (Tarjan's strongly connected
    components): each module can be read, tested and changed knowing only what it imports."""
    graph, index, low, stack, circles = _module_graph(), {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, circles
