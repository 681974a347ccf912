"""RetireOPD's retirement rule on hand-made sequences of (gap, success)."""

import pytest

from learner.retirement import RetirementConfig, RetirementController


def decisions(gaps, successes, teacher_success=1.0, **config):
    controller = RetirementController(RetirementConfig(**config), teacher_success)
    return [controller.observe(version, g, s) for version, (g, s) in enumerate(zip(gaps, successes), start=1)], \
        controller


def test_retires_at_the_first_window_where_the_gap_stopped_shrinking_and_the_student_caught_up():
    # H=2: windows (4, 4) (2, 2) (2, 2.2): the gap shrinks in window 2 (ρ = -1), then grows (ρ ≈ 0.05).
    out, controller = decisions([4, 4, 2, 2, 2, 2.2], [0.9, 0.95, 0.9, 0.95, 0.95, 0.95], window=2)
    assert out == [False, False, False, False, False, True] and controller.retired_at == 6
    # Once retired, never again.
    assert not controller.observe(7, 5.0, 1.0)


def test_the_success_share_and_the_first_window_hold_it_back():
    # The gap is flat (ρ = 0 ≥ δ) but the student is at 0.8 of the teacher's 1.0 < γ = 0.9.
    out, _ = decisions([2, 2, 2, 2], [0.8, 0.8, 0.8, 0.8], window=2)
    assert not any(out)
    # The same student retires a teacher whose own success is 0.85: η = 0.8 / 0.85 ≥ 0.9.
    out, _ = decisions([2, 2, 2, 2], [0.8, 0.8, 0.8, 0.8], teacher_success=0.85, window=2)
    assert out == [False, False, False, True]
    # Before two windows exist the rule never decides, even when it would hold.
    out, _ = decisions([2, 2, 2], [1, 1, 1], window=2, gamma=0.0)
    assert out == [False, False, False]
    # δ > 0 asks the gap to grow by that share.
    out, _ = decisions([2, 2, 2, 2.1], [1, 1, 1, 1], window=2, delta=0.1)
    assert not any(out)
    out, _ = decisions([2, 2, 2, 2.6], [1, 1, 1, 1], window=2, delta=0.1)
    assert out[-1]


def test_checked_at_every_evaluation_it_retires_at_step_55_as_the_document_can():
    """Document 001: evaluation every H = 5 learner steps, the rule checked from the second
    monitoring window on, retirements around steps 50-95. With W = 3 (the default) the gap
    stops shrinking after step 30 and the student nears the teacher's success (SR_T 0.95): the
    rule fires at step 55, an evaluation in the middle of what used to be a window (a check only
    where windows of 3 end, at evaluations 6, 9, 12, would wait until step 60)."""
    gaps = [8, 6, 4, 3, 2.5, 2.3, 2.3, 2.3, 2.3, 2.3, 2.35, 2.4]
    successes = [0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 0.85, 0.9, 0.9, 0.92, 0.93, 0.93]
    controller = RetirementController(RetirementConfig(), teacher_success=0.95)
    steps = [5 * n for n in range(1, len(gaps) + 1)]
    fired = [step for step, g, s in zip(steps, gaps, successes) if controller.observe(step, g, s)]
    assert controller.config.window == 3 and fired == [55] and controller.retired_at == 55


def test_the_state_survives_a_checkpoint():
    _, controller = decisions([3, 3, 3], [0.5, 0.5, 0.5], window=2)
    restored = RetirementController(RetirementConfig(window=2), 1.0)
    restored.load_state_dict(controller.state_dict())
    assert restored.observe(4, 3.0, 1.0) == controller.observe(4, 3.0, 1.0)
    with pytest.raises(ValueError):
        RetirementController(RetirementConfig(), 0.0)


def test_as_the_algorithms_teacher_schedule_it_measures_the_gap_since_the_last_evaluation():
    from learner.algorithms import ALGORITHMS, RetireOPDConfig

    cfg = RetireOPDConfig(name="retire_opd", opd_lambda=0.3, topk_kl_coef=0.1,
                          retirement=RetirementConfig(window=1, gamma=0.0, delta=-1.0))
    measured = []
    schedule = ALGORITHMS["retire_opd"].schedule(cfg, lambda: measured.append(1) or 0.5, None)
    assert measured == [1] and schedule.teacher_success == 0.5 and schedule.teacher_active()
    # K_n: the mean reverse KL of the steps since the previous evaluation, this one included.
    assert not schedule.after_step(1, 1.0, None) and not schedule.after_step(2, 3.0, 0.2)
    assert schedule.gaps == [2.0]
    state = schedule.state_dict()
    assert not schedule.after_step(3, 5.0, None)
    # A resume reads SR_T and the steps since the evaluation back, measuring nothing.
    resumed = ALGORITHMS["retire_opd"].schedule(cfg, lambda: pytest.fail("measured again"), state)
    resumed.after_step(3, 5.0, None)
    assert resumed.after_step(4, 7.0, 0.3) and resumed.gaps == [2.0, 6.0] and resumed.retired_at == 4
    assert not resumed.teacher_active()
    assert resumed.loss_config(cfg, 5).opd_lambda == 0.0 and resumed.loss_config(cfg, 5).topk_kl_coef == 0.0
    assert schedule.loss_config(cfg, 5) == cfg
    # A configured SR_T is not measured.
    configured = cfg.model_copy(update={"retirement": cfg.retirement.model_copy(update={"teacher_success": 0.9})})
    assert ALGORITHMS["retire_opd"].schedule(configured, lambda: pytest.fail("measured"), None).teacher_success == 0.9

    # SR_T that cannot be measured for this teacher: the error says where to set it.
    def unknown() -> float:
        raise ValueError("the teacher's eval success is unknown")

    with pytest.raises(ValueError, match=r"unknown: set learner.algorithm.retirement.teacher_success$"):
        ALGORITHMS["retire_opd"].schedule(cfg, unknown, None)
