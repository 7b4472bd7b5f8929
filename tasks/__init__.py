"""Thin Ray adapters, one per stage: they place eyas' work on workers and return results."""


def use_node_cores() -> None:
    """Ray pins workers to one thread; a stage that runs alone may use the node's cores."""
    import torch

    from eyas.engines.vllm_engine import usable_cores
    torch.set_num_threads(usable_cores())


def run_in_actor(actor_class, *args, num_cpus: float = 1) -> dict:
    """`actor_class().run(*args)` in a fresh actor, killed afterwards: a stage that sets
    process-wide state (threads, seeds, an in-process engine) leaves none behind."""
    import ray

    actor = actor_class.options(num_cpus=num_cpus).remote()
    try:
        return ray.get(actor.run.remote(*args))
    finally:
        ray.kill(actor)
