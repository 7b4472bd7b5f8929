"""The DSpark draft: DFlash's backbone (eyas/draft/dflash/model.py, subclassed) plus the two
heads of vLLM's `Qwen3DSparkForCausalLM` (model_executor/models/qwen3_dspark.py; the names:
eyas.conventions.vllm_dspark) and speculators' `DSparkDraftModel` (models/dspark/).

Alignment. The block is DFlash's, the anchor (bonus) token and B-1 masks at positions
r+1..r+B of anchor row r, but with sample_from_anchor EVERY slot drafts: slot k = 0..B-1
drafts token x_{r+k+2}, scored against the verifier state at r+k+1 (eyas's TTT alignment,
eyas/draft/ttt.py), so a block of B drafts B tokens, served with num_speculative_tokens = B.
(DFlash drops slot 0, the bonus; DSpark keeps it: `first_slot` 0.)

    base     lm_head(norm(block slot k))                                   [draft vocab]
    markov   logits_k = base_k + markov_w2(markov_w1[prev_k])               (low rank r)
             prev_k = x_{r+k+1}: the anchor for slot 0, then the token slot k-1 drafted
    confidence  c_k = proj(cat(norm(slot k), markov_w1[prev_k]))            (a logit)

Training reads prev_k from the data (teacher forcing, as speculators' DSparkDraftModel and
eyas's chain unroll do); a slot whose previous token lies past the data's end (drafting: the
reference engine, or a training row's tail, never scored) takes the draft's own greedy token
of slot k-1, left to right, as vLLM's DSparkSpeculator adds the bias with the token it sampled.

The objective (speculators' models/dspark/metrics.py): the KL of every slot weighted
exp(-k/gamma) from k = 0 (eyas's decay**k, decay = exp(-1/gamma)), pooled over every scored
slot (Family.pooled_loss) as DFlash's; plus `auxiliary_loss`, the confidence head's binary
cross-entropy against the slot's acceptance rate 1 - TV(draft, target) (detached), weighted
and normalised as the KL, times CONFIDENCE_ALPHA. speculators' own DSparkDraftModel gives the
same loss and gradients on the same weights, batch and anchors
(tests/unit/test_dspark_objective.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eyas.draft.dflash.model import DFlashConfig, DFlashDraft
from eyas.draft.vocab import DraftVocab

DEFAULT_MARKOV_RANK = 256  # speculators' DSparkSpeculatorConfig.markov_rank
CONFIDENCE_ALPHA = 1.0  # speculators' confidence_head_alpha: the BCE term's weight


@dataclass(frozen=True)
class DSparkConfig(DFlashConfig):
    """DFlash's fields (block_size: the anchor and its masks, all drafting) and the Markov
    head's rank."""

    markov_rank: int = DEFAULT_MARKOV_RANK


class MarkovHead(nn.Module):
    """The low-rank first-order logit bias: target id -> [r] -> [draft vocab]."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        nn.init.normal_(self.markov_w1.weight, std=0.01)  # speculators' MarkovHead init
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)


class ConfidenceHead(nn.Module):
    """A slot's acceptance logit from its state and its previous token's Markov embedding."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class DSparkDraft(DFlashDraft):
    first_slot = 0  # the anchor's slot drafts too

    def __init__(self, config: DSparkConfig, target_embedding: torch.Tensor | nn.Embedding,
                 vocab: DraftVocab):
        if config.markov_rank < 1:
            raise ValueError(f"markov_rank {config.markov_rank}: a DSpark draft's Markov head "
                             "has rank >= 1 (vLLM's loader builds it unconditionally)")
        super().__init__(config, target_embedding, vocab)
        self.markov_head = MarkovHead(config.vocab_size, config.draft_vocab_size,
                                      config.markov_rank)
        self.confidence_head = ConfidenceHead(config.hidden_size + config.markov_rank)

    def previous_tokens(self, base: torch.Tensor, input_ids: torch.Tensor,
                        at_rows: torch.Tensor) -> torch.Tensor:
        """[B, A, S] target ids: the token before each slot of each anchor's block, x_{r+k+1}
        from the data, the draft's own greedy token of slot k-1 where that lies past the end
        (slot 0's bonus past the end reads 0, as the block's own bonus does). `base`: the
        slots' logits before the bias [B, A, S, draft_vocab]."""
        b, s = input_ids.shape[0], base.shape[2]
        ahead = torch.cat([input_ids[:, 1:], input_ids.new_full((b, s), -1)], 1)
        index = at_rows[:, :, None] + torch.arange(s, device=input_ids.device)  # [B, A, S]
        with torch.no_grad():
            prev = ahead.gather(1, index.flatten(1)).view(index.shape)
            prev[:, :, 0].clamp_(min=0)
            w1, w2 = self.markov_head.markov_w1, self.markov_head.markov_w2
            for k in range(1, s):  # left to right: slot k reads slot k-1's choice
                past = (prev[:, :, k] < 0).nonzero(as_tuple=True)
                if past[0].numel():
                    before = base[past][:, k - 1] + w2(w1(prev[past][:, k - 1]))
                    prev[past + (torch.full_like(past[0], k),)] = self.vocab.to_target(
                        before.argmax(-1))
        return prev

    def heads(self, normed, input_ids, at_rows):
        """(confidence logits [B, A, S], Markov-biased logits [B, A, S, draft_vocab])."""
        base = self.lm_head(normed)
        prev = self.markov_head.markov_w1(self.previous_tokens(base, input_ids, at_rows))
        logits = base + self.markov_head.markov_w2(prev.to(normed.dtype))
        confidence = self.confidence_head(torch.cat([normed, prev.to(normed.dtype)], -1))
        return confidence, logits

    def auxiliary_loss(self, confidence: torch.Tensor, logits: torch.Tensor,
                       target_logp: torch.Tensor | None = None,
                       target_best: torch.Tensor | None = None) -> torch.Tensor:
        """The confidence head's term per row ([B, rows], added to the row's KL or CE by
        eyas.draft.ttt.ttt_loss, weighted and normalised with it): CONFIDENCE_ALPHA x
        BCE(confidence logit, acceptance rate). The rate is sum_v min(q_v, p_v) = 1 - TV of
        the draft's distribution q and the target's p over the draft vocab (`target_logp`,
        the kl loss's); the ce loss trains toward the point mass at the target's best draft
        token (`target_best` [B, rows]), where it is q at that token."""
        with torch.no_grad():
            q = logits.float().softmax(-1)
            if target_logp is not None:
                accept = torch.minimum(q, target_logp.exp()).sum(-1)
            else:
                accept = q.gather(-1, target_best[..., None]).squeeze(-1)
        return CONFIDENCE_ALPHA * F.binary_cross_entropy_with_logits(
            confidence.float(), accept, reduction="none")
