"""Loaded-weights parity: the draft vLLM holds is the draft directory, tensor by tensor, and
computes what eyas's forward computes.

After the engine boots, every tensor its drafter holds (eyas.engines.vllm_loaded) is held to
what the directory's weights make of it under vLLM's naming (eyas.conventions.vllm_weights):
shape, checksum (sha256 of its values in the engine's dtype) and relative error. A file tensor
the drafter does not hold, a held one all zero, one of another shape or other values, and a
parameter the drafter reads that no file tensor filled (it serves its initial value, or the
target's lm_head) each name themselves. Then the drafter's logits for one probe prompt's first
proposal (eyas.engines.vllm_draft_logits) against eyas's forward on the very states vLLM fed it.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import torch

from eyas.conventions.vllm_weights import Expected, expected_held, unread
from eyas.doctor.findings import Finding

EQUAL = 1e-3  # a held tensor's relative error beyond which it is not the file's
# eyas's forward (float32) against the drafter's logits: relative error allowed per engine dtype
# (measured on SmolLM2's draft: see docs/doctor.md, "Loaded weights")
LOGITS_TOLERANCE = {"float32": 1e-3, "bfloat16": 3e-2, "float16": 1e-2}


@dataclass
class TensorCheck:
    name: str  # vLLM's
    sources: list[str]  # the directory's tensors it is made of
    shape: list[int]  # the file's (fused, renamed)
    held_shape: list[int] | None
    checksum: str  # sha256 (first 12) of the file's values in the engine's dtype
    held_checksum: str | None
    error: float | None  # |held - file| / |file|
    status: str  # equal | missing | shape | zeroed | differs | not_loaded


def _checksum(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:12]


def _as_held(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A file tensor as the engine holds it: integers as they are, floats rounded to the
    engine's dtype and compared in float32 (a linear read through its layer comes as that)."""
    if not tensor.is_floating_point():
        return tensor.cpu()
    return tensor.detach().cpu().to(dtype).float()


def compare_tensors(expected: dict[str, Expected], held: dict[str, torch.Tensor],
                    dtype: torch.dtype) -> list[TensorCheck]:
    """One TensorCheck per tensor expected or read by the drafter (DERIVED and UNREAD ones
    aside)."""
    rows = []
    for name in sorted(set(expected) | {n for n in held if not unread(n)}):
        want, got = expected.get(name), held.get(name)
        if want is None:  # held, read, and filled by no file tensor
            value = _as_held(got, dtype)
            rows.append(TensorCheck(name, [], [], list(got.shape), "", _checksum(value), None,
                                    "not_loaded"))
            continue
        file = _as_held(want.tensor, dtype)
        row = TensorCheck(name, list(want.sources), list(file.shape), None, _checksum(file),
                          None, None, "missing")
        rows.append(row)
        if got is None:
            continue
        value = _as_held(got, dtype)
        row.held_shape, row.held_checksum = list(value.shape), _checksum(value)
        if value.shape != file.shape:
            row.status = "shape"
            continue
        scale = float(file.double().norm())
        row.error = float((value.double() - file.double()).norm()) / max(scale, 1e-30)
        if row.error <= EQUAL:
            row.status = "equal"
        else:
            row.status = "zeroed" if not value.any() else "differs"
    return rows


WHAT = {"missing": "in the draft's weights but not held by the drafter (the loader dropped it)",
        "shape": "held with another shape than the file's",
        "zeroed": "held all zero where the file's is not",
        "differs": "held with other values than the file's",
        "not_loaded": ("read by the drafter but filled by no tensor of the draft's weights "
                       "(it serves its initial value, or the target's)")}


def weights_findings(rows: list[TensorCheck]) -> list[Finding]:
    out = []
    for status, what in WHAT.items():
        bad = [r for r in rows if r.status == status]
        if bad:
            named = ", ".join(f"{r.name}" + (f" (from {', '.join(r.sources)})" if r.sources
                                             and r.sources != [r.name] else "")
                              + (f": {r.held_shape} held, {r.shape} in the file"
                                 if status == "shape" else "")
                              + (f": relative error {r.error:.2g}" if status == "differs"
                                 else "")
                              for r in bad)
            out.append(Finding(f"weights_{status}", f"{len(bad)} tensor(s) {what}: {named}"))
    return out


def expected_for(served_dir, loaded, target_embedding) -> dict[str, Expected]:
    """What the drafter should hold for the draft directory the engine booted with
    (`loaded`: its eyas.draft.load.LoadedDraft, for its vocabulary)."""
    from eyas.draft.directory import read_config
    from eyas.draft.weights import read_tensors

    vocab = getattr(loaded.draft, "vocab", None)
    ids = vocab.target_ids if vocab is not None and vocab.size != vocab.target_vocab_size \
        else None
    return expected_held(read_tensors(served_dir), read_config(served_dir), target_embedding,
                         ids)


