"""Sub-trajectory prefix expansion and packing (docs/algorithms.md §1).

An n-turn trajectory becomes n samples; sample k = (prompt of turn k exactly as the engine
saw it, response of turn k). Trained on separately, that costs O(n^2) tokens for a
full-history episode. When every prompt extends the previous prompt + response (the
history was not windowed or re-rendered differently), the n samples pack into one sequence
-- the last prompt + the last response -- with n loss-masked response segments: causal
attention gives each response token the same context, hence the same log-probs and
gradient, for O(n) tokens. `pack` detects when that does not hold and returns None; the
learner then trains on the expanded samples. Both forms are `TrainSequence`s.
"""

from __future__ import annotations

from dataclasses import dataclass

from buffer.contracts import Sample, Trajectory


def expand(trajectory: Trajectory) -> list[Sample]:
    """One sample per turn, in turn order."""
    return [
        Sample(
            trajectory_id=trajectory.trajectory_id, group_id=trajectory.group_id, split=trajectory.split,
            task_seed=trajectory.task_seed, task_type=trajectory.task_type, turn_index=turn.turn_index,
            num_turns=trajectory.num_turns, prompt_ids=turn.prompt_ids, response_ids=turn.response_ids,
            behaviour_logprobs=turn.behaviour_logprobs, policy_version=turn.policy_version,
            teacher_logprobs=turn.teacher_logprobs, trainable=turn.trainable, well_formed=turn.well_formed,
            turn_reward=turn.turn_reward, outcome_reward=trajectory.outcome_reward,
            format_reward=trajectory.format_reward, success=trajectory.success, horizon_k=trajectory.horizon_k,
            advantage=trajectory.advantage, finish_reason=turn.finish_reason,
            teacher_topk_ids=turn.teacher_topk_ids, teacher_topk_logprobs=turn.teacher_topk_logprobs,
        )
        for turn in trajectory.turns
    ]


@dataclass(frozen=True)
class TrainSequence:
    """One sequence for the learner, with per-token targets aligned to `token_ids`.

    Position t holds token t; `loss_mask[t]` says whether token t is a trained response
    token (its log-prob comes from the logits at position t-1).
    """

    token_ids: tuple[int, ...]
    """Tokens, shape [num_tokens]."""
    loss_mask: tuple[bool, ...]
    """True on response tokens of trainable turns, shape [num_tokens]."""
    turn_index: tuple[int, ...]
    """Turn each response token belongs to, -1 on context tokens, shape [num_tokens]."""
    behaviour_logprobs: tuple[float, ...]
    """Sampling log-prob on response tokens, 0 elsewhere, shape [num_tokens]."""
    teacher_logprobs: tuple[float, ...] | None
    """Teacher log-prob on response tokens, 0 elsewhere, shape [num_tokens]; None if any turn is unscored."""
    policy_version: tuple[int, ...]
    """Version that generated each response token, -1 elsewhere, shape [num_tokens]."""
    advantage: tuple[float, ...]
    """Episode advantage of the token's sample (0 if unset) on response tokens, 0 elsewhere, shape [num_tokens]."""
    turn_reward: tuple[float, ...]
    """Turn reward of the token's turn on response tokens, 0 elsewhere, shape [num_tokens]."""
    teacher_topk_ids: tuple[tuple[int, ...], ...] | None = None
    """Teacher top-k ids for the token at each position (response tokens), -1 elsewhere and on padding,
    shape [num_tokens, k]; None unless every turn has them."""
    teacher_topk_logprobs: tuple[tuple[float, ...], ...] | None = None
    """Their teacher log-probs, 0 where the id is -1, shape [num_tokens, k]."""
    trajectory_id: str = ""
    """The episode its turns come from (a sequence holds one episode's turns, or one turn)."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def _segments_sequence(token_ids: list[int], segments: list[tuple[int, Sample]]) -> TrainSequence:
    n = len(token_ids)
    mask, turn, behaviour, version = [False] * n, [-1] * n, [0.0] * n, [-1] * n
    advantage, turn_reward = [0.0] * n, [0.0] * n
    scored = all(s.teacher_logprobs is not None for _, s in segments)
    teacher = [0.0] * n if scored else None
    widths = {len(s.teacher_topk_ids[0]) if s.teacher_topk_ids else 0
              for _, s in segments if s.teacher_topk_ids is not None and s.response_ids}
    with_topk = all(s.teacher_topk_ids is not None for _, s in segments) and len(widths) == 1
    k = widths.pop() if with_topk else 0
    topk_ids = [(-1,) * k] * n if with_topk else None
    topk_lps = [(0.0,) * k] * n if with_topk else None
    for start, s in segments:
        for j, _ in enumerate(s.response_ids):
            p = start + j
            mask[p] = s.trainable
            turn[p] = s.turn_index
            behaviour[p] = s.behaviour_logprobs[j]
            version[p] = s.policy_version
            advantage[p] = s.advantage or 0.0
            turn_reward[p] = s.turn_reward
            if teacher is not None:
                teacher[p] = s.teacher_logprobs[j]
            if topk_ids is not None:
                topk_ids[p], topk_lps[p] = s.teacher_topk_ids[j], s.teacher_topk_logprobs[j]
    return TrainSequence(tuple(token_ids), tuple(mask), tuple(turn), tuple(behaviour),
                         None if teacher is None else tuple(teacher), tuple(version), tuple(advantage),
                         tuple(turn_reward), None if topk_ids is None else tuple(topk_ids),
                         None if topk_lps is None else tuple(topk_lps), segments[0][1].trajectory_id)


def sample_sequence(sample: Sample) -> TrainSequence:
    """A single expanded sample as a sequence: its prompt, then its loss-masked response."""
    return _segments_sequence(list(sample.prompt_ids) + list(sample.response_ids),
                              [(len(sample.prompt_ids), sample)])


def can_pack(samples: list[Sample]) -> bool:
    """True when each prompt starts with the previous prompt + response (one episode, in order)."""
    for prev, nxt in zip(samples, samples[1:]):
        if prev.trajectory_id != nxt.trajectory_id or nxt.turn_index != prev.turn_index + 1:
            return False
        head = len(prev.prompt_ids) + len(prev.response_ids)
        if len(nxt.prompt_ids) < head or nxt.prompt_ids[:head] != prev.prompt_ids + prev.response_ids:
            return False
    return True


def pack(samples: list[Sample]) -> TrainSequence | None:
    """Merge one episode's consecutive samples into one sequence, or None when they do not nest."""
    if not samples or not can_pack(samples):
        return None
    last = samples[-1]
    return _segments_sequence(list(last.prompt_ids) + list(last.response_ids),
                              [(len(s.prompt_ids), s) for s in samples])


def to_sequences(samples: list[Sample], packing: bool = True) -> list[TrainSequence]:
    """Training sequences for a batch: each episode's run of consecutive samples packed when possible."""
    if not packing:
        return [sample_sequence(s) for s in samples]
    runs: list[list[Sample]] = []
    for s in samples:
        if runs and runs[-1][-1].trajectory_id == s.trajectory_id and runs[-1][-1].turn_index + 1 == s.turn_index:
            runs[-1].append(s)
        else:
            runs.append([s])
    sequences = []
    for run in runs:
        packed = pack(run)
        sequences.extend([packed] if packed is not None else [sample_sequence(s) for s in run])
    return sequences
