"""Fault drills on real `python -m jobs.train` runs (the embedded default with the nano model and
the HF engine, a few short steps): SIGKILL of actors the job started, found among the job process's
descendants by their Ray process titles (`ray::<Class>`)."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from test_train_job import HF_ENGINE, ROOT, SHORT, assert_loopback_only, free_port, listening_addresses, job_env

pytestmark = pytest.mark.slow


class Job:
    """A jobs.train subprocess whose output lines are collected as they come."""

    started: list["Job"] = []
    """Every job this module's tests started (`stop_jobs_left_running` stops what a failed one left)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        Job.started.append(self)
        self.proc = subprocess.Popen([sys.executable, "-m", "jobs.train", *args], cwd=ROOT,
                                     env={**job_env(), **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.metrics_port = next((a.partition("=")[2] for a in args if a.startswith("run.metrics_port=")), None)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def wait_for(self, text: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None and time.monotonic() < deadline, f"no {text!r} in:\n{self.output}"
            time.sleep(0.1)

    def kill_actor(self, title: str, every: bool = False) -> list[int]:
        """SIGKILL the newest process of the job whose title starts with `ray::<title>` (or `every`
        one). The newest: after a recovery, a process of the replaced actors may still be exiting."""
        found = []
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if (child.cmdline() or [""])[0].startswith(f"ray::{title}"):
                    found.append((child.create_time(), child))
            except psutil.NoSuchProcess:
                continue
        assert found, f"no ray::{title} process under the job"
        victims = [child for _, child in sorted(found, key=lambda pair: pair[0], reverse=True)][:None if every else 1]
        for child in victims:
            child.send_signal(signal.SIGKILL)
        return [child.pid for child in victims]

    def finish(self, timeout_s: float = 300) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM (the run's own orderly stop), then SIGKILL to the job and to every process it
        started that is still there after `grace_s`."""
        if self.proc.poll() is not None:
            return
        started = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for child in started:
            with contextlib.suppress(psutil.NoSuchProcess):  # it exited meanwhile (psutil refuses a reused pid)
                child.kill()


@pytest.fixture(autouse=True)
def stop_jobs_left_running():
    """A failed assertion leaves its job running; the tests after it would share the cores with it."""
    yield
    while Job.started:
        Job.started.pop().stop()


def short_run(run_dir, steps: int) -> list[str]:
    return [*SHORT, *HF_ENGINE, f"run.dir={run_dir}", f"run.steps={steps}", f"run.metrics_port={free_port()}",
            "run.eval_every=0", "run.checkpoint_every=2"]


STEP = re.compile(r"^step\s+(\d+) .*?(?: restarts rollout (\d+) teacher (\d+) env (\d+))?$", re.MULTILINE)
RESTARTED = {"RolloutWorker": 2, "_ServiceActor": 3, "_EnvActor": 4}
"""The victims restarted in place: the group of STEP holding their restart total."""
RECOVERED = {"ReplayBuffer": "the replay buffer actor died", "LearnerRank": r"learner rank \d died"}
"""The victims the job recovers from by rebuilding every actor: the cause it prints."""


def wait_for_step(job: Job, seen: int, done, timeout_s: float = 300) -> int:
    """Until a step line printed after `seen` characters of output satisfies `done(match)`; its version."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = next((m for m in STEP.finditer(job.output[seen:]) if done(m)), None)
        if found is not None:
            return int(found.group(1))
        assert job.proc.poll() is None and time.monotonic() < deadline, f"no such step:\n{job.output}"
        time.sleep(0.2)


def test_chaos_a_seeded_schedule_of_kills_the_job_recovers_from_then_a_fatal_one_and_resume(tmp_path):
    """A seeded random schedule SIGKILLs a rollout worker, every environment actor, the teacher
    service, the buffer and a learner rank, in a random order, each a random 1-3 steps after the
    job accounted the previous kill (its restart total on the step line, or its recovery: a
    worker's counts between its last report and its death are lost by design, so a kill before
    that would erase the evidence of the one before). Workers, environment actors and the
    teacher are restarted in place; the buffer's and the rank's deaths are recovered by the job
    itself (run.max_failures=2: every actor rebuilt from the newest checkpoint). Episodes deliver
    their turns in parts (`rollout.segments`): a kill leaves groups partly stored, and the buffer
    keeps each turn once. Then, with no recovery left, one more death of the buffer stops the run
    naming the `--resume` command: versions 1..N once each, counters that add up,
    job_recoveries 2. The resumed run continues at the version it checkpointed; its rollout
    worker is killed during an evaluation (which re-runs its tasks on the restarted worker), and
    a SIGTERM far from its last step stops it at once with a checkpoint, although the learner
    may be waiting for a batch with a 900 s timeout."""
    import random

    run_dir = tmp_path / "run"
    seed = int(os.environ.get("CHAOS_SEED", "2026"))  # another seed, another schedule
    rng = random.Random(seed)
    victims = [*RESTARTED, *RECOVERED]
    rng.shuffle(victims)
    schedule = [(rng.randint(1, 3), victim) for victim in victims]
    job = Job(*short_run(run_dir, steps=1000), "run.max_failures=2", "rollout.env_actors=true",
              "rollout.num_envs=4", "rollout.segments=true")
    job.wait_for("step    1 ")
    assert_loopback_only(listening_addresses(job.proc.pid), job.metrics_port)
    restarts = kill_on_schedule(job, schedule)
    job.kill_actor("ReplayBuffer")
    assert job.finish() == 1, f"seed {seed}: {schedule}\n{job.output}"
    assert "run stopped: the replay buffer actor died" in job.output and f"--resume {run_dir}" in job.output
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [r["version"] for r in rows] == list(range(1, len(rows) + 1)), (schedule, job.output)
    last = rows[-1]
    assert last["job_recoveries"] == 2 and last["duplicate_groups"] == 0 and last["buffer_lost"] >= 0
    assert last["rollout_failed_runs"] >= restarts["RolloutWorker"] >= 1
    assert last["teacher_restarts"] >= restarts["_ServiceActor"] >= 1
    assert last["env_restarts"] >= restarts["_EnvActor"] >= 1, (schedule, job.output)
    assert last["buffer_put"] == (last["buffer_consumed"] + last["dropped_stale"] + last["evicted"]
                                  + last["buffer_resident"] + last["buffer_lost"])
    assert all(a["episodes"] <= b["episodes"] and a["buffer_put"] <= b["buffer_put"] for a, b in zip(rows, rows[1:]))
    resume_with_a_kill_during_an_evaluation_then_stop(run_dir)


def kill_on_schedule(job: Job, schedule: list[tuple[int, str]]) -> dict[str, int]:
    """Each (gap, victim) killed `gap` steps after the previous kill was accounted; the restart
    totals the step lines reached, by restarted victim."""
    restarts = {victim: 0 for victim in RESTARTED}
    num_recoveries, accounted_at, seen = 0, 0, 0
    for gap, victim in schedule:
        # `gap` steps past the one at which the previous kill was accounted (a recovery repeats
        # the versions after its checkpoint: counted from the first step after it).
        wait_for_step(job, seen, lambda m: int(m.group(1)) >= accounted_at + gap)
        seen = len(job.output)
        job.kill_actor(victim, every=victim == "_EnvActor")
        if victim in RESTARTED:
            group, before = RESTARTED[victim], restarts[victim]
            accounted_at = wait_for_step(job, seen, lambda m: int(m.group(group) or 0) > before)
            restarts[victim] = max(int(m.group(group) or 0) for m in STEP.finditer(job.output[seen:]))
        else:
            num_recoveries += 1
            job.wait_for(f"recovery {num_recoveries}/2: ")
            assert re.search(f"recovery {num_recoveries}/2: {RECOVERED[victim]}", job.output), (schedule, job.output)
            seen = job.output.index(f"recovery {num_recoveries}/2: ")
            accounted_at = wait_for_step(job, seen, lambda m: True)
        seen = len(job.output)
    wait_for_step(job, seen, lambda m: True)  # the last kill's step recorded
    return restarts


def resume_with_a_kill_during_an_evaluation_then_stop(run_dir: Path) -> None:
    """The resumed run's rollout worker killed during an evaluation (its tasks re-run on the
    restarted worker), then a SIGTERM while the learner may wait for a batch for 900 s."""
    version = int((run_dir / "checkpoints" / "latest").read_text().removeprefix("step_"))
    evaluated = version + 2
    job = Job("--resume", str(run_dir), "run.max_failures=0", "run.batch_timeout_s=900",
              f"run.metrics_port={free_port()}", f"run.eval_every={evaluated}", "run.eval_tasks=48")
    job.wait_for("evaluating 48 tasks")
    job.kill_actor("RolloutWorker")
    job.wait_for(f"step {evaluated + 1:4d} ")
    stopped = time.monotonic()
    job.proc.send_signal(signal.SIGTERM)
    assert job.finish() == 0, job.output
    assert time.monotonic() - stopped < 120  # a stop is seen within a second of waiting, not after 900 s
    assert f"at version {version}" in job.output, job.output
    after_eval = job.output.split("evaluating 48 tasks", 1)[1]
    assert "rollout worker 0 did not answer" in after_eval.split(f"step {evaluated:4d} ", 1)[0], job.output
    final = int(re.search(r'"final_version": (\d+)', job.output).group(1))
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{final:06d}"
    assert (run_dir / "hf" / "config.json").is_file()
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [r["version"] for r in rows] == list(range(1, final + 1))
    assert rows[evaluated - 1]["eval_success"] is not None


def test_resume_refuses_an_incomplete_checkpoint_before_any_actor(tmp_path):
    """A run directory whose latest checkpoint lost its trainer state (damaged checkpoints of every
    kind: tests/unit/test_trainer.py): `--resume` exits 2 with one line, before Ray starts."""
    from jobs.config import dump_config, load_config
    from jobs.train import JobConfig

    run_dir = tmp_path / "run"
    config = load_config(JobConfig, SHORT[1], [*SHORT[2:], f"run.dir={run_dir}"])
    (run_dir / "checkpoints" / "step_000002" / "dcp").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    (run_dir / "checkpoints" / "latest").write_text("step_000002")
    resumed = subprocess.run([sys.executable, "-m", "jobs.train", "--resume", str(run_dir)], cwd=ROOT,
                             env=job_env(), capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 2 and "trainer_state.json is missing or corrupt" in resumed.stderr
    assert "Traceback" not in resumed.stderr and "Started a local Ray instance" not in resumed.stderr


def test_a_run_whose_groups_carry_no_signal_stops_naming_the_cause_without_recovering(tmp_path):
    """GRPO on the untrained nano student: it fails every episode alike, so the group-end stage
    drops every group for carrying no signal. The run neither waits for run.stall_timeout_s nor
    rebuilds the same policy (run.max_failures): after run.max_groups_without_signal such groups
    in a row it checkpoints, exports its policy and exits NO_SIGNAL_EXIT naming the cause."""
    from jobs.train import NO_SIGNAL_EXIT

    run_dir = tmp_path / "run"
    job = Job(*short_run(run_dir, steps=5), "learner.algorithm={name: grpo}", "teacher=null",
              "run.max_groups_without_signal=3", "run.max_failures=2")
    assert job.finish(timeout_s=300) == NO_SIGNAL_EXIT, job.output
    stopped = next(line for line in job.lines if line.startswith("run stopped: "))
    assert "groups the workers finished" in stopped and "carried no learning signal" in stopped, stopped
    assert "success 0.00" in stopped and "checkpointed at" in stopped, stopped
    assert "recovery" not in job.output
    assert (run_dir / "checkpoints" / "latest").is_file() and (run_dir / "hf" / "config.json").is_file()


def assert_env_restarts_lost_nothing(run_dir, num_steps: int, output: str) -> None:
    """Every step trained and the run evaluated; an environment actor was restarted; no group
    stored twice, and every sample put is accounted for."""
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    last = rows[-1]
    assert len(rows) == num_steps and all(r["num_loss_tokens"] > 0 for r in rows) and last["eval_success"] is not None
    assert last["env_restarts"] >= 1 and last["duplicate_groups"] == 0, output
    assert last["buffer_put"] == (last["buffer_consumed"] + last["dropped_stale"] + last["evicted"]
                                  + last["buffer_resident"])


@pytest.mark.alfworld
def test_an_alfworld_run_survives_its_killed_environment_actors(tmp_path, alfworld_data):
    """ALFWorld with environment actors in the plan's bundles; SIGKILL of every rollout
    environment actor mid-run: Ray restarts them, the episodes they held start over, none is
    stored twice, and the run finishes with its eval."""
    run_dir = tmp_path / "run"
    job = Job("--config", "jobs/configs/alfworld_grpo_tiny.yaml", "model.path=tiny:nano", "rollout.num_envs=4",
              "rollout.group_size=2", "cluster.plan.env.count=8", "rollout.loop.max_turns=3",
              "rollout.sampling.max_new_tokens=16", "buffer.batch_size=4", "warm_start.num_episodes=0",
              "run.steps=6", "run.eval_every=6", "run.eval_tasks=2", f"run.dir={run_dir}",
              # Δmax 4: at step 1 the first wave's 12 samples leave room for more groups, so
              # episodes are running in the actors when they are killed (at Δmax 2 admission
              # rightly waits until the learner has taken the resident samples).
              "buffer.max_staleness=4",
              f"run.metrics_port={free_port()}", *HF_ENGINE, env={"ALFWORLD_DATA": str(alfworld_data)})
    job.wait_for("step    1 ", timeout_s=400)
    # The rollout set (and the eval set if started); what was resident at step 1 lasts a few
    # steps, so the later ones train on episodes played by the restarted actors.
    assert len(job.kill_actor("_EnvActor", every=True)) >= 4
    assert job.finish(timeout_s=400) == 0, job.output
    assert "env      8 x (0.03125 CPU, 0 GPU)" in job.output  # the environment actors' bundles
    assert_env_restarts_lost_nothing(run_dir, 6, job.output)


def java_processes(pid: int) -> dict[int, psutil.Process]:
    """The ScienceWorld JVMs under a job (its Ray processes are its descendants)."""
    found = {}
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "scienceworld" in " ".join(child.cmdline()) and "java" in child.name():
                found[child.pid] = child
        except psutil.NoSuchProcess:
            continue
    return found


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.scienceworld
def test_a_scienceworld_run_survives_a_killed_environment_actor_and_leaves_no_jvm(tmp_path, scienceworld_ready):
    """ScienceWorld in environment actors (a JVM each, started once, reset per episode) with the
    gold-path expert as oracle teacher: SIGKILL of the rollout environment actors mid-run takes
    their JVMs with them (a JVM watches its parent), Ray restarts the actors, their episodes
    start over and none is stored twice; every listener (py4j's included) is on loopback; after the job no JVM it
    started is left."""
    run_dir, port = tmp_path / "run", free_port()
    job = Job("--config", "jobs/configs/scienceworld_opd_tiny.yaml", "model.path=tiny:nano", "rollout.num_envs=2",
              "cluster.plan.env.count=4", "rollout.loop.max_turns=4", "rollout.sampling.max_new_tokens=16",
              "buffer.batch_size=4", "warm_start.num_episodes=0", "run.steps=4", "run.eval_every=4",
              "run.eval_tasks=2", f"run.dir={run_dir}", f"run.metrics_port={port}", *HF_ENGINE)
    job.wait_for("step    1 ", timeout_s=400)
    assert_loopback_only(listening_addresses(job.proc.pid), port)
    jvms = java_processes(job.proc.pid)
    parents = {pid: proc.ppid() for pid, proc in jvms.items()}
    # Every environment actor alive now (the rollout set): one killed between two episodes would
    # restart unnoticed (no episode to start over), so all of them, as the ALFWorld drill does.
    victims = job.kill_actor("_EnvActor", every=True)
    # Only their JVMs: the oracle teacher replays episodes in a JVM of its own, which lives on.
    orphans = {pid: proc for pid, proc in jvms.items() if parents[pid] in victims}
    assert len(orphans) >= 2, (parents, victims)  # the rollout set's (evaluations start theirs later)
    deadline = time.monotonic() + 30
    while any(alive(proc) for proc in orphans.values()):
        assert time.monotonic() < deadline, f"a JVM outlived its killed actor: {orphans}"
        time.sleep(0.5)
    jvms |= java_processes(job.proc.pid)
    assert job.finish(timeout_s=400) == 0, job.output
    assert_env_restarts_lost_nothing(run_dir, 4, job.output)
    deadline = time.monotonic() + 30
    while any(alive(proc) for proc in jvms.values()):
        assert time.monotonic() < deadline, [pid for pid, proc in jvms.items() if alive(proc)]
        time.sleep(0.5)
