"""The `TeacherBackend` seam and its model backends (HF transformers, vLLM prompt log-probs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from buffer.contracts import are_logprobs


@dataclass(frozen=True)
class ScoreRequest:
    """Score a student response under the teacher, in the teacher's own context."""

    prompt_ids: tuple[int, ...]
    """Teacher prompt (may hold privileged context), shape [num_prompt_tokens]."""
    response_ids: tuple[int, ...]
    """The student's exact response tokens, shape [num_response_tokens]."""


@dataclass(frozen=True)
class TokenScores:
    """The teacher's view of one response."""

    logprobs: tuple[float, ...]
    """Teacher log-prob of each response token, shape [num_response_tokens]."""
    topk_ids: tuple[tuple[int, ...], ...] | None = None
    """The teacher's k most likely tokens at each response position, shape [num_response_tokens, k]
    (-1 pads a position with fewer candidates); None when top-k was not asked for."""
    topk_logprobs: tuple[tuple[float, ...], ...] | None = None
    """Their log-probs, shape [num_response_tokens, k] (0 on padding)."""

    def valid(self) -> bool:
        """Every log-prob, top-k included, is one (`buffer.contracts.are_logprobs`)."""
        return are_logprobs(self.logprobs) and all(are_logprobs(row) for row in self.topk_logprobs or ())

    @classmethod
    def unscored(cls, num_tokens: int, top_k: int) -> "TokenScores":
        """Zeros (and empty top-k rows) for a turn the loss never trains (TCOD-B2F's replayed
        turns): the teacher is not asked about it; its loss mask keeps the zeros out of the loss."""
        if not top_k:
            return cls((0.0,) * num_tokens)
        return cls((0.0,) * num_tokens, ((-1,) * top_k,) * num_tokens, ((0.0,) * top_k,) * num_tokens)

    def slice(self, start: int, stop: int) -> "TokenScores":
        """The scores of response tokens [start, stop)."""
        return TokenScores(self.logprobs[start:stop],
                           None if self.topk_ids is None else self.topk_ids[start:stop],
                           None if self.topk_logprobs is None else self.topk_logprobs[start:stop])


def scores_from_prompt_logprobs(token_ids: list[int], rows: list[dict[int, tuple[int, float]] | None],
                                num_response_tokens: int, top_k: int) -> TokenScores:
    """TokenScores of the last num_response_tokens of `token_ids` from vLLM's prompt log-probs.

    `rows[j]` maps token id -> (rank, log-prob) at position j (None at j=0): vLLM reports the
    top-k (ranks 1..k) and the actual token at its own rank. A position whose row lacks the
    actual token means the server tokenised or scored something else: an error, not a guess.
    """
    positions = range(len(token_ids) - num_response_tokens, len(token_ids))
    missing = [j for j in positions if rows[j] is None or token_ids[j] not in rows[j]]
    if missing:
        raise ValueError(f"prompt log-probs lack the scored token at position(s) {missing[:5]} of {len(token_ids)}: "
                         f"the server did not score these exact token ids")
    logprobs = tuple(rows[j][token_ids[j]][1] for j in positions)
    if not top_k:
        return TokenScores(logprobs)
    # Exactly k per position: ties at rank k can list one more (cut), a short row is padded (-1, 0).
    ranked = [sorted((rank, token, lp) for token, (rank, lp) in rows[j].items() if rank <= top_k)[:top_k]
              for j in positions]
    padded = [r + [(top_k + 1, -1, 0.0)] * (top_k - len(r)) for r in ranked]
    return TokenScores(logprobs, tuple(tuple(t for _, t, _ in r) for r in padded),
                       tuple(tuple(lp for _, _, lp in r) for r in padded))


class TeacherBackend(Protocol):
    """Per-token log-probs of responses under a teacher model."""

    def score(self, requests: list[ScoreRequest], top_k: int = 0) -> list[TokenScores]:
        """One TokenScores per request; with top_k > 0 also the teacher's top-k at each response position."""
        ...


class HFTeacherBackend:
    """A transformers causal LM; requests are packed into forward passes under a token budget."""

    def __init__(self, model, pad_token_id: int, max_batch_tokens: int = 16384) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.max_batch_tokens = max_batch_tokens

    @torch.no_grad()
    def score(self, requests: list[ScoreRequest], top_k: int = 0) -> list[TokenScores]:
        def length(i: int) -> int:
            return len(requests[i].prompt_ids) + len(requests[i].response_ids)

        # Longest first, so each batch's padded width is its first request's length.
        batches: list[list[int]] = []
        for i in sorted(range(len(requests)), key=length, reverse=True):
            if batches and length(batches[-1][0]) * (len(batches[-1]) + 1) <= self.max_batch_tokens:
                batches[-1].append(i)
            else:
                batches.append([i])
        out: list[TokenScores] = [TokenScores(())] * len(requests)
        for batch in batches:
            self._score_batch([requests[j] for j in batch], batch, out, top_k)
        return out

    def _score_batch(self, requests: list[ScoreRequest], indices: list[int], out: list, top_k: int) -> None:
        seqs = [list(r.prompt_ids) + list(r.response_ids) for r in requests]
        width = max(len(s) for s in seqs)
        device = next(self.model.parameters()).device
        ids = torch.full((len(seqs), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, s in enumerate(seqs):
            ids[row, :len(s)] = torch.tensor(s)
            mask[row, :len(s)] = 1
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
        logp = logp_all.gather(-1, ids[:, 1:, None].to(device)).squeeze(-1).cpu()
        topk = logp_all.topk(top_k, dim=-1) if top_k else None
        for row, (r, i) in enumerate(zip(requests, indices)):
            start, stop = len(r.prompt_ids) - 1, len(r.prompt_ids) - 1 + len(r.response_ids)
            out[i] = TokenScores(
                tuple(logp[row, start:stop].tolist()),
                None if topk is None else tuple(map(tuple, topk.indices[row, start:stop].cpu().tolist())),
                None if topk is None else tuple(map(tuple, topk.values[row, start:stop].cpu().tolist())))


class VLLMTeacherBackend:
    """vLLM prompt log-probs over teacher prompt + student response (actors.vllm_engine.VLLMEngine)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def score(self, requests: list[ScoreRequest], top_k: int = 0) -> list[TokenScores]:
        outputs = self.engine.prompt_logprobs([list(r.prompt_ids) + list(r.response_ids) for r in requests], top_k)
        return [scores_from_prompt_logprobs(ids, rows, len(r.response_ids), top_k)
                for (ids, rows), r in zip(outputs, requests)]
