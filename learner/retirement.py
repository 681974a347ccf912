"""RetireOPD's retirement rule (docs/algorithms.md §5): when to stop distilling from the teacher.

At every evaluation step n the driver observes the teacher–student gap K_n (mean sampled-token
reverse KL on the student's training samples since the previous evaluation) and the student's
eval success SR_n. Evaluations group into windows of H; for window m, K̄_m and SR_m are the
window means, and

    ρ_m = (K̄_m − K̄_{m−1}) / K̄_m          (≥ 0: the gap stopped shrinking)
    η_m = (SR_m + SR_{m−1}) / (2 · SR_T)    (the student reached a share of the teacher's success)

with SR_T the teacher's own success. The teacher retires at the first m ≥ 2 with ρ_m ≥ δ
and η_m ≥ γ. Retirement is permanent: its version is saved in the checkpoint and a resumed
run never starts the teacher again. Pure Python; the algorithm's `TeacherSchedule`
(learner/algorithms.py), which the driver calls without knowing RetireOPD.
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field


class RetirementConfig(BaseModel):
    """The retirement rule's constants (the seed's defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(default=5, ge=1)
    """H: evaluation steps per monitoring window."""
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

    def gauges(self) -> dict[str, float]:
        return {"teacher_retired": float(self.retired_at is not None)}

    def _window(self, values: list[float], m: int) -> float:
        """Mean of window m (1-based)."""
        h = self.config.window
        part = values[(m - 1) * h:m * h]
        return sum(part) / len(part)

    def observe(self, version: int, gap: float, success: float) -> bool:
        """One evaluation step; True exactly once, when the rule says retire."""
        if self.retired_at is not None:
            return False
        self.gaps.append(gap)
        self.successes.append(success)
        h = self.config.window
        if len(self.gaps) % h:
            return False
        m = len(self.gaps) // h
        if m < 2:
            return False
        mean_gap, previous_gap = self._window(self.gaps, m), self._window(self.gaps, m - 1)
        rho = (mean_gap - previous_gap) / mean_gap if mean_gap else float("inf")
        eta = (self._window(self.successes, m) + self._window(self.successes, m - 1)) / (2 * self.teacher_success)
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


def retirement_schedule(cfg, teacher_success: Callable[[], float], state: dict[str, Any] | None) -> RetirementController:
    """RetireOPD's TeacherSchedule: SR_T configured, or measured once (a resume reads it back)."""
    if state is not None:
        controller = RetirementController(cfg.retirement, state["teacher_success"])
        controller.load_state_dict(state)
        return controller
    return RetirementController(cfg.retirement, cfg.retirement.teacher_success or teacher_success())
