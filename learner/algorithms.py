"""Algorithms (docs/algorithms.md §2-3): one registered `Algorithm` object per name.

An algorithm says everything the rest of the system asks of it: the group-end stages a
rollout worker runs on each finished group before the buffer (advantages, turn selection,
teacher scoring, later a judge), its token-level loss, and its gauges per learner step.
The driver, the workers and the learner look it up by `learner.algorithm.name`; adding
one is a loss function plus one `register_algorithm` call.

Every loss sees a `TokenBatch` of padded [num_sequences, num_tokens] tensors where position
t holds token t; `logprobs[:, t]` is the current policy's log-prob of token t (from the
logits at t-1) and `loss_mask` marks trained response tokens. Losses return a *sum* over
the micro-batch plus the number of units it averages over, so the learner can normalise by
the global count across micro-batches and ranks (token-mean: tokens; seq-mean: sequences).

Importance ratio r_t = pi_theta(y_t) / mu(y_t), with mu the engine's behaviour log-probs;
PPO clip min(r A, clip(r, 1-eps_lo, 1+eps_hi) A); with `tis_cap` the ratio is first
truncated at that value (bounding the weight of very stale or mismatched tokens). The
rollout/trainer mismatch corrections (docs/algorithms.md §6) are options of the same clip:
`decoupled` (the clip measured from the proximal policy, the behaviour weight apart),
`seq_mask_band` (sequence-level masked IS) and `token_mask_band` (IcePop).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Annotated, Any, Awaitable, Callable, Literal, Protocol

import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from buffer.contracts import Trajectory
from learner.curriculum import TCODConfig, TCODCurriculum, horizon
from learner.retirement import RetirementConfig, retirement_schedule


DEFAULT_ALGORITHM = "opd"


class AlgorithmConfig(BaseModel):
    """Base of every algorithm's config section (`learner.algorithm`): `name` selects the
    registered algorithm, whose `config_cls` (this class or a subclass with the algorithm's own
    knobs) validates the section; the knobs here are the loss terms the algorithms share."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = DEFAULT_ALGORITHM
    """A registered algorithm: grpo, grpo_window, turn_level, turn_judge, opd, joint, sft, tcod, retire_opd, or one
    added with `register_algorithm`."""
    clip_eps_low: float = Field(default=0.2, ge=0)
    clip_eps_high: float = Field(default=0.28, ge=0)
    tis_cap: float | None = Field(default=None, gt=1.0)
    """Truncate importance ratios at this value (None: no truncation); with `decoupled`, the
    behaviour weight pi_prox/mu."""
    decoupled: bool = False
    """AReaL's decoupled objective: the PPO clip is measured from the proximal policy pi_prox
    (the learner's own weights at this step) instead of the behaviour policy mu, and the
    staleness and engine mismatch enter apart, as the constant weight pi_prox/mu per token.
    One optimizer step per batch: pi_prox is pi_theta's value in the same forward pass."""
    seq_mask_band: tuple[float, float] | None = None
    """Sequence-level masked importance sampling: a training sequence whose geometric-mean ratio
    exp(mean_t log pi_theta/mu) over its trained tokens leaves [low, high] is left out of the
    loss (e.g. [0.5, 2.0]); None: off."""
    token_mask_band: tuple[float, float] | None = None
    """IcePop: a token whose ratio pi_theta/mu lies outside [low, high] is left out of the loss
    (e.g. [0.5, 2.0]); None: off."""
    aggregation: Literal["token_mean", "seq_mean"] = "token_mean"
    opd_scale: float = Field(default=1.0, ge=0)
    """Scale of the OPD token advantage (teacher - behaviour log-prob). 0 with `topk_kl_coef` > 0
    trains the forward KL to the teacher's top-k alone: with the oracle teacher, DAgger (SFT
    toward the bot's action at every state the student reached)."""
    topk_kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the forward KL to the teacher's top-k at each response token, added to the loss
    (needs teacher.top_k > 0); 0: off."""
    opd_advantage_clip: float | None = Field(default=5.0, gt=0)
    """Bound |A_t| of the OPD token advantage, in nats (None: unbounded). A token the teacher finds
    near-impossible (the oracle's log(ε/V) for a response that leaves every valid call, about
    -14; a served teacher's log-prob of a token outside its nucleus, -20 or lower) otherwise
    outweighs every other token of the batch; bounded, it still says "less of this" at full
    strength without swamping the tokens that choose the action. The default 5 leaves every
    advantage of a teacher and student that roughly agree (|A| of a few nats) untouched."""
    opd_format_coef: float = Field(default=0.0, ge=0)
    """OPD + format reward (document 000 v3.1.2): this times the token's turn format term (strict:
    the episode's ±0.5 on every turn; gentle: the turn's own -0.1) is added to its OPD advantage,
    after the bound; 0: off."""
    drop_zero_variance_groups: bool = True
    """Groups whose rewards are all equal carry no GRPO signal (DAPO): grpo drops them. A loss
    with a teacher term (joint, retire_opd) never drops a group: such a group's advantage is 0
    (out of the GRPO term) and its OPD term trains on it."""

    @field_validator("seq_mask_band", "token_mask_band")
    @classmethod
    def _band(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0 < value[0] < 1 < value[1]:
            raise ValueError(f"a ratio band [low, high] needs 0 < low < 1 < high, got {list(value)}")
        return value

    @field_validator("name")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {value!r}; known algorithms: {sorted(ALGORITHMS)}")
        return value

    def miniature(self, model_teacher: bool) -> "AlgorithmConfig":
        """The section for a preset's miniature (jobs/miniature.py), whose tiny teacher (a model
        one when `model_teacher`) stands in for the preset's: unchanged unless the algorithm
        needs a fact about that teacher."""
        return self

    @model_validator(mode="after")
    def _some_opd_term(self) -> "AlgorithmConfig":
        if self.opd_scale == 0 and not self.topk_kl_coef:
            raise ValueError("opd_scale: 0 leaves no teacher term: set topk_kl_coef > 0 (forward KL to the "
                             "teacher's top-k) or opd_scale > 0")
        return self

    @model_validator(mode="after")
    def _own_class(self) -> "AlgorithmConfig":
        expected = ALGORITHMS[self.name].config_cls
        if not isinstance(self, expected):
            raise ValueError(f"algorithm {self.name!r} is configured by {expected.__name__}, not "
                             f"{type(self).__name__} (parse_algorithm_config picks the class from a mapping)")
        return self


class JointConfig(AlgorithmConfig):
    """joint: L_GRPO + λ L_OPD."""

    opd_lambda: float = Field(default=0.01, ge=0)
    """λ of the joint loss L_GRPO + λ L_OPD."""


class RetireOPDConfig(JointConfig):
    """retire_opd: the joint loss until the retirement rule fires, GRPO alone after it."""

    retirement: RetirementConfig = RetirementConfig()
    """When the teacher retires."""

    def miniature(self, model_teacher: bool) -> "RetireOPDConfig":
        # A tiny model teacher's success is neither built nor measured: the rule needs one.
        if model_teacher and self.retirement.teacher_success is None:
            return self.model_copy(update={"retirement": self.retirement.model_copy(update={"teacher_success": 1.0})})
        return self


class TurnLevelConfig(AlgorithmConfig):
    """turn_level, turn_judge: a few turns of each episode trained on their own rewards."""

    turn_level_k: int = Field(default=4, ge=1)
    """Turns trained (and judged) per episode, chosen at random."""


class WindowConfig(AlgorithmConfig):
    """grpo_window: GRPO's loss, each episode's group the episodes of its kind that ended before it."""

    window: int = Field(default=8, ge=2)
    """G of the sliding group: the episode and the `window` - 1 episodes with its key that ended
    before it on the same rollout worker."""
    window_key: Literal["task_type", "all"] = "task_type"
    """Which episodes share a sliding group: those of the same task type, or all."""


class TCODAlgorithmConfig(AlgorithmConfig):
    """tcod: OPD over a horizon that grows with training."""

    tcod: TCODConfig = TCODConfig()
    """The horizon curriculum (F2B or B2F)."""


def parse_algorithm_config(value: Any) -> AlgorithmConfig:
    """A mapping (or an AlgorithmConfig) as the config class its `name` registered: each
    algorithm's section holds the shared loss knobs and its own, nothing else."""
    if isinstance(value, AlgorithmConfig):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"learner.algorithm must be a mapping with a `name` (one of {sorted(ALGORITHMS)}), "
                         f"got {value!r}")
    name = value.get("name", DEFAULT_ALGORITHM)
    if not isinstance(name, str):
        raise ValueError(f"learner.algorithm.name must be a string (one of {sorted(ALGORITHMS)}), got {name!r}")
    if name not in ALGORITHMS:
        raise ValueError(f"learner.algorithm.name: unknown algorithm {name!r}; known algorithms: {sorted(ALGORITHMS)}")
    config_cls = ALGORITHMS[name].config_cls
    # Another algorithm's knob, left by an override that switched `name` alone: say how to switch.
    owners = {key: [n for n, a in sorted(ALGORITHMS.items()) if key in a.config_cls.model_fields]
              for key in sorted(set(value) - set(config_cls.model_fields))}
    foreign = [f"{key} (a knob of {', '.join(names)})" for key, names in owners.items() if names]
    if foreign:
        raise ValueError(f"learner.algorithm.name={name} has no {', '.join(foreign)}; to switch algorithms, give "
                         f"the whole section, e.g. learner.algorithm={{name: {name}}}")
    return config_cls.model_validate({**value, "name": name})


