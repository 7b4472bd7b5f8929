"""Demo prompts nobody here wrote: tasks built from the documentation in Python's own sources.

Every documented function (or method) of a source file gives one of two requests, chosen by a
seeded coin:

    implement   "Write a Python function `name(args)` that does the following: <docstring>"
                -> the function as the standard library wrote it (docstring removed)
    explain     "Explain what this Python function does: <the code, docstring removed>"
                -> the docstring its author wrote

With `data.regenerate` (the SmolLM2 preset) the target answers every request itself, as the
field trains drafts (on-policy); the written answers stand only where regeneration is off.
A share of conversations (multi_turn_fraction) asks a follow-up ("Add type hints ...").
Functions with short docstrings (under 40 characters), private names and bodies over 60 lines
are passed over: they make poor requests.
"""
from __future__ import annotations

import ast
import random
import textwrap
from typing import Sequence

MIN_DOC_CHARS, MAX_BODY_LINES = 40, 60
FOLLOW_UPS = ("Add type hints and a docstring to it.",
              "Write two short pytest tests for it.",
              "Can you make it shorter?",
              "Show an example of calling it.")


def documented_functions(text: str) -> list[tuple[str, str, str]]:
    """(signature, docstring, code without the docstring) of each usable documented function
    in a source file's text; [] where it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines()
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < MIN_DOC_CHARS or node.name.startswith("_"):
            continue
        if node.end_lineno - node.lineno + 1 > MAX_BODY_LINES:
            continue
        first = node.body[0]  # the docstring's expression: cut from the code shown
        if len(node.body) < 2:
            continue
        code = lines[node.lineno - 1:first.lineno - 1] + lines[first.end_lineno:node.end_lineno]
        code = textwrap.dedent("\n".join(code)).strip("\n")
        args = ast.unparse(node.args)
        out.append((f"{node.name}({args})", doc.strip(), code))
    return out


def docstring_conversations(files: Sequence, n: int, seed: int,
                            multi_turn_fraction: float = 0.0) -> list[list[dict]]:
    """Up to `n` conversations from the documented functions of `files` (SourceFile or text),
    deterministic for `seed`; fewer when the files document fewer functions."""
    texts = [getattr(f, "text", f) for f in files]
    functions = [fn for text in texts for fn in documented_functions(text)]
    rng = random.Random(seed)
    rng.shuffle(functions)
    out = []
    for signature, doc, code in functions[:n]:
        if rng.random() < 0.5:
            messages = [{"role": "user", "content": "Write a Python function "
                         f"`{signature}` that does the following:\n\n{doc}"},
                        {"role": "assistant", "content": f"```python\n{code}\n```"}]
        else:
            messages = [{"role": "user", "content": "Explain what this Python function does:"
                         f"\n```python\n{code}\n```"},
                        {"role": "assistant", "content": doc}]
        if rng.random() < multi_turn_fraction:
            # the answer written here is a placeholder: regeneration answers it for real
            messages += [{"role": "user", "content": rng.choice(FOLLOW_UPS)},
                         {"role": "assistant", "content": f"```python\n{code}\n```"}]
        out.append(messages)
    return out
