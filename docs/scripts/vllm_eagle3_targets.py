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
  unread    a platform package under vllm/models/ with its own capture code, not read by eyas
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
    pairs = re.findall(r'"(\w+)":\s*\(\s*"([\w.]+)",\s*"(\w+)",?\s*\)', registry)
    bases: dict[tuple[str, str], list[str]] = {}
    aliases: dict[str, str] = {}  # `from .nvidia.model import A as B` (platform packages)
    files = list(models.glob("*.py")) + list((vllm_root / "models").rglob("*.py"))
    for file in files:
        module = file.stem if file.parent == models else ".".join(
            file.relative_to(vllm_root / "models").parts[:1])
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(b).split(".")[-1].split("[")[0] for b in node.bases]
                bases[(module, node.name)] = names
                bases.setdefault(("*", node.name), []).extend(names)  # every class so named
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.asname and a.asname != a.name:
                        aliases.setdefault(a.asname, a.name)

    def chain(module: str, cls: str, seen: tuple = ()) -> set[str]:
        """Every base class name above `cls`, followed through aliases."""
        found = set()
        for base in (bases.get((module, cls)) or bases.get(("*", cls))
                     or bases.get(("*", aliases.get(cls, ""))) or []):
            if base not in seen:
                found |= {base} | chain(module, base, seen + (base,))
        return found

    table = {}
    for arch, module, cls in sorted(set(pairs)):
        module = module.removeprefix("vllm.models.").split(".")[0]
        above = chain(module, cls)
        if "SupportsEagle3" in above and not DRAFTS.search(arch + cls):
            deepseek = module in DEEPSEEK_MODULES or "DeepseekV2ForCausalLM" in above
            package = vllm_root / "models" / module
            mixin = not package.is_dir() or any("_maybe_add_hidden_state" in f.read_text()
                                                for f in package.rglob("*.py"))
            table[arch] = "deepseek" if deepseek else "llama" if mixin else "unread"
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
