"""The ce loss's label cache over data-parallel ranks (issue 54): each rank draws its slice of
a global batch that reshuffles every epoch, so a cache of its own samples alone hit about half
the time in the second epoch at 2 ranks. The ranks exchange the labels they computed while
their caches fill, and each holds what one worker's cache would: none computed again."""

import datetime
import json
from pathlib import Path

import pytest
import torch

import eyas.train.loop as loop
from eyas.draft.ttt import TargetLabelCache, _target_side, counted_rows
from eyas.train.data import StoredData, batches, steps_per_epoch
from helpers import tiny_train_settings, tiny_training_world

CFG, SETTINGS = tiny_train_settings()
BATCH = CFG.batch_size  # 4: 2 samples a rank at 2 ranks, 6 steps an epoch of 24 samples


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.set_num_threads(1)
    w = tiny_training_world(tmp_path_factory.mktemp("ranks"))
    ds = StoredData(w.offline)
    draft, head, vocab = loop.build_draft(ds, str(w.target), SETTINGS)
    return w, ds, head, vocab, draft.t2d


def _ranks(world, ranks: int, max_bytes: int, share: bool = True):
    """`ranks` caches stepped through 2 epochs of the global batches, each on its slice of
    them (`batches(..., rank, world)`), exchanging as train_draft does: at the steps where the
    ranks' `wanted` sums above 0, every rank's contribution to every rank. Checks every label
    against the head's. -> (caches, [per epoch: each rank's samples computed], exchanges per
    epoch)."""
    _, ds, head, vocab, t2d = world
    per_epoch = steps_per_epoch(len(ds), BATCH)
    caches = [TargetLabelCache(max_bytes, shared=share and ranks > 1) for _ in range(ranks)]
    computed, exchanges = [], [0, 0]
    drawn = zip(*(batches(ds, BATCH, 0, range(2 * per_epoch), r, ranks, prefetch=0)
                  for r in range(ranks)))
    for step, parts in enumerate(drawn):
        lacking = sum(c.wanted(b) for c, (_, b) in zip(caches, parts)) if caches[0].shared else 0
        for cache, (_, batch) in zip(caches, parts):
            scored = counted_rows(batch, all_tokens=True)
            got = cache.labels(batch, head, vocab, t2d, scored)
            choice, _, best = _target_side(head, batch.verifier, scored, vocab, t2d, "ce")
            assert torch.equal(got.choice, choice) and torch.equal(got.best, best[..., 0])
        if lacking:
            exchanges[step // per_epoch] += 1
            gathered = [c.contribution() for c in caches]
            for cache in caches:
                cache.receive(gathered)
        if (step + 1) % per_epoch == 0:
            computed.append([c.computed - sum(e[r] for e in computed)
                             for r, c in enumerate(caches)])
    return caches, computed, exchanges


def test_every_rank_hits_every_sample_after_the_first_epoch(world):
    """Two ranks: each computes its 12 samples of the first epoch, then none; each cache holds
    all 24 (the same labels, bit for bit, as the head's: `_ranks` checks every batch), and
    nothing is exchanged in the second epoch. Without the exchange (each rank caching its own)
    about half of a rank's samples of the second epoch were computed again."""
    caches, computed, exchanges = _ranks(world, 2, 1 << 30)
    assert computed == [[12, 12], [0, 0]]
    assert exchanges == [6, 0]
    assert all(len(c.samples) == 24 for c in caches)
    assert caches[0].samples.keys() == caches[1].samples.keys()
    assert all(torch.equal(caches[0].samples[i], caches[1].samples[i]) for i in caches[0].samples)
    alone, computed, exchanges = _ranks(world, 2, 1 << 30, share=False)
    assert computed[0] == [12, 12] and all(n >= 3 for n in computed[1]) and exchanges == [0, 0]
    assert all(len(c.samples) < 24 for c in alone)


def test_past_the_budget_each_rank_holds_what_one_worker_would(world):
    """With room for only some samples, every rank stores the global batch's in its order, as
    one worker does: the same samples held, every rank computing in the second epoch just the
    samples one worker would, and no exchange once nothing more fits."""
    (single,), one, _ = _ranks(world, 1, 1 << 30)
    budget = single.bytes * 2 // 5
    (single,), one, _ = _ranks(world, 1, budget)
    caches, computed, exchanges = _ranks(world, 2, budget)
    assert 0 < len(single.samples) < 24 and one[1][0] == 24 - len(single.samples)
    assert all(c.samples.keys() == single.samples.keys() and c.bytes == single.bytes
               for c in caches)
    assert sum(computed[1]) == one[1][0] and exchanges[1] == 0


def _rank(rank: int, ranks: int, store: str, target: str, extract: str, out: str) -> None:
    """One process of the gloo test: train_draft as tasks/train.py's workers run it (its
    all_gather), writing what its label cache computed and held to out/rank-N.json."""
    import torch.distributed as dist

    from tasks.train import all_gather

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=ranks, timeout=datetime.timedelta(seconds=120))
    made, gathers = [], []

    class Recorded(TargetLabelCache):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    def all_reduce(t):
        dist.all_reduce(t)
        return t

    def gather(t):
        gathers.append(t.numel())
        return all_gather(t, ranks, "cpu")

    loop.TargetLabelCache = Recorded  # this process's own module
    report = loop.train_draft(extract, target, out, CFG, SETTINGS,
                              loop.Worker(rank, ranks, all_reduce, "cpu", gather), stop_after=12)
    dist.destroy_process_group()
    (cache,) = made
    Path(out, f"rank-{rank}.json").write_text(json.dumps(
        {"computed": cache.computed, "held": len(cache.samples), "gathers": len(gathers),
         "losses": report.losses}))


def test_two_gloo_processes_run_the_head_once_per_sample(world, tmp_path):
    """Two real ranks (processes over gloo, tasks/train.py's all_gather) train 2 epochs with
    the cache: the head ran once per sample over both ranks, the ranks exchanged at the first
    epoch's 6 steps only, and each ends holding all 24 samples."""
    import torch.multiprocessing as mp

    w = world[0]
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), str(w.target), str(w.offline),
                          str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["computed"] for r in ranks] == [12, 12]
    assert [(r["held"], r["gathers"]) for r in ranks] == [(24, 6), (24, 6)]
    assert ranks[0]["losses"] == ranks[1]["losses"] and len(ranks[0]["losses"]) == 12
