"""Which target architectures vLLM serves EAGLE-3 drafts for, and by which capture rule: read
statically from an installed vLLM's source (no model is imported; nothing is downloaded).

    python docs/scripts/vllm_eagle3_targets.py [--check]

For every architecture in `model_executor/models/registry.py` whose class has `SupportsEagle3`
among its bases (followed through the model modules), the capture rule eyas applies:
  deepseek  the module's decoder is deepseek_v2.py's (directly, or wrapped: Kimi-K2.5, Mistral
            Large 3): id k = input of layer k, captured in its own loop, id 0 crashes
            (`residual` is None before layer 0)
  llama     every other: EagleModelMixin._maybe_add_hidden_state (interfaces.py), id k = input
            of layer k, the ids sorted and de-duplicated
Draft architectures (EAGLE/DFlash/DSpark/MTP heads) are left out. Prints the table
eyas/conventions/vllm_targets.py holds as EAGLE3_TARGETS; --check exits 1 where they differ.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

DEEPSEEK_MODULES = {"deepseek_v2", "kimi_k25", "mistral_large_3"}
DRAFTS = re.compile(r"Eagle|DFlash|DSpark|Peagle|MTP|Draft|Assistant|LiLiCorr")


def scan(vllm_root: Path) -> dict[str, str]:
    models = vllm_root / "model_executor" / "models"
    registry = (models / "registry.py").read_text()
    pairs = re.findall(r'"(\w+)":\s*\(\s*"(\w+)",\s*"(\w+)",?\s*\)', registry)
    bases: dict[tuple[str, str], list[str]] = {}
    for file in models.glob("*.py"):
        for node in ast.parse(file.read_text()).body:
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(b).split(".")[-1].split("[")[0] for b in node.bases]
                bases[(file.stem, node.name)] = names
                bases.setdefault(("*", node.name), names)

    def eagle3(module: str, cls: str, seen: tuple = ()) -> bool:
        for base in bases.get((module, cls)) or bases.get(("*", cls)) or []:
            if base == "SupportsEagle3" or (base not in seen
                                            and eagle3(module, base, seen + (base,))):
                return True
        return False

    table = {}
    for arch, module, cls in sorted(set(pairs)):
        if (models / f"{module}.py").exists() and not DRAFTS.search(arch + cls) \
                and eagle3(module, cls):
            table[arch] = "deepseek" if module in DEEPSEEK_MODULES else "llama"
    return table


def main() -> int:
    import vllm

    table = scan(Path(vllm.__file__).parent)
    print(f"vLLM {vllm.__version__}: {len(table)} target architectures with SupportsEagle3")
    for arch, rule in table.items():
        print(f"  {arch:<45} {rule}")
    if "--check" in sys.argv:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from eyas.conventions.vllm_targets import EAGLE3_TARGETS
        if dict(EAGLE3_TARGETS) != table:
            print("differs from eyas/conventions/vllm_targets.py EAGLE3_TARGETS:",
                  sorted(set(table.items()) ^ set(EAGLE3_TARGETS.items())))
            return 1
        print("eyas/conventions/vllm_targets.py EAGLE3_TARGETS matches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
