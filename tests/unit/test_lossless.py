"""Lossless at the engine's numerics: outputs that part are judged at their first parting by
the target in float32; only a near-tie of its own top tokens passes (eyas/serve/lossless.py)."""
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM

from eyas.serve.lossless import judge, partings, tie_tolerance
from helpers import make_tiny_target


def _point(prompts, outputs):
    return SimpleNamespace(prompts=prompts, outputs=outputs)


def test_partings_find_the_first_differing_token_of_requests_sent_alike():
    plain = _point([[1, 2], [3], [4]], [[5, 6, 7], [8, 9], [10, 11]])
    spec = _point([[1, 2], [3], [9]], [[5, 6, 8], [8, 9], [10, 12]])
    # request 0 parts at 2; request 1 is identical; request 2 was sent another prompt (a
    # later turn of a chat that already parted): not compared
    assert partings(plain, spec) == [([1, 2, 5, 6], 2, 7, 8)]


def test_a_near_tie_passes_and_a_clear_choice_does_not(tmp_path):
    target = make_tiny_target(tmp_path / "t")
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    context = [3, 17, 42, 7]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context])).logits[0, -1]
    order = logits.argsort(descending=True)
    best, worst = int(order[0]), int(order[-1])
    found = [(context, 4, best, best), (context, 4, best, worst)]
    tied, clear = judge(target, found, "bfloat16")
    assert tied["near_tie"] and tied["margin"] == 0.0
    assert not clear["near_tie"] and clear["margin"] > tie_tolerance("bfloat16", 4) * \
        clear["logit_std"]
    # the draft's run choosing float32's top token, however far the plain run's rounding
    # strayed from it, is the target's own choice: the plain run is not the reference
    strayed, = judge(target, [(context, 4, worst, best)], "bfloat16")
    assert strayed["near_tie"] and strayed["gap"] == 0.0
    assert -strayed["margin"] > tie_tolerance("bfloat16", 4) * strayed["logit_std"]
    # float32 numerics leave next to no room: the same gap is judged stricter
    assert tie_tolerance("float32", 4) < tie_tolerance("bfloat16", 4) < \
        tie_tolerance("bfloat16", 30)


def test_the_benches_judge_a_parting_as_the_serve_stage_does(tmp_path):
    """bench/family_bench.judged (family, size and recipe benches): identical outputs pass, a
    parting at the target's clear choice fails, however many outputs are identical."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from family_bench import judged

    target = make_tiny_target(tmp_path / "t")
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[3, 17]])).logits[0, -1]
    best, worst = int(logits.argmax()), int(logits.argmin())
    plain = _point([[3, 17], [5]], [[best, 1], [2, 2]])
    same = judged(target, plain, _point([[3, 17], [5]], [[best, 1], [2, 2]]), "bfloat16")
    assert same == {"lossless": True, "identical_outputs": 2, "partings": []}
    parted = judged(target, plain, _point([[3, 17], [5]], [[worst, 1], [2, 2]]), "bfloat16")
    assert not parted["lossless"] and parted["identical_outputs"] == 1
    assert parted["partings"][0]["position"] == 0 and not parted["partings"][0]["near_tie"]