def switch_algorithm(cfg: AlgorithmConfig, name: str, **knobs: Any) -> AlgorithmConfig:
    """`cfg` as algorithm `name`: the knobs `cfg` shares with that algorithm's section carried over
    (e.g. the clip and advantage bound of a retire_opd config for its never-retire arm), `knobs` set."""
    fields = ALGORITHMS[name].config_cls.model_fields
    carried = {key: value for key, value in cfg.model_dump().items() if key in fields}
    return parse_algorithm_config({**carried, **knobs, "name": name})


AlgorithmSection = Annotated[SerializeAsAny[AlgorithmConfig], BeforeValidator(parse_algorithm_config)]
"""The type of a config field that holds an algorithm section (dumps every field of the subclass)."""


@dataclass
class TokenBatch:
    """A micro-batch of padded training sequences."""

    input_ids: torch.Tensor
    """Token ids, long [N, T]."""
    attention_mask: torch.Tensor
    """1 on real tokens, long [N, T]."""
    loss_mask: torch.Tensor
    """True on trained response tokens, bool [N, T]."""
    behaviour_logprobs: torch.Tensor
    """Engine log-prob of each response token, float [N, T]."""
    teacher_logprobs: torch.Tensor | None
    """Teacher log-prob of each response token, float [N, T]; None if unscored."""
    advantages: torch.Tensor
    """Episode advantage per response token, float [N, T]."""
    turn_rewards: torch.Tensor
    """Turn reward per response token, float [N, T]."""
    staleness: torch.Tensor
    """Learner version minus the token's policy version, long [N, T] (0 off the response)."""
    turn_index: torch.Tensor | None = None
    """Turn of the episode each response token belongs to, long [N, T], -1 off the response."""
    teacher_topk_ids: torch.Tensor | None = None
    """Teacher's top-k candidates for each token, long [N, T, k], -1 where none; None if not scored so."""
    teacher_topk_logprobs: torch.Tensor | None = None
    """Their teacher log-probs, float [N, T, k]."""
    episode_ids: tuple[str, ...] = ()
    """The episode (trajectory id) of each row, [N]."""


