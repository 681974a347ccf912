"""jobs.compare's statistics on hand-made results (the tool's runs: README's measured comparison)."""

import math
from pathlib import Path

import pytest

from jobs.compare import _write, main, mean_ci, paired_difference, parse_arm, report, summarize, t975


def test_the_confidence_interval_is_students_t_over_the_seeds():
    mean, half = mean_ci([0.5, 0.7, 0.6])  # sd 0.1, n 3: t(2) = 4.303
    assert mean == pytest.approx(0.6) and half == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert math.isnan(mean_ci([0.4])[1])
    assert t975(4) == 2.776 and t975(45) == 2.0 and t975(1000) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_the_paired_difference_removes_what_seeds_share():
    # Both arms vary a lot with the seed, but the arm is always 0.1 above: paired, the CI is 0.
    arm, base = {0: 0.9, 1: 0.3, 2: 0.6}, {0: 0.8, 1: 0.2, 2: 0.5}
    mean, half = paired_difference(arm, base)
    assert mean == pytest.approx(0.1) and half == pytest.approx(0.0, abs=1e-12)
    assert mean_ci(list(arm.values()))[1] > 0.5  # unpaired, the same data shows nothing


def result(successes, types=("go_to", "pick_up")):
    return {"tasks": [{"seed": i, "task_type": types[i % len(types)], "success": s} for i, s in enumerate(successes)],
            "curve": [(5, sum(successes) / len(successes))], "steps": 10, "train_s": 1.0, "stale_frac": 0.25}


def test_a_summary_and_its_report_say_which_difference_the_seeds_support():
    results = {("grpo", 0): result([0, 0, 1, 0]), ("grpo", 1): result([0, 1, 0, 0]), ("grpo", 2): result([0, 0, 0, 0]),
               ("opd", 0): result([1, 1, 1, 0]), ("opd", 1): result([1, 1, 1, 1]), ("opd", 2): result([1, 0, 1, 1]),
               ("same", 0): result([0, 0, 1, 0]), ("same", 1): result([0, 0, 0, 0]), ("same", 2): result([0, 1, 0, 0])}
    summary = summarize(results, "grpo")
    assert list(summary) == ["grpo", "opd", "same"] and summary["grpo"]["vs_baseline"] is None
    assert summary["opd"]["overall"][0] == pytest.approx(0.8333, abs=1e-3)
    assert summary["opd"]["by_type"]["go_to"][0] == pytest.approx(1.0)
    text = report(summary, "grpo", "# header")
    assert "- opd - grpo: +0.667 ± " in text and "(above)" in text
    assert "- same - grpo: +0.000 ± " in text and "the CI holds 0" in text
    assert "| pick_up | " in text and "| samples dropped stale / put | 0.250 ± 0.000" in text


