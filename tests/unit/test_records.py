"""The step record: rates from deltas across a resume, and metrics written by an older schema."""

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.records import STEP_SCHEMA, Counts, StepRecord, read_records, running_totals, write_records


def record(version: int, **totals) -> StepRecord:
    base = dict(version=version, time=0.0, loss=0.1, grad_norm=1.0, entropy=1.0, reverse_kl=0.0, topk_kl=0.0,
                clip_frac=0.0, mismatch_kl=0.0, num_samples=2, num_past_samples=0, num_loss_tokens=10, max_staleness=1,
                mean_staleness=0.5, sample_versions=[version - 1, version - 2], learner_step_s=1.0,
                learner_idle_s=0.1, weight_sync_s=0.01, wall_s=2.0, buffer_occupancy=0.1, buffer_resident=4, num_rollout_workers=1,
                episodes=0, successes=0, turns=0, format_errors=0, rollout_tokens=0, prompt_tokens=0,
                buffer_put=0, buffer_consumed=0, dropped_stale=0, evicted=0, duplicate_groups=0, duplicate_turns=0,
                rollout_failed_runs=0, teacher_restarts=0, nonfinite_steps=0, empty_batches=0, env_restarts=0, judged_turns=None, judge_neutral_turns=None, train_success_rate=None, format_error_rate=None, memory_turns=0, memory_format_error_rate=None,
                prompt_tokens_per_turn=None, rollout_tokens_per_s=0.0, reverse_kl_by_turn=[0.5, None],
                format_error_rate_by_turn=[0.0], response_tokens_per_turn=None, turns_to_success=None,
                reverse_kl_head=0.4, reverse_kl_tail=0.6, student_logprob_head=-0.5, student_logprob_tail=-0.9,
                gauges={"opd_lambda": 1.0, "horizon_k": 10.0}, teacher_stopped=False)
    return StepRecord(**{**base, **totals})


def test_rates_after_a_resume_come_from_this_steps_deltas(tmp_path):
    # A run wrote 100 episodes (50 successes) before it stopped; the resumed run's fresh workers
    # report 10 new episodes with 8 successes. Diffing worker totals against the reloaded row
    # (the old way) gives (8 - 50) / (10 - 100) = 0.47; the step's own rate is 0.8.
    path = tmp_path / "metrics.parquet"
    write_records(path, [record(5, episodes=100, successes=50, turns=400, format_errors=40, rollout_tokens=4000,
                                buffer_put=300, rollout_failed_runs=1, eval_success=0.5,
                                eval_success_by_type={"go_to": 1.0, "pick_up": 0.0})])
    previous = read_records(path)[-1]
    assert previous.eval_success_by_type == {"go_to": 1.0, "pick_up": 0.0}
    assert previous.gauges == {"opd_lambda": 1.0, "horizon_k": 10.0} and previous.teacher_stopped is False
    counts = Counts.sum([{"num_episodes": 6, "num_successes": 5, "num_turns": 20, "num_format_errors": 1,
                          "num_response_tokens": 300, "num_prompt_tokens": 2000, "num_success_turns": 15, "pid": 7,
                          "num_turns@0": 6, "num_format_errors@0": 1, "num_turns@2": 4},
                         {"num_episodes": 4, "num_successes": 3, "num_turns": 20, "num_format_errors": 1,
                          "num_response_tokens": 100, "num_prompt_tokens": 2000, "num_success_turns": 9,
                          "policy_version": 5,
                          "num_turns@0": 4, "num_turns@1": 4, "num_format_errors@1": 2}])
    totals = running_totals(previous, counts, {"num_put": 12}, failed_runs=0, teacher_restarts=1, wall_s=4.0)
    assert totals["train_success_rate"] == 0.8 and totals["format_error_rate"] == 0.05
    assert totals["prompt_tokens_per_turn"] == 100.0 and totals["rollout_tokens_per_s"] == 100.0
    assert totals["format_error_rate_by_turn"] == [0.1, 0.5, 0.0]
    assert totals["response_tokens_per_turn"] == 10.0 and totals["turns_to_success"] == 3.0
    assert (totals["episodes"], totals["successes"], totals["turns"]) == (110, 58, 440)
    assert (totals["buffer_put"], totals["rollout_failed_runs"], totals["teacher_restarts"]) == (312, 1, 1)
    # A step in which no episode finished has no rate (not a stale one, not 0).
    quiet = running_totals(previous, Counts(), {}, failed_runs=0, teacher_restarts=0, wall_s=1.0)
    assert quiet["train_success_rate"] is None and quiet["turns_to_success"] is None and quiet["episodes"] == 100