@dataclass
class LossOutput:
    loss_sum: torch.Tensor
    """Differentiable sum to be divided by the global `num_units`."""
    num_units: float
    """Tokens (token_mean) or sequences (seq_mean) this micro-batch contributes."""
    stats: dict[str, float]
    """Sums of diagnostics over loss tokens (divided by the global token count by the caller)."""


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str) -> tuple[torch.Tensor, float]:
    maskf = mask.float()
    if how == "token_mean":
        return (per_token * maskf).sum(), float(maskf.sum())
    per_seq = (per_token * maskf).sum(-1) / maskf.sum(-1).clamp(min=1)
    has = maskf.sum(-1) > 0
    return per_seq[has].sum(), float(has.sum())


def _kept(log_ratio: torch.Tensor, mask: torch.Tensor, cfg: AlgorithmConfig) -> torch.Tensor:
    """The trained tokens the mismatch masks keep, bool [N, T]; `log_ratio` log pi_theta/mu [N, T]."""
    keep = mask.clone()
    if cfg.token_mask_band is not None:
        low, high = cfg.token_mask_band
        keep &= (log_ratio >= math.log(low)) & (log_ratio <= math.log(high))
    if cfg.seq_mask_band is not None:
        low, high = cfg.seq_mask_band
        mean = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # log of the geometric mean, [N]
        keep &= ((mean >= math.log(low)) & (mean <= math.log(high)))[:, None]
    return keep


