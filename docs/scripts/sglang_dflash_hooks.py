"""Which target architectures SGLang can capture DFlash's context states from: the registered
model classes (`EntryClass`) whose class or a base defines `set_dflash_layers_to_capture`.
Without it SGLang refuses at startup ("implements neither set_dspark_layers_to_capture nor
set_dflash_layers_to_capture", model_executor/model_runner_components/attention_backend_setup.py).

    pip download sglang==0.5.23 --no-deps -d /tmp/sgl
    python docs/scripts/sglang_dflash_hooks.py /tmp/sgl/sglang-0.5.23-*.whl [--write]

Read from the wheel's source (ast, nothing imported). Prints the list; --write stores it in
tests/data/sglang_dflash_hooks.json, which tests/unit/test_doctor_static.py
holds eyas/conventions/sglang.py's DFLASH_CAPTURE to. Draft classes (EAGLE, MTP, NextN,
assistants) are left out: they are never targets.
"""
from __future__ import annotations

import ast
import json
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "tests/data/sglang_dflash_hooks.json"
HOOK = "set_dflash_layers_to_capture"
DRAFTS = ("Eagle", "MTP", "NextN", "Assistant")


def hook_architectures(wheel: Path) -> list[str]:
    classes: dict[str, list[tuple[list[str], bool]]] = {}
    entries: set[str] = set()
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not (name.startswith("sglang/srt/models/") and name.endswith(".py")):
                continue
            try:
                tree = ast.parse(z.read(name))
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                             for b in node.bases]
                    has = any(isinstance(n, ast.FunctionDef) and n.name == HOOK
                              for n in node.body)
                    classes.setdefault(node.name, []).append((bases, has))
                elif isinstance(node, ast.Assign) and any(
                        getattr(t, "id", None) == "EntryClass" for t in node.targets):
                    v = node.value
                    items = v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v]
                    entries.update(e.id for e in items if isinstance(e, ast.Name))

    def has(cls: str, seen: tuple = ()) -> bool:
        if cls in seen or cls not in classes:
            return False
        return any(own or any(has(b, seen + (cls,)) for b in bases if b)
                   for bases, own in classes[cls])
    return sorted(c for c in entries if has(c) and not any(d in c for d in DRAFTS))


if __name__ == "__main__":
    found = hook_architectures(Path(sys.argv[1]))
    print(json.dumps(found, indent=1))
    if "--write" in sys.argv[2:]:
        OUT.write_text(json.dumps({"sglang": Path(sys.argv[1]).name, "architectures": found},
                                  indent=1) + "\n")
