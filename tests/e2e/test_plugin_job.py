"""An algorithm with a teacher schedule of its own and a teacher backend, registered in this file
alone and run by a real job that names this module with `--plugin` (nothing else changes): λ
annealed linearly to 0 over two steps, after which the schedule stops the teacher, whose
services end; the teacher is the oracle wrapped by a backend that counts what it scores.

The same job's agent is a program the project does not own (docs/gateway.md): the example
OpenAI-client agent, one persistent process per environment slot, trained through the rollout worker's gateway
(jobs/configs/babyai_gateway_tiny.yaml) -- one run for both, as neither needs the other's absence."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from learner.algorithms import (Algorithm, JointConfig, grpo_advantages, joint_loss, opd_lambda, register_algorithm,
                               teacher_scores)
from teacher.registry import register_teacher_backend, teacher_backend

ANNEAL_STEPS = 2


class AnnealSchedule:
    """λ_step = λ · max(0, 1 − step / ANNEAL_STEPS); the teacher goes once λ reaches 0."""

    def __init__(self, state: dict | None) -> None:
        self.stopped_at = None if state is None else state["stopped_at"]

    def teacher_active(self) -> bool:
        return self.stopped_at is None

    def loss_config(self, cfg, step: int):
        return cfg.model_copy(update={"opd_lambda": cfg.opd_lambda * max(0.0, 1 - step / ANNEAL_STEPS)})

    def after_step(self, version: int, reverse_kl: float, eval_success: float | None) -> bool:
        if self.stopped_at is None and version >= ANNEAL_STEPS:
            self.stopped_at = version
            return True
        return False

    def state_dict(self) -> dict:
        return {"stopped_at": self.stopped_at}


register_algorithm("anneal_test", Algorithm(joint_loss, (grpo_advantages, teacher_scores),
                                            gauges=(opd_lambda(lambda cfg, step: cfg.opd_lambda),),
                                            schedule=lambda cfg, teacher_success, state: AnnealSchedule(state),
                                            config_cls=JointConfig))


COUNTS_DIR = "PLUGIN_TEST_TEACHER_COUNTS"
"""Where each counting teacher service writes how many trajectories it scored (a file per process)."""


class CountingScorer:
    def __init__(self, scorer) -> None:
        self.scorer, self.num_scored = scorer, 0

    def score_trajectories(self, trajectories, top_k=0):
        scores = self.scorer.score_trajectories(trajectories, top_k)
        self.num_scored += len(trajectories)
        (Path(os.environ[COUNTS_DIR]) / str(os.getpid())).write_text(str(self.num_scored))
        return scores


oracle = teacher_backend("oracle")
register_teacher_backend("counting_oracle_test", dataclasses.replace(
    oracle, build=lambda config, ctx: CountingScorer(oracle.build(config, ctx))))


def test_a_job_runs_an_algorithm_and_its_teacher_schedule_registered_in_a_test_file(tmp_path):
    from test_train_job import ROOT, SHORT, free_port, job_env

    run_dir = tmp_path / "run"
    env = job_env()
    env["PYTHONPATH"] = f"{Path(__file__).parent}:{env.get('PYTHONPATH', '')}"
    env[COUNTS_DIR] = str(tmp_path / "counts")
    (tmp_path / "counts").mkdir()
    assert SHORT[:2] == ["--config", "jobs/configs/babyai_opd_tiny.yaml"]
    proc = subprocess.run([sys.executable, "-m", "jobs.train", "--plugin", Path(__file__).stem,
                           "--config", "jobs/configs/babyai_gateway_tiny.yaml", *SHORT[2:],
                           "learner.algorithm.name=anneal_test", "learner.algorithm.opd_lambda=0.5",
                           "teacher.backend=counting_oracle_test",
                           "learner.algorithm.drop_zero_variance_groups=false", "run.steps=3",
                           f"run.dir={run_dir}", f"run.metrics_port={free_port()}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "teacher stopped by the anneal_test schedule at version 2: 1 teacher service(s) stopped" in proc.stdout
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    # λ as each step trained with it.
    assert [dict(r["gauges"]) for r in rows] == [{"opd_lambda": x} for x in (0.5, 0.25, 0.0)]
    assert [r["teacher_stopped"] for r in rows] == [False, False, True]
    # The job's one teacher service scored with the registered backend.
    counts = [int(path.read_text()) for path in (tmp_path / "counts").iterdir()]
    assert len(counts) == 1 and counts[0] >= 8, counts
    # Through the gateway (the job's resolved config says so): every step trained on the programs' recorded calls, none of which
    # failed, and the evaluation at step 2 ran the program greedily.
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["env"]["name"] == "gateway"
    assert all(r["num_loss_tokens"] > 0 for r in rows) and rows[-1]["episodes"] >= 4
    assert rows[-1]["agent_failures"] == 0 and rows[-1]["format_errors"] <= rows[-1]["turns"]
    assert rows[1]["eval_success"] is not None
    # A module that does not import is a clear error before anything starts.
    bad = subprocess.run([sys.executable, "-m", "jobs.train", "--plugin", "no_such_module", "--dry-run"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--plugin no_such_module: the module does not import" in bad.stderr