def _clipped(logprobs: torch.Tensor, batch: TokenBatch, adv: torch.Tensor, cfg: AlgorithmConfig):
    mask = batch.loss_mask
    log_ratio = (logprobs - batch.behaviour_logprobs).clamp(-20, 20)
    behaviour = torch.exp(log_ratio.detach())  # pi_theta/mu: with one step per batch also pi_prox/mu
    keep = _kept(log_ratio.detach(), mask, cfg)
    capped = behaviour if cfg.tis_cap is None else behaviour.clamp(max=cfg.tis_cap)
    if cfg.decoupled:
        weight = capped
        ratio = torch.exp(logprobs - logprobs.detach())  # pi_theta/pi_prox: 1 in value, grad log pi_theta
    else:
        weight = torch.ones_like(behaviour)
        ratio = torch.exp(log_ratio)
        if cfg.tis_cap is not None:
            ratio = ratio.clamp(max=cfg.tis_cap)
    clipped = ratio.clamp(1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    # Masked tokens train nothing but keep their place in the mean (the loss's units are unchanged).
    per_token = -weight * torch.minimum(ratio * adv, clipped * adv) * keep
    was_clipped = ((ratio * adv) > (clipped * adv)) & keep
    stats = {"clip_frac": float(was_clipped.sum()),
             # k3 estimate of KL(behaviour || policy): the trainer/engine mismatch on fresh samples.
             "mismatch_kl": float(((torch.exp(-log_ratio) - 1 + log_ratio) * mask).sum().detach()),
             "ratio_mean": float((behaviour * mask).sum()),
             "ratio_max": float(behaviour[mask].max()) if mask.any() else 0.0,
             "masked_frac": float((mask & ~keep).sum()),
             "truncated_frac": float(((behaviour > capped) & keep).sum())}
    return per_token, stats


def grpo_loss(logprobs: torch.Tensor, batch: TokenBatch, cfg: AlgorithmConfig) -> LossOutput:
    per_token, stats = _clipped(logprobs, batch, batch.advantages, cfg)
    loss, units = _aggregate(per_token, batch.loss_mask, cfg.aggregation)
    return LossOutput(loss, units, stats)


def turn_level_loss(logprobs: torch.Tensor, batch: TokenBatch, cfg: AlgorithmConfig) -> LossOutput:
    per_token, stats = _clipped(logprobs, batch, batch.turn_rewards, cfg)
    loss, units = _aggregate(per_token, batch.loss_mask, cfg.aggregation)
    return LossOutput(loss, units, stats)


def opd_advantages(batch: TokenBatch, cfg: AlgorithmConfig) -> torch.Tensor:
    if batch.teacher_logprobs is None:
        raise ValueError("OPD needs teacher log-probs on every sample: is the teacher service on?")
    adv = cfg.opd_scale * (batch.teacher_logprobs - batch.behaviour_logprobs)
    if cfg.opd_advantage_clip is not None:
        adv = adv.clamp(-cfg.opd_advantage_clip, cfg.opd_advantage_clip)
    if cfg.opd_format_coef:  # the played episode's turn rewards are its format terms (envs/rewards.py)
        adv = adv + cfg.opd_format_coef * batch.turn_rewards
    return adv * batch.loss_mask


def opd_loss(logprobs: torch.Tensor, batch: TokenBatch, cfg: AlgorithmConfig) -> LossOutput:
    adv = opd_advantages(batch, cfg)
    per_token, stats = _clipped(logprobs, batch, adv, cfg)
    loss, units = _aggregate(per_token, batch.loss_mask, cfg.aggregation)
    # Single-sample reverse KL(student || teacher) on the sampled tokens.
    stats["reverse_kl"] = float(((batch.behaviour_logprobs - batch.teacher_logprobs) * batch.loss_mask).sum())
    return LossOutput(loss, units, stats)


def joint_loss(logprobs: torch.Tensor, batch: TokenBatch, cfg: JointConfig) -> LossOutput:
    g = grpo_loss(logprobs, batch, cfg)
    if cfg.opd_lambda == 0.0:
        return g
    o = opd_loss(logprobs, batch, cfg)
    return LossOutput(g.loss_sum + cfg.opd_lambda * o.loss_sum, g.num_units,
                      {**g.stats, "reverse_kl": o.stats["reverse_kl"]})


def forward_kl_topk(student_topk: torch.Tensor, batch: TokenBatch, cfg: AlgorithmConfig) -> LossOutput:
    """KL(q || π_θ) at each response token over the teacher's top-k, q the teacher's top-k
    distribution renormalised; `student_topk` [N, T, k] holds log π_θ of the same ids.

    Unlike the sampled-token OPD term, it raises the teacher's preferred tokens where the student
    sampled something else. Positions without candidates contribute 0 (same units as the main loss).
    """
    if batch.teacher_topk_ids is None:
        raise ValueError("topk_kl_coef > 0 needs the teacher's top-k on every sample: set teacher.top_k")
    valid = batch.teacher_topk_ids >= 0
    teacher = batch.teacher_topk_logprobs.masked_fill(~valid, float("-inf"))
    has = valid.any(-1) & batch.loss_mask
    q_log = torch.log_softmax(teacher.masked_fill(~has[..., None], 0.0), dim=-1)
    q = q_log.exp() * valid
    per_token = (q * (q_log.masked_fill(~valid, 0.0) - student_topk.masked_fill(~valid, 0.0))).sum(-1) * has
    loss, units = _aggregate(per_token, batch.loss_mask, cfg.aggregation)
    return LossOutput(loss, units, {"topk_kl": float(per_token.detach().sum())})


def sft_loss(logprobs: torch.Tensor, batch: TokenBatch, cfg: AlgorithmConfig) -> LossOutput:
    loss, units = _aggregate(-logprobs, batch.loss_mask, cfg.aggregation)
    return LossOutput(loss, units, {})


GroupStage = Callable[[list[Trajectory]], Awaitable[list[Trajectory]]]
"""One step of a worker's group-end pipeline: a finished group's trajectories in, the group to
store out (an empty list drops the group: it carries no signal)."""


@dataclass(frozen=True)
class StageContext:
    """What a rollout worker offers the stages it builds."""

    worker_index: int
    score: GroupStage | None = None
    """The worker's teacher service (trajectories with teacher log-probs); None without a teacher."""
    judge: GroupStage | None = None
    """The job's judge service (trajectories with judged turn rewards); None without a judge."""


StageFactory = Callable[[AlgorithmConfig, StageContext], GroupStage]
LossFn = Callable[[torch.Tensor, TokenBatch, AlgorithmConfig], LossOutput]


def _stage(fn: Callable[[list[Trajectory], AlgorithmConfig, StageContext], list[Trajectory]]) -> StageFactory:
    """A synchronous stage (pure per-group computation) as a StageFactory."""

    def factory(cfg: AlgorithmConfig, ctx: StageContext) -> GroupStage:
        async def stage(trajectories: list[Trajectory]) -> list[Trajectory]:
            return fn(trajectories, cfg, ctx)
        return stage

    factory.__name__ = fn.__name__
    return factory


def _group_scores(rewards: list[float]) -> list[float] | None:
    """(R - mean) / (std + 1e-6) of each reward over the list; None when every reward is equal."""
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if std < 1e-8:
        # Exactly no signal, not the rounding error of the mean over 1e-6.
        return None
    return [(r - mean) / (std + 1e-6) for r in rewards]


def group_advantages(trajectories: list[Trajectory], drop_flat: bool) -> list[Trajectory]:
    """GRPO advantages A = (R - mean) / (std + 1e-6) over one group's episodes.

    Returns the group with `advantage` set; an empty list when every reward is equal and
    `drop_flat` is set (such a group carries no GRPO signal, as in DAPO).
    """
    scores = _group_scores([t.outcome_reward + t.format_reward for t in trajectories])
    if scores is None:
        return [] if drop_flat else [dataclasses.replace(t, advantage=0.0) for t in trajectories]
    return [dataclasses.replace(t, advantage=a) for t, a in zip(trajectories, scores)]


class SlidingGroups:
    """grpo_window's baseline (docs/algorithms.md §3): an episode's group is itself and the last
    `window` - 1 episodes with its key to end before it, and its advantage GRPO's formula over
    that group, so no episode waits for others to end. The state is one rollout worker's and goes
    with it: a restarted worker's first episodes of each key have smaller groups."""

    def __init__(self, window: int, key: Literal["task_type", "all"]) -> None:
        self.key = key
        self.past: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window - 1))
        """The rewards of the last `window` - 1 episodes ended per key, oldest first."""

    def advantage(self, trajectory: Trajectory) -> float | None:
        """The episode's advantage (None: every reward of its group is equal); the episode then joins
        the groups of the episodes after it."""
        past = self.past[trajectory.task_type if self.key == "task_type" else ""]
        reward = trajectory.outcome_reward + trajectory.format_reward
        scores = _group_scores([*past, reward])
        past.append(reward)
        return None if scores is None else scores[-1]