def test_arms_are_checked_before_any_run(capsys, tmp_path):
    assert parse_arm("opd=") == ("opd", [])
    assert parse_arm("g='learner.algorithm={name: grpo}' teacher=null") == \
        ("g", ["learner.algorithm={name: grpo}", "teacher=null"])
    with pytest.raises(ValueError, match="NAME=OVERRIDES"):
        parse_arm("no equals sign")
    code = main(["--arm", "opd=", "--arm", "bad=rollout.num_env=3", "--steps", "2",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "arm bad: invalid config" in err and "unknown key 'rollout.num_env'" in err
    assert not any(tmp_path.iterdir())  # nothing ran
    assert main(["--arm", "opd=", "--steps", "2", "--out", str(tmp_path)]) == 2
    # Each run is evaluated with its own job: a level changed by an arm or the warm start would
    # compare success on different tasks.
    assert main(["--arm", "opd=", "--arm", "hard=env.num_distractors=1", "--steps", "2", "--out", str(tmp_path)]) == 2
    assert "arm hard changes the environment ({'num_distractors': 1})" in capsys.readouterr().err
    assert main(["--arm", "a=", "--arm", "b=rollout.loop.prompt.history_window=2", "--warm", "env.num_distractors=1",
                 "--steps", "2", "--out", str(tmp_path)]) == 2
    assert "--warm changes the environment" in capsys.readouterr().err
    assert main(["--arm", "a=", "--arm", "b=", "--set", "env.num_distractor=1", "--steps", "2", "--out", str(tmp_path)]) == 2
    assert "--set: invalid config" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_outputs_keep_every_run_and_task(tmp_path, capsys):
    from argparse import Namespace

    import pyarrow.parquet as pq

    results = {("grpo", 0): result([0, 1]), ("grpo", 1): result([0, 0]), ("opd", 0): result([1, 1]),
               ("opd", 1): result([1, 0])}
    _write(results, "grpo", Namespace(steps=10, wall_s=None, seeds=2, eval_tasks=2), tmp_path, warm_success=0.25)
    rows = pq.read_table(tmp_path / "runs.parquet").to_pylist()
    assert sorted((r["arm"], r["run_seed"], r["task_seed"]) for r in rows) == \
        [(arm, s, t) for arm in ("grpo", "opd") for s in (0, 1) for t in (0, 1)]
    out = capsys.readouterr().out
    assert "(itself 0.250)" in (tmp_path / "compare.md").read_text() and (tmp_path / "curves.png").stat().st_size
    assert out.splitlines()[-1].startswith("RESULT baseline=grpo seeds=2 eval_tasks=2 warm_start=0.250 grpo_mean=0.250")


def test_runs_stopped_for_no_learning_signal_are_results_and_are_counted(tmp_path, capsys):
    from argparse import Namespace

    # A run that stopped early (NO_SIGNAL_EXIT: its format collapsed, say) is evaluated like any
    # other; the report and the RESULT line say in how many seeds it happened.
    results = {("grpo", 0): {**result([0, 0]), "no_signal": True}, ("grpo", 1): result([0, 1]),
               ("opd", 0): result([1, 1]), ("opd", 1): result([1, 0])}
    summary = summarize(results, "grpo")
    assert summary["grpo"]["no_signal"] == (1, 2) and summary["opd"]["no_signal"] == (0, 2)
    assert "| runs stopped early: no group carried a signal | 1/2 seeds | 0/2 seeds |" in report(summary, "grpo", "# h")
    _write(results, "grpo", Namespace(steps=10, wall_s=None, seeds=2, eval_tasks=2), tmp_path, warm_success=0.25)
    fields = capsys.readouterr().out.splitlines()[-1].split()
    assert "grpo_no_signal=1/2" in fields and not any(f.startswith("opd_no_signal") for f in fields)


def test_teacher_arms_report_the_per_turn_kl_slope_the_teachers_cost_and_retirement():
    from jobs.compare import kl_slope, teacher_facts

    # KL rising by 0.5 per turn, with a turn no step trained (None) and a step with no per-turn list.
    rows = [{"version": 1, "reverse_kl_by_turn": [1.0, 1.5, None], "num_loss_tokens": 10, "teacher_stopped": False},
            {"version": 2, "reverse_kl_by_turn": [1.0, None, 2.0], "num_loss_tokens": 20, "teacher_stopped": True},
            {"version": 3, "reverse_kl_by_turn": None, "num_loss_tokens": 30, "teacher_stopped": True}]
    assert kl_slope(rows) == pytest.approx(0.5)
    assert teacher_facts(rows, teacher=True) == {"kl_slope": pytest.approx(0.5), "stopped_at": 2, "teacher_tokens": 10}
    assert teacher_facts(rows, teacher=False) == {"kl_slope": None, "teacher_tokens": None, "stopped_at": None}
    assert kl_slope(rows[:1][:0]) is None

    def run(successes, slope, stopped_at=None):
        return {**result(successes), "kl_slope": slope, "teacher_tokens": 100, "stopped_at": stopped_at}

    results = {("opd", 0): run([1, 0], 0.30), ("opd", 1): run([1, 1], 0.50), ("opd", 2): run([0, 1], 0.40),
               ("tcod", 0): run([1, 0], 0.10), ("tcod", 1): run([1, 1], 0.30, 40), ("tcod", 2): run([0, 1], 0.20, 50)}
    summary = summarize(results, "opd")
    assert summary["tcod"]["kl_slope_vs_baseline"] == (pytest.approx(-0.2), pytest.approx(0.0, abs=1e-12))
    assert summary["tcod"]["teacher_stopped"][:2] == (2, 3) and summary["opd"]["teacher_stopped"][:2] == (0, 3)
    text = report(summary, "opd", "# h")
    assert "| per-turn reverse KL slope (per turn index) | 0.400 ± " in text
    assert "per-turn KL slope, tcod - opd: -0.2000 ± 0.0000" in text
    assert "| teacher stopped by the schedule | 0/3 seeds | 2/3 seeds, at version 45.000 ± " in text


def test_finished_runs_are_reused_and_a_run_whose_inputs_changed_runs_again(tmp_path, capsys, monkeypatch):
    """A comparison re-run after a crash, or with an arm added, runs only what has no result under
    its key (`run_key`: the config's text, the run's overrides, budget and seed, its evaluation,
    the warm start's weights)."""
    import jobs.compare as compare

    weights = tmp_path / "warm" / "warm_start_hf" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"w" * 3000)
    argv = ["--arm", "opd=", "--arm", "grpo=learner.lr=1e-4", "--seeds", "2", "--steps", "3", "--eval-tasks", "2",
            "--out", str(tmp_path)]
    args = compare._arguments(argv)
    arms, _, jobs, warm_job = compare._check(args)
    identity = compare.weights_identity(weights.parent)
    planned = compare.plan_runs(args, arms, jobs, ["run.steps=3"], identity)
    for (arm, seed), run in planned.items():
        compare._save(run.run_dir / "eval_compare", run.key, result([int(arm == "opd"), int(seed == 1)]))
    warm_eval = compare.evaluation_config(warm_job, 2)
    warm_key = compare.run_key(Path(args.config).read_text(), [], warm_eval, identity)
    compare._save(tmp_path / "warm" / "eval_compare", warm_key, result([0, 1])["tasks"])

    def run(args, warm_job, warm, warm_evaluation, planned, results, common):
        missing = sorted(k for k, r in results.items() if r is None)
        ran.append((warm_evaluation[2] is None, missing))
        return warm_evaluation[2] or result([0, 1])["tasks"], {k: r or result([1, 1]) for k, r in results.items()}

    ran = []
    monkeypatch.setattr(compare, "_run", run)
    assert compare.main(argv) == 0 and ran == []  # everything finished: the report only, no Ray
    assert capsys.readouterr().out.count("reusing the finished run") == 4
    assert (tmp_path / "compare.md").is_file()
    # Another rate for one arm, a third seed: only those runs run.
    assert compare.main([*argv[:3], "grpo=learner.lr=2e-4", *argv[4:5], "3", *argv[6:]]) == 0
    assert ran == [(False, [("grpo", 0), ("grpo", 1), ("grpo", 2), ("opd", 2)])]
    # Other warm-start weights: nothing is reused, the warm start's evaluation included.
    weights.write_bytes(b"v" * 3000)
    assert compare.main(argv) == 0 and ran[-1] == (True, sorted(planned))
