"""Draft training: one loop for one worker or N data-parallel ones, resumable step for step.

The caller (tasks/train.py under Ray Train, or a test) supplies the rank, the world size, an
all-reduce for sums and an all-gather (`Worker`); this module knows no Ray and no MLflow.
Checkpoints hold everything the next step depends on (weights, optimizer, schedule, step), and
the data order is a function of the step, so a resumed run continues the same loss curve.
A stop asked from outside (eyas/train/stop.py: the driver's, at SIGTERM) checkpoints the step
every rank reached and returns, so a resume redoes no finished step.
A checkpoint is safetensors (every tensor) + JSON (the rest): nothing in it is unpickled, so a
run directory on shared storage cannot make the next resume run code. A `state.pt` of an eyas
before that is read with torch's `weights_only` loader (tensors and plain containers only), and
one that needs more is refused naming the file.
"""
from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from eyas.config import DraftConfig, TrainConfig
from eyas.draft.accuracy import DURING_TRAINING, during_training_record, evaluate_draft
from eyas import precision
from eyas.draft import families
from eyas.draft.ttt import (TargetLabelCache, decay_weights, pooled, sample_anchors,
                            step_positions, ttt_loss)
from eyas.draft.vocab import build_vocab, count_tokens
from eyas.layout import LayoutError
from eyas.progress import progress
from eyas.targets import text_config
from eyas.targets.parts import target_parts
from eyas.train.data import StoredData, batches, steps_per_epoch
from eyas.train import stop
from eyas.train.report import StreamNorms, TrainReport
from eyas.train.stream import StreamedData

_KEEP_CHECKPOINTS = 2


class TrainingError(RuntimeError):
    pass


class CheckpointError(ValueError):
    """A checkpoint that is not what eyas writes (damaged, or a pickle needing more than
    tensors): bad input, named with the way out."""


STATE_TENSORS, STATE_JSON, LEGACY_STATE = "state.safetensors", "state.json", "state.pt"
CHECKPOINT_FORMAT = 1


@dataclass
class Worker:
    """Where this process sits in data-parallel training. `all_reduce` sums a tensor over the
    ranks in place and returns it (torch.distributed over gloo on CPU, NCCL on GPU);
    `all_gather` returns every rank's 1-D tensor (their lengths may differ), in rank order, on
    the CPU (the ce label cache's exchange, TargetLabelCache.share)."""

    rank: int = 0
    world: int = 1
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    device: str = "cpu"
    all_gather: Callable[[torch.Tensor], list[torch.Tensor]] = lambda t: [t]


def _to(batch, device):
    return type(batch)(*(t.to(device) if t is not None else None for t in
                         (batch.input_ids, batch.hidden, batch.verifier, batch.loss_mask,
                          batch.attention_mask, batch.anchors, batch.sample_ids)))