def window_advantages(cfg: WindowConfig, ctx: StageContext) -> GroupStage:
    """Sliding-group advantages; an episode whose group's rewards all agree is dropped when
    `drop_zero_variance_groups` (its advantage would be 0), as GRPO drops a flat group."""
    groups = SlidingGroups(cfg.window, cfg.window_key)

    async def stage(trajectories: list[Trajectory]) -> list[Trajectory]:
        scored = [(t, groups.advantage(t)) for t in trajectories]
        return [dataclasses.replace(t, advantage=a or 0.0) for t, a in scored
                if a is not None or not cfg.drop_zero_variance_groups]
    return stage


def select_turns(trajectory: Trajectory, k: int, seed: int) -> Trajectory:
    """turn_level: keep k environment steps trainable, chosen by a RNG seeded from the trajectory
    id; a step's working-memory turn goes with its action."""
    steps = trajectory.env_steps()
    num_steps = steps[-1] + 1 if steps else 0
    if num_steps <= k:
        return trajectory
    keep = set(random.Random(f"{seed}:{trajectory.trajectory_id}").sample(range(num_steps), k))
    turns = tuple(dataclasses.replace(t, trainable=t.trainable and step in keep)
                  for step, t in zip(steps, trajectory.turns))
    return dataclasses.replace(trajectory, turns=turns)


