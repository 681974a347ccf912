"""RetireOPD's retirement rule (docs/algorithms.md §5): when to stop distilling from the teacher.

At every evaluation step n the driver observes the teacher–student gap K_n (mean sampled-token
reverse KL on the student's training samples since the previous evaluation) and the student's
eval success SR_n. At each evaluation, window m is the last W evaluations and window m − 1 the
W before them; K̄ and SR are their means, and

    ρ_m = (K̄_m − K̄_{m−1}) / K̄_m          (≥ 0: the gap stopped shrinking)
    η_m = (SR_m + SR_{m−1}) / (2 · SR_T)    (the student reached a share of the teacher's success)

with SR_T the teacher's own success. The teacher retires at the first evaluation with two
windows behind it (the 2W-th on) where ρ_m ≥ δ and η_m ≥ γ: the document evaluates every H = 5
learner steps and checks the rule from the second monitoring window on. Retirement is permanent: its version is saved in the checkpoint and a resumed
run never starts the teacher again. Pure Python; the algorithm's `TeacherSchedule`
(learner/algorithms.py), which the driver calls without knowing RetireOPD.
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field


class RetirementConfig(BaseModel):
    """The retirement rule's constants (the seed's defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(default=3, ge=1)
    """W: evaluations per monitoring window; the rule compares the last W evaluations with the W
    before, at every evaluation from the 2W-th on. The document leaves W open; 3 (15 learner
    steps at its evaluation every H = 5 steps) lets the rule fire from step 30 on, at any
    evaluation, so the retirements it reports around steps 50-95 are reachable (docs/algorithms.md §5)."""
    gamma: float = Field(default=0.9, ge=0)
    """γ: share of the teacher's success the student must reach."""
    delta: float = 0.0
    """δ: the least relative growth of the gap (0: it stopped shrinking)."""
    teacher_success: float | None = Field(default=None, gt=0, le=1)
    """SR_T. None: measured at start-up by the environment's expert on the eval split (the
    oracle teacher); a model teacher needs it set (its success with privileged context)."""


class RetirementController:
    """Feeds on (gap, success) at each evaluation; says when to retire."""

    def __init__(self, config: RetirementConfig, teacher_success: float) -> None:
        if not 0 < teacher_success <= 1:
            raise ValueError(f"the teacher's success rate must be in (0, 1], got {teacher_success}")
        self.config = config
        self.teacher_success = teacher_success
        self.gaps: list[float] = []
        self.successes: list[float] = []
        self.retired_at: int | None = None
        """Learner version at which the teacher retired; None while it serves."""
        self.since_eval: list[float] = []
        """Reverse KL of the steps since the previous evaluation (K_n is their mean with the evaluation step's)."""

    # The TeacherSchedule hooks.
    def teacher_active(self) -> bool:
        return self.retired_at is None

    def loss_config(self, cfg, step: int):
        """After retirement λ = 0: no OPD or top-k term."""
        return cfg if self.retired_at is None else cfg.model_copy(update={"opd_lambda": 0.0, "topk_kl_coef": 0.0})

    def after_step(self, version: int, reverse_kl: float, eval_success: float | None) -> bool:
        self.since_eval.append(reverse_kl)
        if eval_success is None:
            return False
        gap, self.since_eval = sum(self.since_eval) / len(self.since_eval), []
        return self.observe(version, gap, eval_success)

    def observe(self, version: int, gap: float, success: float) -> bool:
        """One evaluation step; True exactly once, when the rule says retire. Checked at every
        evaluation once two windows of `window` evaluations exist (the document's "from the
        second monitoring window on"): window m is the last `window` evaluations, m - 1 the
        ones before, so the rule may fire at any evaluation, not only where a window ends."""
        if self.retired_at is not None:
            return False
        self.gaps.append(gap)
        self.successes.append(success)
        w = self.config.window
        if len(self.gaps) < 2 * w:
            return False
        mean_gap, previous_gap = _mean(self.gaps[-w:]), _mean(self.gaps[-2 * w:-w])
        rho = (mean_gap - previous_gap) / mean_gap if mean_gap else float("inf")
        eta = (_mean(self.successes[-w:]) + _mean(self.successes[-2 * w:-w])) / (2 * self.teacher_success)
        if rho >= self.config.delta and eta >= self.config.gamma:
            self.retired_at = version
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"gaps": list(self.gaps), "successes": list(self.successes), "retired_at": self.retired_at,
                "teacher_success": self.teacher_success, "since_eval": list(self.since_eval)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gaps, self.successes = list(state["gaps"]), list(state["successes"])
        self.retired_at = state["retired_at"]
        self.teacher_success = state["teacher_success"]
        self.since_eval = list(state["since_eval"])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def retirement_schedule(cfg, teacher_success: Callable[[], float], state: dict[str, Any] | None) -> RetirementController:
    """RetireOPD's TeacherSchedule: SR_T configured, or measured once (a resume reads it back)."""
    if state is not None:
        controller = RetirementController(cfg.retirement, state["teacher_success"])
        controller.load_state_dict(state)
        return controller
    if cfg.retirement.teacher_success is not None:
        return RetirementController(cfg.retirement, cfg.retirement.teacher_success)
    try:
        measured = teacher_success()
    except ValueError as exc:  # SR_T cannot be measured for this teacher: say where to set it
        raise ValueError(f"{exc}: set learner.algorithm.retirement.teacher_success") from None
    return RetirementController(cfg.retirement, measured)
