"""The draft vocabulary: frequency choice, d2t as an offset, invariants and their errors."""
import logging

import pytest
import torch

from eyas.draft.vocab import (DraftVocab, VocabError, build_vocab, check_vocab, count_tokens,
                              full_vocab)


def test_worked_example_from_the_docstring():
    counts = torch.tensor([0, 5, 0, 0, 9, 7, 0, 0])
    vocab = build_vocab(counts, 3)
    assert vocab.d2t.tolist() == [1, 3, 3]
    assert vocab.t2d.tolist() == [False, True, False, False, True, True, False, False]
    assert vocab.target_ids.tolist() == [1, 4, 5] and vocab.filled == 0
    assert vocab.to_target(torch.tensor([0, 2])).tolist() == [1, 5]
    assert vocab.to_draft(torch.tensor([4, 0, 5])).tolist() == [1, -1, 2]


def test_counts_only_loss_masked_tokens():
    ids = [torch.tensor([3, 3, 3, 1, 2, 2]), torch.tensor([3, 0, 2])]
    masks = [torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0, 1, 1])]
    assert count_tokens(zip(ids, masks), 5).tolist() == [1, 1, 3, 0, 0]
    with pytest.raises(VocabError, match="token id 7 outside the target vocab 0..4"):
        count_tokens([([7], [1])], 5)
    with pytest.raises(VocabError, match="differ in length"):
        count_tokens([([1, 2], [1])], 5)


def test_ties_break_by_id_and_is_deterministic():
    counts = torch.tensor([2, 5, 2, 2, 5, 0])
    # 5s (ids 1, 4) first, then the 2s in id order (0, 2, 3): the top 4 are 1, 4, 0, 2
    assert build_vocab(counts, 4).target_ids.tolist() == [0, 1, 2, 4]
    assert build_vocab(counts, 4).d2t.tolist() == build_vocab(counts.clone(), 4).d2t.tolist()


def test_too_few_distinct_tokens_fill_by_id_order_and_say_so(caplog):
    counts = torch.tensor([0, 0, 4, 0, 1, 0, 0, 0])
    with caplog.at_level(logging.WARNING, logger="eyas.draft.vocab"):
        vocab = build_vocab(counts, 4)
    assert vocab.target_ids.tolist() == [0, 1, 2, 4] and vocab.filled == 2
    assert "2 distinct loss-masked tokens, fewer than draft_vocab_size=4" in caplog.text
    with pytest.raises(VocabError, match="draft_vocab_size 9 must be in 1..8"):
        build_vocab(counts, 9)


def test_full_vocab_is_the_identity():
    vocab = full_vocab(6)
    assert vocab.d2t.tolist() == [0] * 6 and vocab.t2d.all()


@pytest.mark.parametrize("d2t, t2d, message", [
    ([1, 3, 3], [0, 1, 0, 0, 1, 0, 0, 0], "t2d marks 2 target tokens but d2t has 3"),
    ([1, 4, 7], [0, 1, 0, 0, 1, 0, 0, 1], "maps to target id 9.*offsets"),  # ids, not offsets
    ([4, 0, 3], [0, 1, 0, 0, 1, 1, 0, 0], "strictly ascending"),
    ([1, 3, 3], [0, 1, 1, 0, 1, 0, 0, 0], "t2d is False for some target id"),
    ([-1, 3, 3], [1, 0, 0, 0, 1, 1, 0, 0], "maps to target id -1"),
])
def test_invariant_violations_are_named(d2t, t2d, message):
    with pytest.raises(VocabError, match=message):
        DraftVocab(torch.tensor(d2t, dtype=torch.int64), torch.tensor(t2d, dtype=torch.bool))


def test_dtypes_are_checked():
    with pytest.raises(VocabError, match="int64"):
        check_vocab(torch.tensor([1, 3, 3], dtype=torch.int32), torch.zeros(8, dtype=torch.bool))
    with pytest.raises(VocabError, match="bool"):
        check_vocab(torch.tensor([1, 3, 3]), torch.zeros(8, dtype=torch.uint8))