@_stage
def grpo_advantages(trajectories, cfg, ctx):
    """Group advantages; groups without reward variance dropped when `drop_zero_variance_groups`."""
    return group_advantages(trajectories, cfg.drop_zero_variance_groups)


@_stage
def joint_advantages(trajectories, cfg, ctx):
    """Group advantages for a loss with a teacher term beside GRPO's: no group is dropped. A group
    without reward variance (all episodes failed, say) has advantage 0, so it is out of the GRPO
    term only, and its tokens still get the dense OPD term, where the teacher's signal matters
    most (docs/algorithms.md §3)."""
    return group_advantages(trajectories, drop_flat=False)


@_stage
def episode_advantages(trajectories, cfg, ctx):
    """Group advantages (diagnostics for algorithms that do not train on them); no group dropped."""
    return group_advantages(trajectories, drop_flat=False)


@_stage
def successes_only(trajectories, cfg, ctx):
    """The successful episodes (behaviour cloning copies what it is shown; the warm start keeps
    the same)."""
    return [t for t in trajectories if t.success]


@_stage
def turn_selection(trajectories, cfg, ctx):
    return [select_turns(t, cfg.turn_level_k, ctx.worker_index) for t in trajectories]


@_stage
def outcome_turn_rewards(trajectories, cfg, ctx):
    """turn_level without a judge (document 000 v2.3): each trainable turn's reward is the
    episode's outcome plus the turn's format term (the played episode holds only the latter)."""
    return [dataclasses.replace(t, turns=tuple(
        dataclasses.replace(turn, turn_reward=t.outcome_reward + turn.turn_reward) if turn.trainable else turn
        for turn in t.turns)) for t in trajectories]


def teacher_scores(cfg: AlgorithmConfig, ctx: StageContext) -> GroupStage:
    """Teacher log-probs (and top-k) on every turn, from the worker's teacher service."""
    if ctx.score is None:
        raise ValueError(f"algorithm {cfg.name!r} needs a teacher: set the teacher section")
    return ctx.score


def judge_rewards(cfg: AlgorithmConfig, ctx: StageContext) -> GroupStage:
    """Judged rewards on the trainable turns, from the job's judge service (judge/service.py)."""
    if ctx.judge is None:
        raise ValueError(f"algorithm {cfg.name!r} needs a judge: set the judge section")
    return ctx.judge


@dataclass(frozen=True)
class Gauge:
    """One number an algorithm reports per learner step: the driver records it in the step
    record's `gauges` map (jobs/records.py) and exports it as `apprentice_<name>`; the report
    draws it in schedule.png, TensorBoard under schedule/gauges/."""

    name: str
    label: str
    """A few words for a figure's legend."""
    help: str
    """What it measures (the Prometheus help text)."""
    value: Callable[[AlgorithmConfig, int], float]
    """(the loss config the step trained with, the main-loop step) -> the value."""


def opd_lambda(value: Callable[[AlgorithmConfig, int], float]) -> Gauge:
    """λ, the weight of the OPD term in the loss the step trained with (0 once a schedule stops the teacher)."""
    return Gauge("opd_lambda", "OPD λ", "λ: the weight of the OPD term in the loss.", value)


