"""`python -m jobs.evaluate` as a user runs it (README command 1 until jobs.train lands)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from envs.babyai_text.diagnosis import FAILURE_MODES

ROOT = Path(__file__).resolve().parents[2]


def run_job(*args, cwd=ROOT):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "jobs.evaluate", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_zero_shot_model_evaluation(tmp_path):
    out = tmp_path / "eval"
    # The engine core in the job's process: half the start of vLLM's own process (docs/vllm_cpu.md),
    # which the `ray job submit` test's rollout worker runs.
    proc = run_job("model.path=tiny:nano", "num_tasks=6", "loop.max_turns=2", "batch_size=3",
                   "sampling.max_new_tokens=12", "vllm.in_process=true", f"output_dir={out}")
    assert proc.returncode == 0, proc.stderr
    assert "overall" in proc.stdout and "policy=model split=eval50 episodes=6" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["overall"]["num_episodes"] == 6
    assert set(results["summary"]) == {"go_to", "go_to_after_pick_up", "open", "pick_up", "pick_up_then_go_to",
                                       "put_next_to", "overall"}
    table = pq.read_table(out / "episodes.parquet")
    assert table.num_rows == 6 and table.column("seed").to_pylist() == list(range(6))
    assert all(1 <= t <= 2 for t in table.column("num_turns").to_pylist())
    # Each failure replayed and named; the tool calls counted per name, "(none)" for a format error.
    episodes = table.to_pylist()
    assert all((e["failure_mode"] is None) == e["success"] for e in episodes)
    assert all(e["failure_mode"] in FAILURE_MODES for e in episodes if not e["success"])
    overall = results["summary"]["overall"]
    assert sum(overall["failure_modes"].values()) == sum(not e["success"] for e in episodes)
    assert sum(overall["tool_calls"].values()) == sum(e["num_turns"] for e in episodes)
    assert overall["tool_calls"].get("(none)", 0) == sum(e["num_format_errors"] for e in episodes)
    # Failed episodes that ended in a cycle (jobs.evaluate.cycle_period), counted as the table says.
    assert all(e["cycle_period"] is None for e in episodes if e["success"])
    assert overall["num_cycled"] == sum(e["cycle_period"] is not None for e in episodes)


def test_expert_evaluation_succeeds_everywhere(tmp_path):
    proc = run_job("policy=expert", "loop.max_turns=128", f"output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert summary["overall"] == {"num_episodes": 50, "success_rate": 1.0, "mean_turns": summary["overall"]["mean_turns"],
                                  "format_error_rate": 0.0}


def test_random_policy_is_the_floor_and_repeatable(tmp_path):
    starter = ["split=eval", "num_tasks=40", "env.room_size=6", "env.num_distractors=1",
               "env.task_types=[go_to, pick_up]", "loop.max_turns=10"]
    runs = []
    for name in ("a", "b"):
        proc = run_job("policy=random", *starter, f"output_dir={tmp_path / name}")
        assert proc.returncode == 0, proc.stderr
        runs.append(pq.read_table(tmp_path / name / "episodes.parquet").to_pylist())
    assert runs[0] == runs[1]
    summary = json.loads((tmp_path / "a" / "results.json").read_text())["summary"]["overall"]
    # Random valid calls: never a format error, rarely a success, most episodes use every turn.
    assert summary["format_error_rate"] == 0.0 and summary["success_rate"] < 0.3 and summary["mean_turns"] > 7


def test_bad_config_fails_before_anything_runs(tmp_path):
    proc = run_job("loop.max_turn=3", f"output_dir={tmp_path}")
    assert proc.returncode == 2
    assert "unknown key 'loop.max_turn'" in proc.stderr
    assert not (tmp_path / "results.json").exists()


def test_dry_run_prints_the_resolved_config():
    proc = run_job("--dry-run", "split=eval", "num_tasks=3")
    assert proc.returncode == 0, proc.stderr
    assert "split: eval" in proc.stdout and "num_tasks: 3" in proc.stdout and "max_turns: 20" in proc.stdout
