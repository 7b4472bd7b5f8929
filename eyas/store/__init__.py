"""The stored dataset: what extraction writes and the trainer, evaluator, doctor and serve
stage read. One format module (`format`: files, manifest, checksums, damage checks), its
`writer` and its `reader` (`ExtractedDataset`, memory-mapped, checked at the door)."""