def test_an_older_schema_reads_back_with_nulls(tmp_path):
    path = tmp_path / "metrics.parquet"
    rows = [dataclasses.asdict(record(v, episodes=v)) for v in (1, 2)]
    dropped = ("eval_success_by_type", "teacher_restarts", "reverse_kl_by_turn", "gauges", "teacher_stopped")
    # Before the gauges map, λ and the horizon were columns of their own.
    old = pa.Table.from_pylist([{k: v for k, v in row.items() if k not in dropped} | {"removed_column": 1}
                                | {"opd_lambda": 0.5, "horizon_k": float(v)} for v, row in zip((1, 2), rows)])
    pq.write_table(old, path)
    records = read_records(path)
    assert [r.version for r in records] == [1, 2] and [r.episodes for r in records] == [1, 2]
    assert all(r.eval_success_by_type is None and r.teacher_stopped is None and r.teacher_restarts is None
               for r in records)
    assert [r.gauges for r in records] == [{"opd_lambda": 0.5, "horizon_k": 1.0}, {"opd_lambda": 0.5, "horizon_k": 2.0}]
    # The next record's totals treat a missing total as 0; rewriting gives the current schema.
    totals = running_totals(records[-1], Counts(num_episodes=3), {}, failed_runs=0, teacher_restarts=2, wall_s=1.0)
    assert totals["teacher_restarts"] == 2 and totals["episodes"] == 5
    write_records(path, records)
    assert pq.read_table(path).schema.names == STEP_SCHEMA.names


def test_skipped_steps_are_counted_by_reason_and_stop_the_run_after_the_limit_in_a_row():
    from types import SimpleNamespace

    import pytest

    from jobs.recorder import NonFiniteTraining, StepRecorder

    exported = []
    recorder = StepRecorder(SimpleNamespace(inc=lambda name, amount: exported.append((name, amount))))
    recorder.restore([record(6, nonfinite_steps=4, empty_batches=1)])
    nan = {"skipped": "nonfinite", "loss": float("nan"), "grad_norm": float("nan")}
    empty = {"skipped": "no_trainable_token", "loss": 0.0, "grad_norm": 0.0}
    recorder.skipped(nan, 7, limit=3)
    recorder.skipped(empty, 7, limit=3)
    with pytest.raises(NonFiniteTraining, match="3 learner steps in a row were skipped .* at version 7"):
        recorder.skipped(nan, 7, limit=3)
    assert (recorder.nonfinite_steps, recorder.empty_batches) == (6, 2)
    assert exported == [("nonfinite_steps", 1), ("empty_batches", 1), ("nonfinite_steps", 1)]


def totals(delivered, flat, successes=0, turns=0, format_errors=0, group_size=4):
    return {"num_groups_delivered": delivered, "num_groups_without_signal": flat,
            "num_episodes_without_signal": flat * group_size, "num_successes_without_signal": successes,
            "num_turns_without_signal": turns, "num_format_errors_without_signal": format_errors}


def test_the_signal_watch_stops_after_the_limit_of_flat_groups_in_a_row_and_names_the_cause():
    from jobs.recorder import SignalWatch

    watch = SignalWatch(limit=3)
    assert watch.update(totals(5, 1)) is None  # the streak starts here
    assert watch.update(totals(7, 3, turns=20, format_errors=19)) is None  # 2 flat groups in a row
    # A group with signal between two reads (delivered +2, flat +1) starts the streak again.
    assert watch.update(totals(9, 4, turns=30, format_errors=28)) is None
    assert watch.update(totals(11, 6, turns=50, format_errors=48)) is None
    cause = watch.update(totals(12, 7, turns=60, format_errors=55))
    assert cause.startswith("the last 3 groups the workers finished (12 episodes) carried no learning signal")
    assert "success 0.00, format errors on 0.90 of the turns" in cause and "tool calls do not parse" in cause
    # A restarted worker's totals start at 0 again: a new streak, not a negative one.
    assert watch.update(totals(2, 2)) is None and watch.update(totals(4, 4)) is None
    solved = SignalWatch(2)
    solved.update(totals(0, 0))
    assert "solves these training tasks" in solved.update(totals(2, 2, successes=8, turns=16))
    failed = SignalWatch(2)
    failed.update(totals(0, 0))
    assert "fails every task alike" in failed.update(totals(2, 2, turns=80, format_errors=4))
    unlimited = SignalWatch(None)
    assert unlimited.update(totals(0, 0)) is None and unlimited.update(totals(100, 100)) is None


def test_a_write_that_fails_midway_leaves_the_previous_metrics_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.parquet"
    write_records(path, [record(1)])

    def crash(table, where):
        open(where, "wb").write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        write_records(path, [record(1), record(2)])
    assert [r.version for r in read_records(path)] == [1]