def _sync_gradients(params, worker: Worker) -> None:
    """Sum gradients over ranks in one all-reduce (what DDP does, bucketed into one)."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = worker.all_reduce(torch.cat([g.flatten() for g in grads]))
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _lr(step: int, total: int, base: float) -> float:
    warmup = max(1, total // 20)
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def _latest_checkpoint(ckpt_dir: Path) -> Path | None:
    done = sorted(p for p in ckpt_dir.glob("step-*")
                  if (p / STATE_JSON).exists() or (p / LEGACY_STATE).exists())
    return done[-1] if done else None


def _split_state(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """The checkpoint dict -> (tensors under path-like keys, the rest as JSON): a tensor
    anywhere in the tree becomes {"__tensor__": KEY}."""
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}

    def walk(node, key: str):
        if isinstance(node, torch.Tensor):
            t = node.detach().to("cpu").contiguous()
            ident = t.untyped_storage().data_ptr() if t.numel() else None
            if ident in seen:  # storage shared with another entry (safetensors refuses that)
                t = t.clone()
            elif ident is not None:
                seen[ident] = key
            tensors[key] = t
            return {"__tensor__": key}
        if isinstance(node, dict):
            if not all(isinstance(k, (str, int)) for k in node):
                raise TypeError(f"checkpoint: keys of {key or 'the state'} are not str or int")
            # JSON keys are strings: an int key (optimizer state per parameter) is marked
            return {("__int__" if isinstance(k, int) else "") + str(k): walk(v, f"{key}/{k}")
                    for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            out = [walk(v, f"{key}/{i}") for i, v in enumerate(node)]
            return {"__tuple__": out} if isinstance(node, tuple) else out
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        raise TypeError(f"checkpoint: {key} is a {type(node).__name__}, not a tensor or a "
                        "plain value")
    return tensors, walk(state, "")


def _join_state(tree, tensors: dict[str, torch.Tensor], where: Path):
    def walk(node):
        if isinstance(node, dict):
            if set(node) == {"__tensor__"}:
                if node["__tensor__"] not in tensors:
                    raise CheckpointError(f"{where}: {STATE_JSON} names tensor "
                                          f"{node['__tensor__']!r}, missing from {STATE_TENSORS}")
                return tensors[node["__tensor__"]]
            if set(node) == {"__tuple__"}:
                return tuple(walk(v) for v in node["__tuple__"])
            return {(int(k[len("__int__"):]) if k.startswith("__int__") else k): walk(v)
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node
    return walk(tree)


def write_checkpoint(step_dir: Path, state: dict) -> None:
    """`state` (tensors, dicts, lists, tuples, plain values) as STATE_TENSORS + STATE_JSON;
    the JSON, written last, marks the checkpoint complete."""
    from safetensors.torch import save_file

    tensors, tree = _split_state(state)
    save_file(tensors, str(step_dir / STATE_TENSORS), metadata={"format": "pt"})
    (step_dir / STATE_JSON).write_text(json.dumps(
        {"format": CHECKPOINT_FORMAT, "state": tree}, indent=1, allow_nan=True))


def read_checkpoint(step_dir: Path) -> dict:
    """The state `write_checkpoint` wrote, unpickling nothing: a checkpoint of another
    format (an older eyas's pickled `state.pt`) is refused, naming the way out."""
    step_dir = Path(step_dir)
    if (step_dir / STATE_JSON).exists():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            record = json.loads((step_dir / STATE_JSON).read_text())
            tensors = load_file(str(step_dir / STATE_TENSORS), device="cpu")
        except (OSError, ValueError, SafetensorError) as e:
            raise CheckpointError(
                f"checkpoint {step_dir} is damaged ({type(e).__name__}: {e}); remove that "
                "directory to resume from the checkpoint before it (or from the start)") from None
        if not isinstance(record, dict) or record.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"checkpoint {step_dir / STATE_JSON}: not a checkpoint "
                                  f"format this eyas reads (format {CHECKPOINT_FORMAT}); remove "
                                  "that directory to resume from the one before it")
        return _join_state(record["state"], tensors, step_dir)
    raise CheckpointError(
        f"checkpoint {step_dir / LEGACY_STATE}: a pickle (what an eyas before checkpoint "
        f"format {CHECKPOINT_FORMAT} wrote), which this eyas never loads: it reads "
        f"{STATE_TENSORS} + {STATE_JSON} only. Remove {step_dir} to resume from the checkpoint "
        "before it (or from the start), or resume with the eyas that wrote it")


