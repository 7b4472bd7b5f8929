"""Draft training: the shard loader's cost, measured side by side in one run.

  step time reading batches from the memory-mapped shards (with read-ahead)
  / step time on the same batches already in memory          (goal <= 1.05)
  and training tokens/s; then the cost of the draft's normalisation options:
  step time of the default draft (its norm options on) / the same draft with every option off,
  on the same batches in memory                              (goal <= 1.10)
  and of the loss: step time with train.loss=ce / with kl    (goal <= 1.10)

    python bench/train_bench.py RUN_DIR [steps]     # RUN_DIR from a pipeline run (extract/)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from eyas.run_records import RunDir

from eyas.config import DraftConfig, TrainConfig  # noqa: E402
from eyas.draft.ttt import decay_weights, ttt_loss  # noqa: E402
from eyas.train.data import StoredData  # noqa: E402
from eyas.train.data import batches  # noqa: E402
from eyas.train.loop import build_draft  # noqa: E402


def timed_steps(draft, head, opt, stream, steps, weights, loss=TrainConfig().loss):
    tokens, started = 0, time.perf_counter()
    for _, batch in stream:
        result = ttt_loss(draft, batch, head, len(weights), step_weights=weights, loss=loss)
        opt.zero_grad(set_to_none=True)
        result.loss.backward()
        opt.step()
        tokens += int(batch.attention_mask.sum())
    return time.perf_counter() - started, tokens


def main(run_dir: str, steps: int = 30) -> None:
    run = Path(run_dir)
    cfg = TrainConfig()
    from eyas.run_records import target_path
    target = target_path(run)
    ds = StoredData(RunDir.of(run).extract)
    draft, head, _ = build_draft(ds, target, DraftConfig())
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-5)
    weights = decay_weights(cfg.ttt_steps, cfg.step_loss_decay)
    total = steps + 2
    in_memory = list(batches(ds, cfg.batch_size, 0, range(total), prefetch=0))
    timed_steps(draft, head, opt, in_memory[:2], 2, weights)  # warm-up
    loader, memory = [], []
    for _ in range(2):  # interleaved, so drift in machine load hits both alike
        loader.append(timed_steps(draft, head, opt, batches(ds, cfg.batch_size, 0, range(2, total)),
                                  steps, weights))
        memory.append(timed_steps(draft, head, opt, in_memory[2:], steps, weights))
    (t_loader, tokens), (t_memory, _) = min(loader), min(memory)
    print(f"data: {run / 'extract'} ({len(ds)} train samples), batch {cfg.batch_size}, "
          f"{cfg.ttt_steps} TTT steps, {steps} steps")
    print(f"step time, shard loader: {1000 * t_loader / steps:.1f} ms; "
          f"in memory: {1000 * t_memory / steps:.1f} ms")
    print(f"loader / in-memory step time = {t_loader / t_memory:.3f}  (goal <= 1.05)")
    print(f"training tokens/s (loader): {tokens / t_loader:.0f}")

    from dataclasses import replace

    from eyas.conventions.vllm_checkpoint import NORM_OPTIONS
    on = [k for k in NORM_OPTIONS if getattr(DraftConfig(), k)]
    plain_draft, _, _ = build_draft(ds, target, replace(DraftConfig(),
                                                        **dict.fromkeys(NORM_OPTIONS, False)))
    plain_opt = torch.optim.AdamW([p for p in plain_draft.parameters() if p.requires_grad],
                                  lr=1e-5)
    timed_steps(plain_draft, head, plain_opt, in_memory[:2], 2, weights)  # warm-up
    options, plain = [], []
    for _ in range(2):
        options.append(timed_steps(draft, head, opt, in_memory[2:], steps, weights)[0])
        plain.append(timed_steps(plain_draft, head, plain_opt, in_memory[2:], steps, weights)[0])
    print(f"step time with the default norm options {on or 'none'} / with none = "
          f"{min(options) / min(plain):.3f}  (goal <= 1.10)")
    losses = {"ce": [], "kl": []}
    for _ in range(2):
        for loss, times in losses.items():
            times.append(timed_steps(draft, head, opt, in_memory[2:], steps, weights, loss)[0])
    print(f"step time with train.loss=ce / kl = {min(losses['ce']) / min(losses['kl']):.3f}  "
          "(goal <= 1.10)")


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]) or not sys.argv[1:]:  # usage: the docstring
        print(__doc__)
        sys.exit(0 if sys.argv[1:] else 2)
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