def logits_check(first, draft, k: int, dtype: str) -> dict:
    """The drafter's first-proposal logits (eyas.engines.vllm_draft_logits.FirstProposal)
    against eyas's forward on the states vLLM fed it: relative error over the k positions,
    and the share of positions whose top token agrees."""
    from eyas.draft.ttt import unroll

    vocab = draft.vocab
    served = first.logits[:, vocab.target_ids].float()  # [k, draft vocab]
    chosen = vocab.target_ids[served.argmax(-1)].tolist()  # what a chain drafter fed back
    n = len(first.prompt)
    ids = torch.tensor([first.prompt + [first.bonus] + chosen[:-1]])
    hidden = torch.cat([first.hidden, first.hidden.new_zeros(k, first.hidden.shape[1])])[None]
    with torch.no_grad():
        mine = torch.stack([lg[0, n - 1].float() for _, lg in unroll(draft, ids, hidden, k)])
    finite = torch.isfinite(served)
    diff = torch.where(finite, mine - served, torch.zeros_like(mine))
    error = float(diff.norm() / max(float(torch.where(finite, served, 0.0).norm()), 1e-30))
    if not bool(finite.all()):
        error = float("inf")
    tolerance = LOGITS_TOLERANCE.get(dtype, 5e-2)
    agree = float((mine.argmax(-1) == served.argmax(-1)).float().mean())
    return {"ok": error <= tolerance, "positions": k, "prompt_tokens": n, "error": error,
            "tolerance": tolerance, "top1_agree": agree}


def loaded_parity(engine, served_dir, target_dir, prompt: list[int], dtype: str) -> dict:
    """Loaded-weights parity on a booted in-process VllmEngine serving `served_dir`: the
    tensors its drafter holds against the directory's, then its logits on `prompt` against
    eyas's forward. {"ok", "message", "findings", "tensors", "logits"}."""
    from eyas.draft.load import load
    from eyas.engines.vllm_draft_logits import first_proposal
    from eyas.engines.vllm_loaded import held_tensors
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    embedding, _ = target_parts(target_dir)
    loaded = load(served_dir, embedding, identify(target_dir))
    held, _how = held_tensors(engine)
    rows = compare_tensors(expected_for(served_dir, loaded, embedding), held,
                           getattr(torch, dtype))
    findings = weights_findings(rows)
    logits = logits_check(first_proposal(engine, prompt), loaded.draft.eval(), engine.k, dtype)
    if not logits["ok"] and not findings:
        findings.append(Finding("logits_differ", (
            f"the drafter's logits for a probe prompt differ from eyas's forward on the states "
            f"vLLM fed it (relative error {logits['error']:.2g}, tolerance "
            f"{logits['tolerance']:.0e} in {dtype}) though every tensor it holds is the "
            "file's: the engine computes another function (attention mode, norm options, "
            "rotary settings in config.json)")))
    equal = sum(r.status == "equal" for r in rows)
    message = (f"loaded weights: the drafter holds the draft's {equal} tensors as written "
               f"(sha256 equal) and its logits match eyas's forward (relative error "
               f"{logits['error']:.1e}, top token agrees at {logits['top1_agree']:.0%} of "
               f"{logits['positions']} positions)" if not findings else
               "loaded weights FAILED: " + "; ".join(f"{f.name}: {f.message}"
                                                     for f in findings))
    return {"ok": not findings, "message": message, "findings": [vars(f) for f in findings],
            "tensors": [asdict(r) for r in rows], "logits": logits}


PROBE_TOKENS = 256  # the probe prompt's first tokens: enough context, a short boot


def check_loaded(target_dir, served_dir, data_dir, cfg) -> dict:
    """Boot vLLM with the draft as the benchmark will (cfg: the ServeConfig) and prove the
    weights it loaded (`loaded_parity`) on the first probe sample's tokens."""
    from eyas.engines.vllm_engine import VllmEngine
    from eyas.serve.parity import engine_options
    from eyas.store.reader import ExtractedDataset

    prompt = ExtractedDataset(data_dir, "probe")[0].input_ids.tolist()[:PROBE_TOKENS]
    k = cfg.num_speculative_tokens
    options = engine_options(len(prompt) + k + 2, cfg)
    with VllmEngine(target_dir, served_dir, k, options) as engine:
        return loaded_parity(engine, served_dir, target_dir, prompt, options.dtype)
