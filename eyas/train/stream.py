"""Online training's data path, Ray-free: what a target replica computes for a step, and what
a trainer rank does with what arrives (tasks/online.py moves it through Ray's object store).

The stream is a function of the step, as offline: step s trains on the samples
`eyas.train.data.step_indices` puts at s. A producer asked for step s, wherever and however
often (a restarted replica, a resumed run), computes exactly those samples; the consumer checks
the sample ids it receives against the plan, so a sample trained twice or skipped within an
epoch is an error, never a quiet difference.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from eyas.store.format import NormSums
from eyas.store.reader import Sample
from eyas.extract.on_demand import PreparedRows, SampleList, row_sample
from eyas.layout import HiddenStateLayout


class StreamError(RuntimeError):
    pass


@dataclass(frozen=True)
class OnlineStream:
    """Where a trainer rank reads an online run's stream from (train.source=online): built by
    the driver (workflows/stages.py), carried to every rank (tasks/train.py), which reads it
    as StreamedData (tasks/online.py `streamed_data`)."""

    feeder: Any  # the Feeder actor's handle (tasks/online.py): a Ray type eyas does not import
    layout: HiddenStateLayout  # the online extraction's (its manifest's)
    prepare_dir: str  # the prepared splits the replicas compute states for
    num_samples: int  # samples in the prepared train split


class StreamedData:
    """The training data of an online run, as `eyas.train.data.batches` reads it.

    `fetch(step, rank)` returns this rank's samples of global step `step` (tasks/online.py:
    from the object store); `heldout()` the held-out split: the extraction's stored one, or a
    list of its samples. The per-slot norm
    fingerprints are summed over the first epoch's samples as they arrive (offline they are
    summed over the stored shards), for the draft's layout record and the run's report.
    """

    def __init__(self, layout: HiddenStateLayout, prepare_dir: str | Path,
                 fetch: Callable[[int, int], list[Sample]],
                 heldout: Callable[[], Any], steps_per_epoch: int):
        self.layout, self.fetch, self._heldout = layout, fetch, heldout
        self.rows = PreparedRows(prepare_dir, "train")  # Arrow columns, rows on demand
        self.first_epoch = steps_per_epoch
        self.norms = {name: NormSums() for name in
                      dict.fromkeys([*layout.names, layout.verifier.name])}
        self.received: list[tuple[int, list[str]]] = []  # (step, sample ids), as trained

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> list[int]:
        return self.rows.lengths()

    def token_rows(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for row in self.rows:
            sample = row_sample(row)
            yield sample.input_ids, sample.loss_mask

    def samples(self, step: int, rank: int, indices: list[int]) -> list[Sample]:
        got = self.fetch(step, rank)
        want = self.rows.sample_ids(indices)
        ids = [s.sample_id for s in got]
        if ids != want:
            raise StreamError(f"step {step}, rank {rank}: the stream delivered samples {ids} "
                              f"where the plan puts {want}: a sample would be trained twice "
                              "or skipped; the producers and this trainer disagree on "
                              "train.seed, train.batch_size or the prepared data")
        if step < self.first_epoch:
            for s in got:
                for name, sums in self.norms.items():
                    sums.add(s.slots[name].float().norm(dim=-1))
        self.received.append((step, ids))
        return got

    def heldout(self):
        """The held-out split: what `heldout()` gives, a stored split (read from disk) or the
        samples the replicas computed (an extraction that stored none)."""
        got = self._heldout()
        return SampleList(self.layout, got) if isinstance(got, list) else got

    def norm_sums(self) -> torch.Tensor:
        """[slots, (count, total, total_sq)] of the first epoch as this rank saw it, for an
        all-reduce over ranks (eyas.train.loop)."""
        return torch.tensor([[s.count, s.total, s.total_sq] for s in self.norms.values()],
                            dtype=torch.float64)
