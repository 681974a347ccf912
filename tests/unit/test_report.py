"""jobs.report on synthetic runs: every figure and the table, for one run and two runs overlaid."""

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.records import StepRecord, write_records
from jobs.report import FIGURES, main


def synthetic_run(directory, num_steps: int, warm_steps: int, seed: int, retire_at: int | None = None) -> None:
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    records = []
    for i in range(num_steps):
        version = warm_steps + i + 1
        kl_by_turn = [rng.random() * (t + 1) / 5 if rng.random() > 0.1 else None for t in range(6)]
        records.append(StepRecord(
            version=version, time=1000.0 + i, loss=rng.random(), grad_norm=1.0, entropy=1.2,
            reverse_kl=rng.random(), topk_kl=rng.random() / 2, clip_frac=0.0, mismatch_kl=0.01,
            num_samples=32, num_past_samples=0, num_loss_tokens=400, max_staleness=2, mean_staleness=1.0,
            sample_versions=[version - 1 - rng.randint(0, 2) for _ in range(32)], learner_step_s=2.0,
            learner_idle_s=rng.random(), weight_sync_s=0.1, wall_s=3.0, buffer_occupancy=0.1,
            buffer_resident=10, num_rollout_workers=2, episodes=10 * i, successes=3 * i, turns=50 * i,
            format_errors=i, rollout_tokens=1000 * i, prompt_tokens=9000 * i, buffer_put=40 * i,
            buffer_consumed=32 * i, dropped_stale=2 * i, evicted=0, duplicate_groups=0, duplicate_turns=0, rollout_failed_runs=0,
            teacher_restarts=0, nonfinite_steps=0, empty_batches=0, env_restarts=0, judged_turns=None, judge_neutral_turns=None, train_success_rate=rng.random(), format_error_rate=rng.random() / 4, memory_turns=0,
            memory_format_error_rate=None,
            prompt_tokens_per_turn=180.0, rollout_tokens_per_s=300 + rng.random() * 50,
            reverse_kl_by_turn=kl_by_turn, format_error_rate_by_turn=[0.1] * 6,
            response_tokens_per_turn=12.0 + rng.random(), turns_to_success=4.0 + rng.random(),
            reverse_kl_head=rng.random() / 2, reverse_kl_tail=rng.random(), student_logprob_head=-rng.random(),
            student_logprob_tail=-2 * rng.random(),
            gauges={"opd_lambda": 0.0 if retire_at is not None and version >= retire_at else 1.0,
                    "horizon_k": float(1 + i // 2)},
            teacher_stopped=retire_at is not None and version >= retire_at,
            eval_success=rng.random() if i % 3 == 2 else None,
            eval_success_by_type={"go_to": rng.random(), "pick_up": rng.random()} if i % 3 == 2 else None))
    write_records(directory / "metrics.parquet", records)
    if warm_steps:
        pq.write_table(pa.Table.from_pylist([{"version": v, "eval_success": 0.3 if v == warm_steps else None}
                                             for v in range(1, warm_steps + 1)]), directory / "warm_start.parquet")


def test_one_run_gets_every_figure_and_the_table(tmp_path, capsys):
    synthetic_run(tmp_path / "opd", num_steps=12, warm_steps=5, seed=0, retire_at=12)
    main([str(tmp_path / "opd")])
    for name in FIGURES:
        assert (tmp_path / "opd" / f"{name}.png").stat().st_size > 5000, name
    report = (tmp_path / "opd" / "report.md").read_text()
    assert "| opd | 6-17 | 0.30 |" in report and "teacher stopped at" in report and "| 12 |" in report
    assert all(f"]({name}.png)" in report for name in FIGURES)


def test_two_runs_are_overlaid_into_one_report(tmp_path):
    synthetic_run(tmp_path / "a" / "run", num_steps=8, warm_steps=0, seed=1)
    synthetic_run(tmp_path / "b" / "run", num_steps=10, warm_steps=3, seed=2)
    main([str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run"), "--out", str(tmp_path / "cmp")])
    report = (tmp_path / "cmp" / "report.md").read_text()
    assert "| a/run |" in report and "| b/run |" in report  # same directory names: labels take the parent
    assert all((tmp_path / "cmp" / f"{name}.png").is_file() for name in FIGURES)


def test_a_directory_without_metrics_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path)])
    assert exc.value.code == 2 and "no metrics.parquet" in capsys.readouterr().err
