"""Thin Ray adapters, one per stage: they place eyas' work on workers and return results."""
import os


def use_node_cores() -> None:
    """Ray pins workers to one thread; a stage that runs alone may use the node's cores."""
    import torch
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
