"""Ray adapter of online training (train.source=online): target replicas hand the states of
each optimizer step to the trainer ranks through Ray's object store, with nothing on disk.

The `Feeder` actor is the bounded queue. It asks the replicas (tasks/extract.py's, round-robin)
for the samples of the next steps, at most `train.online.queue_steps` ahead of the slowest
trainer rank: full, the target waits; a rank asking for a step not yet computed waits for it.
A replica returns one object per sample straight into the object store; the Feeder hands out
references, never data, and a rank fetches its own samples. A replica that dies is restarted
and its task retried (tasks/extract.py's restart policy), so the step it was computing arrives
late, not lost; which samples a step holds depends on the step alone (eyas/train/data.py), so
a resumed run asks for the step it stopped at and gets the same samples. A trainer worker that
dies (its node lost) restarts the worker group from the newest checkpoint (tasks/train.py); the
new group asks for a step the stream has handed out already, and the Feeder rewinds to it.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import ray

from eyas.train.data import rank_slice
from eyas.train.report import FeederReport
from eyas.train.stream import OnlineStream


@ray.remote(num_cpus=0, max_restarts=0)
class Feeder:
    def __init__(self, replicas, prepare_dir: str, lengths: list[int], num_heldout: int,
                 train_cfg):
        """`lengths`: the train split's samples'; `train_cfg`: the run's TrainConfig (its
        batch size, seed, workers, epochs and train.online settings)."""
        from eyas.train.data import EpochOrder, steps_per_epoch

        queue_steps, keep_epoch = train_cfg.online.queue_steps, train_cfg.online.keep_epoch
        self.replicas, self.prepare_dir = replicas, prepare_dir
        self.num_heldout, self.batch_size = num_heldout, train_cfg.batch_size
        self.world = train_cfg.num_workers
        self.total = train_cfg.epochs * steps_per_epoch(len(lengths), train_cfg.batch_size)
        self.order = EpochOrder(lengths, train_cfg.batch_size, train_cfg.seed)
        self.capacity, self.keep_epoch = queue_steps, keep_epoch
        self.next: int | None = None  # the next step to ask a replica for
        self.queued: dict[int, list] = {}  # step -> its samples' refs, until every rank took it
        self.taken: dict[int, set[int]] = {}
        self.kept: dict[int, object] = {}  # sample index -> ref (keep_epoch)
        self.turn = 0
        self.stats = FeederReport(queue_steps=queue_steps, keep_epoch=keep_epoch,
                                  replicas=len(replicas))

    def _ask(self, split: str, indices: list[int]) -> list:
        replica = self.replicas[self.turn % len(self.replicas)]
        self.turn += 1
        refs = replica.produce.options(num_returns=len(indices)).remote(
            self.prepare_dir, split, indices)
        return [refs] if len(indices) == 1 else list(refs)

    def _fill(self) -> None:
        while self.next < self.total and len(self.queued) < self.capacity:
            indices = self.order(self.next)
            if self.keep_epoch and all(i in self.kept for i in indices):
                refs = [self.kept[i] for i in indices]
                self.stats.reused_steps += 1
            else:
                refs = self._ask("train", indices)
                self.stats.computed_steps += 1
                if self.keep_epoch:
                    self.kept.update(zip(indices, refs))
            self.queued[self.next], self.taken[self.next] = refs, set()
            self.next += 1
        self.stats.most_queued = max(self.stats.most_queued, len(self.queued))

    async def take(self, step: int, rank: int) -> list:
        """References to rank `rank`'s samples of global step `step` (the first call sets
        where the stream starts: a resumed run's checkpoint step)."""
        if self.next is None:
            self.next = step
            self._fill()
        if step not in self.queued and step < self.next:
            # handed out already: a restarted worker group resuming from its checkpoint
            self.queued.clear()
            self.taken.clear()
            self.next = step
            self.stats.rewinds += 1
            self._fill()
        while step not in self.queued:
            if step >= self.total:
                raise ValueError(f"step {step} of rank {rank} is not in the stream (it "
                                 f"hands out steps up to {self.total - 1})")
            await asyncio.sleep(0.005)  # beyond the queue: wait for the other ranks
        mine = rank_slice(self.queued[step], rank, self.world)
        self.taken[step].add(rank)
        if len(self.taken[step]) == self.world:  # every rank has it: make room
            del self.queued[step], self.taken[step]
            self._fill()
        return mine

    def heldout(self) -> list:
        """References to every held-out sample's states, computed in chunks over the replicas."""
        indices = list(range(self.num_heldout))
        return [ref for i in range(0, len(indices), self.batch_size)
                for ref in self._ask("heldout", indices[i:i + self.batch_size])]

    def report(self) -> FeederReport:
        return self.stats


def start_stream(target_dir: str, layout, extract_cfg, model_dtype: str, prepare_dir: Path,
                 train_cfg, pad_id: int):
    """(the Feeder, its replicas) for a run of `train_cfg.epochs` over the prepared data."""
    from tasks.extract import start_replicas

    replicas = start_replicas(target_dir, layout, extract_cfg, model_dtype, prepare_dir, pad_id,
                              cpu_share=0.5)
    from eyas.extract.on_demand import PreparedRows

    # the num_tokens column and the row count: no token list is read on the driver
    lengths = PreparedRows(prepare_dir, "train").lengths()
    num_heldout = len(PreparedRows(prepare_dir, "heldout"))
    from tasks.cluster import on_this_node
    # on the driver's node: a lost node takes trainer ranks or a replica (both restarted), never
    # the queue, which owns the states in flight
    feeder = Feeder.options(**on_this_node()).remote(
        replicas, str(prepare_dir), lengths, num_heldout, train_cfg)
    return feeder, replicas


def streamed_data(stream: OnlineStream, batch_size: int, data_dir: str):
    """What a trainer rank reads (eyas.train.stream.StreamedData), fed by `stream.feeder`; the
    held-out split from `data_dir` (the online extraction), where it is stored."""
    from eyas.extract.on_demand import stored_split
    from eyas.train.data import steps_per_epoch
    from eyas.train.stream import StreamedData

    feeder = stream.feeder

    def fetch(step, rank):
        return ray.get(ray.get(feeder.take.remote(step, rank)))

    def heldout():
        stored = stored_split(data_dir, "heldout")
        return stored if stored is not None else ray.get(ray.get(feeder.heldout.remote()))

    return StreamedData(stream.layout, stream.prepare_dir, fetch, heldout,
                        steps_per_epoch(stream.num_samples, batch_size))


def stop_stream(feeder, replicas) -> FeederReport | None:
    """Stop the Feeder and its replicas; its report (None when it could not be read)."""
    try:
        report = ray.get(feeder.report.remote())
    except ray.exceptions.RayError:
        report = None
    for actor in (feeder, *replicas):
        ray.kill(actor)
    return report