class RunningAccuracy:
    """correct / in-vocab rows per TTT step, summed over the steps of the last epoch (and, as
    the caller all-reduces each step's counts first, over ranks): a ratio of sums, so every
    scored token weighs the same whatever the batches held."""

    def __init__(self, ttt_steps: int, state: dict | None = None):
        self.counts = torch.zeros(ttt_steps, 2, dtype=torch.float64)  # [k, (correct, in_vocab)]
        self.steps, self.first_step = 0, None
        if state:  # from a checkpoint: a resumed run continues the same sums
            self.counts = state["counts"].clone()
            self.steps, self.first_step = state["steps"], state["first_step"]

    def add(self, step: int, counts: torch.Tensor) -> None:
        self.counts += counts
        self.steps += 1
        self.first_step = step + 1 if self.first_step is None else self.first_step

    def state(self) -> dict:
        return {"counts": self.counts.clone(), "steps": self.steps, "first_step": self.first_step}

    def record(self) -> dict:
        """The draft config's eyas_extra entries (eyas.doctor.gap reads them back)."""
        correct, in_vocab = self.counts.unbind(-1)
        return during_training_record(correct.tolist(), in_vocab.tolist(), self.steps,
                                      self.first_step or 0)


def _save_checkpoint(ckpt_dir: Path, step: int, draft, opt, identity: dict,
                     running: RunningAccuracy) -> Path:
    tmp = ckpt_dir / f".tmp-step-{step:07d}"
    final = ckpt_dir / f"step-{step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_checkpoint(tmp, {"step": step, "draft": draft.state_dict(),
                           "optimizer": opt.state_dict(), "identity": identity,
                           "train_accuracy": running.state()})
    os.replace(tmp, final)  # a checkpoint is visible only when whole
    for old in sorted(ckpt_dir.glob("step-*"))[:-_KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def build_draft(data, target_dir: str, settings: DraftConfig):
    """The draft of `settings.family` for this training data (StoredData or StreamedData):
    vocabulary from its loss-masked tokens, shape from the target."""
    from transformers import AutoConfig

    target_config = text_config(AutoConfig.from_pretrained(target_dir))
    embed, head = target_parts(target_dir)
    counts = count_tokens(data.token_rows(), target_config.vocab_size)
    vocab = build_vocab(counts, min(settings.vocab_size, target_config.vocab_size))
    draft = families.get(settings.family).new_draft(
        target_config, len(data.layout.draft_inputs), vocab, embed, settings)
    draft.init_lm_head_from_target(head.lm_head.weight)
    return draft, head, vocab


def train_draft(data, target_dir: str, out_dir: str, cfg: TrainConfig,
                settings: DraftConfig, worker: Worker = Worker(),
                log: Callable[[int, dict], None] | None = None,
                stop_after: int | None = None) -> TrainReport:
    """Train (or resume) a draft on `data`: an extraction directory's train shards (a path), or
    eyas.train.stream.StreamedData (online); write out_dir/draft and out_dir/train_report.json
    (the TrainReport returned) on rank 0."""
    torch.manual_seed(cfg.seed)
    ds = StoredData(data) if isinstance(data, (str, Path)) else data
    layout = ds.layout
    draft, head, vocab = build_draft(ds, target_dir, settings)
    family = families.get(settings.family)
    ttt_steps = family.ttt_steps(settings, cfg)  # draft positions unrolled per step
    if cfg.lm_head_init == "random":
        draft.lm_head.reset_parameters()
    draft, head = draft.to(worker.device), head.to(worker.device)
    step_head = head  # the head the training steps run
    # auto: bfloat16 where this worker's device computes it natively (eyas/precision.py)
    mixed = precision.pick(cfg.precision, precision.support(
        torch.device(worker.device).type == "cuda"))
    if mixed == "bfloat16":
        # autocast casts a weight that needs no grad afresh at every call (it caches only
        # trained ones): the frozen 49k-row head's bf16 copy, made once, is the same product
        step_head = copy.deepcopy(head)
        step_head.lm_head.to(torch.bfloat16)
    draft.lm_head.weight.requires_grad_(not cfg.freeze_lm_head)
    identity = {"target": layout.target.fingerprint, "layout": layout.names,
                "verifier": layout.verifier.name,
                **({"family": family.name} if family.name != families.DEFAULT else {})}
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, cfg.adam_beta2), weight_decay=0.0)
    total = cfg.epochs * steps_per_epoch(len(ds), cfg.batch_size)
    last_epoch = total - steps_per_epoch(len(ds), cfg.batch_size)  # its first step
    ckpt_dir = Path(out_dir) / "checkpoints"
    start, resumed, saved_running = 0, None, None
    latest = _latest_checkpoint(ckpt_dir)
    if latest is not None:
        state = read_checkpoint(latest)
        if state["identity"] != identity:
            raise LayoutError(f"checkpoint {latest} was trained for another target or layout "
                              f"({state['identity']} vs this data's {identity}); remove "
                              f"{ckpt_dir} or use another run_dir")
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["optimizer"])
        start = resumed = state["step"]
        saved_running = state.get("train_accuracy")
    running = RunningAccuracy(ttt_steps, saved_running)
    weights = decay_weights(ttt_steps, cfg.step_loss_decay)
    # ce's labels, computed once per sample (a resumed run computes them again as it goes);
    # data-parallel ranks exchange theirs while the caches fill, so each holds every sample
    # kept only where a sample comes back: a run that ends in the epoch it starts in (a
    # one-epoch run) would hold 8 bytes a token it never reads (266 MiB at 10^5 chats of the
    # scale bench, docs/scaling.md)
    per_epoch = steps_per_epoch(len(ds), cfg.batch_size)
    comes_back = (total - 1) // per_epoch > start // per_epoch
    labels = (TargetLabelCache(int(cfg.target_cache_gib * 2**30), shared=worker.world > 1)
              if cfg.loss == "ce" and cfg.target_cache_gib > 0 and comes_back else None)
    sharing = labels is not None and labels.shared
    outcome = TrainReport(str(Path(out_dir) / "draft"), total, resumed, precision=mixed)
    tokens, started = 0, time.perf_counter()
    bar = progress(total=total, initial=start, desc="train draft", unit="step",
               disable=worker.rank != 0)
    for step, batch in batches(ds, cfg.batch_size, cfg.seed, range(start, total), worker.rank,
                               worker.world):
        if cfg.anchors is not None:  # drawn per (seed, step, rank): a resumed run draws alike
            draw = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 1009 + worker.rank)
            batch = replace(batch, anchors=sample_anchors(batch, cfg.anchors, draw,
                                                          cfg.loss_tokens == "all"))
        batch = _to(batch, worker.device)
        for group in opt.param_groups:
            group["lr"] = _lr(step, total, cfg.lr)
        # normalize by the rows scored over ALL ranks: the global batch's mean, however split;
        # the last entry sums the samples the ranks' label caches lack (and can take): every
        # rank reads the same sum, so all run the exchange below at the same steps or none
        all_tokens = cfg.loss_tokens == "all"
        # and, last, the ranks that see a stop requested (eyas/train/stop.py): all stop at
        # the step any one sees it at
        *denominators, lacking, stopping = worker.all_reduce(torch.tensor(
            step_positions(batch, ttt_steps, all_tokens, family.chained_rows)
            + [labels.wanted(batch) if sharing else 0, float(stop.requested(out_dir))],
            dtype=torch.float64)).tolist()
        if family.pooled_loss:
            denominators = pooled(denominators)
        with torch.autocast(torch.device(worker.device).type, torch.bfloat16,
                            enabled=mixed == "bfloat16"):
            result = ttt_loss(draft, batch, step_head, ttt_steps, step_weights=weights,
                              denominators=denominators, all_tokens=all_tokens,
                              scheme=cfg.ttt_scheme, loss=cfg.loss, labels=labels,
                              chained=family.chained_rows)
        if sharing and lacking:  # a collective: every rank's labels to every rank's cache
            labels.share(worker.all_gather)
        loss = result.loss  # this rank's share of the global batch's loss
        if not torch.isfinite(loss):
            last = _latest_checkpoint(ckpt_dir)
            raise TrainingError(f"loss is {loss.item()} at step {step}; stopped. Last good "
                                f"checkpoint: {last or 'none yet'} (lower train.lr?)")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if worker.world > 1:
            _sync_gradients(params, worker)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        stats = worker.all_reduce(torch.tensor(  # [k, (correct, in_vocab)], global batch
            [[float(s.correct), float(s.in_vocab)] for s in result.steps], dtype=torch.float64))
        if step >= last_epoch:
            running.add(step, stats)
        global_loss = float(worker.all_reduce(result.loss.detach().double().cpu()))
        outcome.losses.append(global_loss)
        step_acc = [c / max(1.0, v) for c, v in stats.tolist()]
        tokens += int(batch.attention_mask.sum())
        done = step + 1
        bar.update(1)
        bar.set_postfix(loss=f"{global_loss:.3f}", acc0=f"{step_acc[0]:.2f}", refresh=False)
        if log and worker.rank == 0:
            log(done, {"loss": global_loss, "lr": opt.param_groups[0]["lr"],
                       "tokens_per_s": tokens * worker.world / (time.perf_counter() - started),
                       **{f"acc_step{k}": a for k, a in enumerate(step_acc)}})
        periodic = done % cfg.checkpoint_every == 0 or done == total
        if worker.rank == 0 and (periodic or stopping):
            saved = _save_checkpoint(ckpt_dir, done, draft, opt, identity, running)
            if stopping:  # the driver waits for this before it lets the run stop
                stop.acknowledge(out_dir, done, saved)
        if stopping:
            bar.close()
            return outcome
        if stop_after is not None and done >= stop_after:
            bar.close()
            outcome.tokens_per_s = tokens * worker.world / max(1e-9,
                                                               time.perf_counter() - started)
            _fill_running(outcome, running)
            return outcome
    bar.close()
    outcome.tokens_per_s = tokens * worker.world / max(1e-9, time.perf_counter() - started)
    record = _fill_running(outcome, running)
    if isinstance(ds, StreamedData):  # online: the fingerprints of what arrived, all ranks
        layout, tokens = _streamed_norms(ds, layout, worker)
        outcome.stream = StreamNorms(norms=layout.to_dict()["norms"], norm_tokens=tokens,
                                     received_steps=len(ds.received))
    if worker.rank == 0:
        # held-out: the final weights, by the evaluator's own code. No standalone re-run on
        # the train split: the evaluate stage does that and compares it with `record`, which
        # is what the training inputs, as this loop assembled them, gave
        heldout = ds.heldout()
        heldout_acc = evaluate_draft(draft, heldout, head, ttt_steps,
                                     batch_size=cfg.batch_size, device=worker.device)
        outcome.heldout_accuracy = heldout_acc.in_vocab
        outcome.heldout_full_accuracy = heldout_acc.full
        family.save(draft, layout, vocab, outcome.draft_dir, extra={
            "train": asdict(cfg), "steps": total, **record,
            "heldout_accuracy": outcome.heldout_accuracy})
        outcome.write(out_dir)
    return outcome


def _streamed_norms(ds, layout, worker: Worker):
    """(The layout with per-slot norm fingerprints summed over the first epoch's streamed
    samples on every rank (a resumed run: over those it received), the tokens they cover)."""
    from eyas.store.format import NormSums
    from eyas.layout import SlotNorms

    sums = worker.all_reduce(ds.norm_sums())
    tokens = int(sums[0, 0]) if len(sums) else 0
    norms = {}
    for name, (count, total, total_sq) in zip(ds.norms, sums.tolist()):
        if count:
            s = NormSums(int(count), total, total_sq)
            norms[name] = SlotNorms(round(s.mean, 6), round(s.std, 6))
    return (layout.with_norms(norms) if norms else layout), tokens


def _fill_running(outcome: TrainReport, running: RunningAccuracy) -> dict:
    if not running.steps:  # stopped before the last epoch: nothing measured to hold it to
        return {}
    record = running.record()
    outcome.train_accuracy = record[DURING_TRAINING]
    outcome.train_accuracy_steps = running.steps
    outcome.train_accuracy_tokens = [int(v) for v in running.counts[:, 1].tolist()]
    return record