@dataclass(frozen=True)
class Algorithm:
    """What one algorithm asks of the system."""

    loss: LossFn
    stages: tuple[StageFactory, ...] = ()
    """Group-end stages, in order, run by the rollout worker on each finished group."""
    gauges: tuple[Gauge, ...] = ()
    """Numbers it reports per learner step (the current λ, TCOD's horizon)."""
    curriculum: Callable[[AlgorithmConfig], TCODCurriculum] | None = None
    """Builds the per-episode plan a rollout worker follows (the TCOD horizon); None: every
    episode is the student's, up to the loop's turn limit."""
    schedule: "ScheduleFactory | None" = None
    """The algorithm's run-long control of its teacher (RetireOPD's retirement rule), built once
    per run by the driver, which calls its hooks at fixed points (`TeacherSchedule`); None: the
    teacher, when the stages use one, serves the whole run with the configured loss."""
    segment_stages: tuple[StageFactory, ...] | None = None
    """Stages run on segments of running episodes (`RolloutConfig.segments`): each sees every
    turn so far and no outcome yet. None: the loss needs finished episodes (a reward, a group
    baseline), so the algorithm cannot be delivered in segments."""
    config_cls: type[AlgorithmConfig] = AlgorithmConfig
    """Validates the algorithm's `learner.algorithm` section: the shared knobs and its own."""
    episode_groups: bool = False
    """Each episode is a group of its own (`rollout.group_size` must be 1): its stages need no other
    episode of its task (grpo_window's baseline comes from the episodes that ended before it)."""
    flat_streak_scale: Callable[[AlgorithmConfig], int] = lambda cfg: 1
    """How many flat groups in a row count as one toward `run.max_groups_without_signal`: 1 where
    each group's verdict is its own; grpo_window's `window`, whose consecutive episodes share all but
    one reward of their groups (32 flat episodes in a row are about 4 flat groups of 8)."""
    demonstrations: bool = False
    """The rollout workers play the environment's expert instead of the model, its calls in the
    student's token format with the current weights' version (`actors.expert.DemonstrationPolicy`):
    the loss learns from demonstrations collected as the run goes (sft: behaviour cloning for a
    whole run, the SFT-only arm of a comparison). Evaluations still play the model."""

    behaviour_free: Callable[[AlgorithmConfig], bool] = lambda cfg: False
    """Whether the loss with these knobs ignores which policy sampled a sample (no advantage, no
    importance ratio: the top-k term alone): a sample then stays exact training data at any age,
    and the main loop may train it again (jobs.aggregate's replay)."""

    def group_stages(self, cfg: AlgorithmConfig) -> tuple[StageFactory, ...]:
        """`stages`, plus teacher scoring when the top-k term is on (it needs the teacher's top-k)."""
        return _with_topk_scoring(self.stages, cfg)

    def segment_stage_factories(self, cfg: AlgorithmConfig) -> tuple[StageFactory, ...]:
        """`segment_stages`, plus teacher scoring when the top-k term is on."""
        if self.segment_stages is None:
            raise ValueError(f"algorithm {cfg.name!r} trains on finished episodes (rewards or a group baseline): "
                             f"rollout.segments needs an algorithm without them (opd, tcod)")
        return _with_topk_scoring(self.segment_stages, cfg)

    def step_loss(self, logprobs: torch.Tensor, student_topk: torch.Tensor | None, batch: TokenBatch,
                  cfg: AlgorithmConfig) -> LossOutput:
        """`loss`, plus topk_kl_coef · the forward KL over the teacher's top-k when that term is on
        (`student_topk`: log π_θ of the teacher's top-k ids [N, T, k], asked for when `cfg.topk_kl_coef`)."""
        out = self.loss(logprobs, batch, cfg)
        if not cfg.topk_kl_coef:
            return out
        kl = forward_kl_topk(student_topk, batch, cfg)
        return LossOutput(out.loss_sum + cfg.topk_kl_coef * kl.loss_sum, out.num_units, {**out.stats, **kl.stats})

    def gauge_values(self, cfg: AlgorithmConfig, step: int) -> dict[str, float]:
        """Each gauge's value at main-loop step `step`, trained with the loss config `cfg`."""
        return {gauge.name: gauge.value(cfg, step) for gauge in self.gauges}

    def uses_teacher(self, cfg: AlgorithmConfig) -> bool:
        return teacher_scores in self.group_stages(cfg)

    def uses_judge(self, cfg: AlgorithmConfig) -> bool:
        return judge_rewards in self.group_stages(cfg)


class TeacherSchedule(Protocol):
    """What an algorithm decides about its teacher over a run. The driver keeps one per run,
    saves `state_dict` in every checkpoint and hands it back on a resume or a recovery, and:
    starts teacher services only while `teacher_active`; trains each step with `loss_config`;
    calls `after_step` once per learner step (with the evaluation's success on evaluation
    steps); and, when that returns True, stops the teacher for good: its services end, the
    workers drop the scoring stage, and the teacher's bundles run extra rollout workers."""

    def teacher_active(self) -> bool:
        ...

    def loss_config(self, cfg: AlgorithmConfig, step: int) -> AlgorithmConfig:
        """The loss the learner trains with at main-loop step `step` (after the warm start)."""
        ...

    def after_step(self, version: int, reverse_kl: float, eval_success: float | None) -> bool:
        """One learner step's sampled-token reverse KL, and its eval success when it evaluated;
        True exactly once: the teacher is done from this version on."""
        ...

    def state_dict(self) -> dict[str, Any]:
        ...


ScheduleFactory = Callable[[AlgorithmConfig, Callable[[], float], "dict[str, Any] | None"], TeacherSchedule]
"""(config, teacher_success, state) -> the run's schedule: `state` is what a checkpoint saved (a
resume or a recovery), else None; `teacher_success()` measures the teacher's eval success SR_T
(costly: call it only when needed)."""


def topk_term_only(cfg: AlgorithmConfig) -> bool:
    """OPD's loss with no advantage (opd_scale 0, no format term): the forward KL to the teacher's
    top-k alone, which with the oracle teacher is DAgger's relabelling."""
    return cfg.opd_scale == 0 and not cfg.opd_format_coef


def _with_topk_scoring(stages: tuple[StageFactory, ...], cfg: AlgorithmConfig) -> tuple[StageFactory, ...]:
    if cfg.topk_kl_coef and teacher_scores not in stages:
        return stages + (teacher_scores,)
    return stages


ALGORITHMS: dict[str, Algorithm] = {}


def gauge_labels() -> dict[str, str]:
    """The registered algorithms' gauges' labels by name (the report's legend)."""
    return {gauge.name: gauge.label for algorithm in ALGORITHMS.values() for gauge in algorithm.gauges}


def register_algorithm(name: str, algorithm: Algorithm) -> None:
    if name in ALGORITHMS and ALGORITHMS[name] is not algorithm:
        raise ValueError(f"algorithm {name!r} is already registered")
    ALGORITHMS[name] = algorithm


register_algorithm("grpo", Algorithm(grpo_loss, (grpo_advantages,)))
register_algorithm("grpo_window", Algorithm(grpo_loss, (window_advantages,), config_cls=WindowConfig,
                                            episode_groups=True, flat_streak_scale=lambda cfg: cfg.window))
register_algorithm("turn_level", Algorithm(turn_level_loss,
                                           (turn_selection, outcome_turn_rewards, episode_advantages),
                                           config_cls=TurnLevelConfig))
register_algorithm("turn_judge", Algorithm(turn_level_loss, (turn_selection, judge_rewards, episode_advantages),
                                           config_cls=TurnLevelConfig))
register_algorithm("opd", Algorithm(opd_loss, (episode_advantages, teacher_scores),
                                    gauges=(opd_lambda(lambda cfg, step: 1.0),), segment_stages=(teacher_scores,),
                                    behaviour_free=topk_term_only))
register_algorithm("joint", Algorithm(joint_loss, (joint_advantages, teacher_scores),
                                      gauges=(opd_lambda(lambda cfg, step: cfg.opd_lambda),), config_cls=JointConfig))
register_algorithm("retire_opd", Algorithm(joint_loss, (joint_advantages, teacher_scores),
                                           gauges=(opd_lambda(lambda cfg, step: cfg.opd_lambda),),
                                           schedule=retirement_schedule, config_cls=RetireOPDConfig))
register_algorithm("sft", Algorithm(sft_loss, (successes_only,), demonstrations=True))
register_algorithm("tcod", Algorithm(opd_loss, (episode_advantages, teacher_scores),
                                     gauges=(opd_lambda(lambda cfg, step: 1.0),
                                             Gauge("horizon_k", "TCOD horizon k (turns)",
                                                   "TCOD's horizon k in force (turns; the document's k, "
                                                   "which may pass the loop's turn limit)",
                                                   lambda cfg, step: float(horizon(cfg.tcod, step)))),
                                     curriculum=lambda cfg: TCODCurriculum(cfg.tcod),
                                     segment_stages=(teacher_scores,), config_cls=TCODAlgorithmConfig,
                                     behaviour_free=topk_term_only))
