"""Train an agent: rollout workers, teacher service, replay buffer and learner ranks on Ray.

    python -m jobs.train [--config jobs/configs/babyai_opd_tiny.yaml] [key.sub=value ...]
                         [--dry-run] [--resume RUN_DIR] [--miniature [--keep-gpus]]

An optional warm start (jobs.warm_start: SFT on the bot's demonstrations) runs first and
publishes its weights; then the loop.

The loop and its back-pressure are explained, with a diagram, where they live: jobs/training.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from actors.rollout_worker import RolloutConfig
from buffer.actor import BufferConfig
from cluster.plan import ResourcePlan
from cluster.plugins import import_plugins
from envs.registry import EnvSection, check_split, default_env_config, make_env
from jobs.aggregate import AggregateConfig
from jobs.config import ConfigError, dump_config, load_config
from jobs.console import LogLevel, filtered_worker_logs
from jobs.records import RunLog, last_and_best_eval
from jobs.wandb_log import WandbConfig
from jobs.warm_start import WarmStartConfig
from judge.service import JudgeConfig
from learner.algorithms import ALGORITHMS
from models.loading import ModelConfig
from learner.trainer import LearnerConfig
from teacher.registry import teacher_backend
from teacher.routing import TeacherRoute, check_routes
from teacher.service import TeacherConfig

if TYPE_CHECKING:
    from jobs.training import TrainingRun


class ClusterConfig(BaseModel):
    """Where to run: an existing cluster (address or $RAY_ADDRESS) or an embedded local one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = None
    num_cpus: int = Field(default=2, ge=1)
    """CPUs of the embedded local cluster."""
    plan: ResourcePlan = ResourcePlan()


NO_SIGNAL_EXIT = 3
"""The exit status of a run stopped by run.max_groups_without_signal (jobs.recorder.SignalWatch):
its checkpoint and exported policy (RUN_DIR/hf) are those it ended with; jobs.compare evaluates it."""


class RunConfig(BaseModel):
    """Length, cadence and outputs of the run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dir: str = "runs/train"
    steps: int = Field(default=30, ge=0)
    """Learner steps of the main loop (policy versions after the warm start); 0: the warm start alone."""
    publish_every: int = Field(default=1, ge=1)
    """Learner steps between weight publishes: the rollout workers keep one policy this many steps
    (DAgger's rounds), so its samples start up to publish_every - 1 versions behind the learner
    (buffer.weights_lag: admission keeps that part of Δmax out of the samples' wait); at most
    buffer.max_staleness + 1."""
    eval_every: int = Field(default=10, ge=0)
    """0 disables periodic evaluation."""
    eval_split: str = "eval50"
    eval_tasks: int = Field(default=12, ge=1)
    checkpoint_every: int = Field(default=10, ge=1)
    keep_checkpoints: int = Field(default=3, ge=1)
    """Complete checkpoints kept (the newest); `--resume` takes the newest that verifies."""
    max_wall_s: float | None = Field(default=None, gt=0)
    """Stop (checkpoint, export) once the warm start and loop have run this long; None: no limit.
    Comparisons at equal wall clock use it (benchmarks/learning_compare.py)."""
    target_eval_success: float | None = Field(default=None, gt=0, le=1)
    """Stop (checkpoint, export) at the first periodic evaluation that reaches this success; None:
    never. A curriculum stage's exit (benchmarks/mixed_hour.py)."""
    batch_timeout_s: float = Field(default=300.0, gt=0)
    """The learner trains on what it has after waiting this long for a full batch."""
    max_failures: int = Field(default=3, ge=0)
    """Times the job recovers by itself, in the same job, when the buffer or a learner rank dies
    or hangs, or no sample comes (run.stall_timeout_s): every actor is torn down and rebuilt from
    the newest checkpoint that verifies, as `--resume` would (like Ray Train's
    FailureConfig.max_failures). 0: the run stops and names the `--resume` command."""
    max_groups_without_signal: int | None = Field(default=32, ge=1)
    """Stop the run (checkpointed, policy exported, exit NO_SIGNAL_EXIT, naming the likely cause: a
    collapsed format, tasks all solved or all failed) once this many groups in a row were dropped
    for carrying no signal (learner.algorithm.drop_zero_variance_groups); None: wait
    (run.stall_timeout_s still applies).
    A policy at success p gives 32 flat groups of G in a row with probability (p^G + (1-p)^G)^32:
    1e-3 at p = 0.05, G = 4 (jobs.recorder.SignalWatch). Under grpo_window, whose episodes are
    groups sharing their baseline, it counts in `window`s of episodes (Algorithm.flat_streak_scale)."""
    stall_timeout_s: float = Field(default=1800.0, gt=0)
    """No sample at all for this long stops the run (checkpointed, exit 1, naming what the workers
    and the buffer report) instead of waiting forever."""
    max_nonfinite_steps: int = Field(default=3, ge=1)
    """Stop the run after this many learner steps in a row skipped for a non-finite loss or
    gradient norm or a batch without a trainable token (its latest checkpoint holds the last good
    version); each is skipped (no update, no publish) and counted (`nonfinite_steps`,
    `empty_batches`)."""
    stop_timeout_s: float = Field(default=120.0, gt=0)
    """After SIGINT/SIGTERM the run checkpoints and exports; if that has not ended within this, the
    process exits at once (jobs.train.StopSignals). `ray job stop` sends SIGKILL
    $RAY_JOB_STOP_WAIT_TIME_S (Ray's default: 3) seconds after its SIGTERM: raise that on the head
    to let a stopped job checkpoint."""
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = 9400
    """None: no Prometheus endpoint."""
    tensorboard: bool = False
    """Also write every step record as TensorBoard scalars under RUN_DIR/tensorboard (needs the
    `tensorboard` extra); `tensorboard --logdir runs/` then shows every run."""
    wandb: WandbConfig | None = None
    """Also log to Weights & Biases (jobs/wandb_log.py; needs the `wandb` extra); None: off."""
    log_level: LogLevel = "error"
    """The lowest level of the workers' third-party output (vLLM, torch, Ray) printed on the console:
    error, warning or info (everything; `--verbose`). Every line is kept in RUN_DIR/logs/workers.log
    whatever the level (jobs/console.py); the job's own lines are always printed."""
    export_best: bool = False
    """After each periodic evaluation (the warm start's too) that beats every earlier one, export
    the policy to RUN_DIR/best_hf and its version and success to best.json (the final policy is
    still RUN_DIR/hf). The best of several noisy evaluations is biased upwards: measure it again
    on other tasks before reporting it (jobs.build_teacher keeps the better of best and final)."""
    report: bool = True
    """When the job ends (a signal's stop included), write jobs.report's figures and report.md into
    the run directory; the end summary names them."""


class JobConfig(BaseModel):
    """A whole training job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelConfig = ModelConfig()
    env: EnvSection = Field(default_factory=default_env_config)
    """The environment every part of the job builds: `name` picks a registered one (envs.registry)."""
    rollout: RolloutConfig = RolloutConfig()
    teacher: TeacherConfig | None = TeacherConfig()
    """The default teacher; None with no teacher, or when `teacher_routes` route every task."""
    teacher_routes: tuple[TeacherRoute, ...] = ()
    """More teachers, each scoring the samples its route matches (teacher.routing)."""
    judge: JudgeConfig | None = None
    """The turn judge of algorithms that train on judged turn rewards (turn_judge)."""
    buffer: BufferConfig = BufferConfig()
    learner: LearnerConfig = LearnerConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    aggregate: AggregateConfig = AggregateConfig()
    cluster: ClusterConfig = ClusterConfig()
    run: RunConfig = RunConfig()

    @model_validator(mode="before")
    @classmethod
    def _admission_facts(cls, data: Any) -> Any:
        """What admission knows of the rest of the job, each unless set in `buffer`.
        samples_per_episode_prior is the rollout's turn limit: admission's estimate of an
        episode's samples until the first episodes finish. An untrained student runs its episodes
        to the limit; the generic prior (4) let the tiny default's first wave start 16 episodes of
        10 turns against room for 96 samples, and 112 of the 440 samples its first 10 steps put
        went stale (docs/architecture.md, admission).
        weights_lag is run.publish_every - 1: how far behind the learner's the weights a sample
        starts from may be (buffer.core.AdmissionController)."""
        if not isinstance(data, dict):
            return data
        buffer = data.get("buffer", {})
        if isinstance(buffer, BufferConfig):
            given, buffer = buffer.model_fields_set, buffer.model_dump(exclude_unset=True)
        elif isinstance(buffer, dict):
            given = set(buffer)
        else:
            return data
        facts = {}
        if "samples_per_episode_prior" not in given:
            rollout = data.get("rollout", {})
            if isinstance(rollout, dict):
                loop = rollout.get("loop", {})
                facts["samples_per_episode_prior"] = (loop.get("max_turns", RolloutConfig().loop.max_turns)
                                                      if isinstance(loop, dict) else loop.max_turns)
            else:
                facts["samples_per_episode_prior"] = rollout.loop.max_turns
        if "weights_lag" not in given:
            run = data.get("run", {})
            publish_every = run.get("publish_every", RunConfig().publish_every) if isinstance(run, dict) else run.publish_every
            if isinstance(publish_every, int) and publish_every >= 1:  # else RunConfig names the error
                facts["weights_lag"] = publish_every - 1
        return {**data, "buffer": {**buffer, **facts}}

    @property
    def teachers(self) -> list[TeacherConfig]:
        """The default teacher (if any), then the routed ones."""
        return ([self.teacher] if self.teacher is not None else []) + [r.teacher for r in self.teacher_routes]

    @model_validator(mode="after")
    def _rounds_within_staleness(self) -> "JobConfig":
        if self.run.publish_every > self.buffer.max_staleness + 1:
            # Between publishes every fresh sample comes from the last published weights; once those
            # are more than Δmax versions old the buffer drops them all and the learner waits for ever.
            raise ValueError(f"run.publish_every={self.run.publish_every} keeps the workers' weights that many steps, "
                             f"past buffer.max_staleness={self.buffer.max_staleness}: the later steps of each round "
                             f"would find every sample too stale; set run.publish_every <= buffer.max_staleness + 1")
        if self.buffer.weights_lag > self.buffer.max_staleness:
            raise ValueError(f"buffer.weights_lag={self.buffer.weights_lag} exceeds buffer.max_staleness="
                             f"{self.buffer.max_staleness}: a sample from weights that old is stale before it starts; "
                             f"leave it unset (run.publish_every - 1)")
        return self

    @model_validator(mode="after")
    def _a_clock_for_the_schedule(self) -> "JobConfig":
        # A warm start alone (run.steps=0) has no main loop for the schedule to end.
        if self.learner.schedule_end == "wall_clock" and self.run.steps and \
                (self.learner.schedule != "cosine" or self.run.max_wall_s is None):
            raise ValueError(f"learner.schedule_end=wall_clock ends the cosine with the run's wall clock: it needs "
                             f"learner.schedule=cosine (got {self.learner.schedule}) and run.max_wall_s (got "
                             f"{self.run.max_wall_s})")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> "JobConfig":
        algorithm = self.learner.algorithm
        if self.run.steps == 0 and not self.warm_start.num_episodes:
            raise ValueError("run.steps=0 trains the warm start alone, and there is none: set warm_start.num_episodes")
        if ALGORITHMS[algorithm.name].uses_teacher(algorithm) and self.teacher is None and not self.teacher_routes:
            raise ValueError(f"learner.algorithm.name={algorithm.name} needs a teacher (set the teacher section)")
        uses_judge = ALGORITHMS[algorithm.name].uses_judge(algorithm)
        if uses_judge and self.judge is None:
            raise ValueError(f"learner.algorithm.name={algorithm.name} needs a judge (set the judge section)")
        if self.cluster.plan.judge.count and (self.judge is None or self.judge.serve is None):
            raise ValueError("cluster.plan.judge reserves a bundle for a judge that serves its own model: set "
                             "judge.serve, or judge.count=0")
        if self.judge is not None and not uses_judge:
            raise ValueError(f"the judge section is set but learner.algorithm.name={algorithm.name} uses no judge "
                             f"(turn_judge does); remove it (judge: null)")
        if self.teacher_routes:
            env = make_env(self.env)
            check_routes(self.teacher_routes, self.teacher is not None, env.task_types, env.splits)
            if ALGORITHMS[algorithm.name].schedule is not None:
                raise ValueError(f"learner.algorithm {algorithm.name} stops its one teacher on a schedule of its own: "
                                 f"teacher_routes cannot be combined with it")
        if algorithm.topk_kl_coef and (not self.teachers or not all(t.top_k for t in self.teachers)):
            raise ValueError("learner.algorithm.topk_kl_coef > 0 needs every teacher's top-k: set teacher.top_k > 0 "
                             "(and teacher_routes[*].teacher.top_k)")
        self.aggregate.check(algorithm, self.warm_start.num_episodes, ALGORITHMS[algorithm.name].behaviour_free(algorithm))
        if self.rollout.loop.working_memory:
            if any(not teacher_backend(t.backend).scores_text for t in self.teachers):
                raise ValueError("rollout.loop.working_memory: the oracle teacher scores tool calls against the "
                                 "environment's expert and has no answer for a memory turn; use a model teacher "
                                 "(teacher.backend=hf|vllm|remote) or turn working memory off")
        if self.rollout.segments:
            ALGORITHMS[algorithm.name].segment_stage_factories(algorithm)  # raises for algorithms without them
        if ALGORITHMS[algorithm.name].episode_groups and self.rollout.group_size != 1:
            raise ValueError(f"learner.algorithm.name={algorithm.name} makes each episode a group of its own (its "
                             f"baseline comes from the episodes that ended before it): set rollout.group_size=1, "
                             f"got {self.rollout.group_size}")
        rollout = self.rollout
        self.env.check_rollout(rollout)
        # vLLM rejects a longer prompt with an error, which would fail the teacher scoring a whole
        # turn (prompt and response: the rollout's budget) mid-run (the engine's own: RolloutConfig).
        for where, t in [("teacher", self.teacher)] + [(f"teacher_routes[{i}].teacher", r.teacher)
                                                        for i, r in enumerate(self.teacher_routes)]:
            limit = None if t is None else teacher_backend(t.backend).context_limit(t)
            if limit is not None and rollout.loop.max_context_tokens > limit[1]:
                raise ValueError(f"rollout.loop.max_context_tokens ({rollout.loop.max_context_tokens}) must be <= "
                                 f"{where}.{limit[0]} ({limit[1]})")
        env_plan, plan = self.cluster.plan.env, self.cluster.plan
        if env_plan.count and not rollout.env_actors:
            raise ValueError("cluster.plan.env reserves bundles for environment actors but rollout.env_actors is "
                             "false: set rollout.env_actors=true, or cluster.plan.env.count=0")
        expected = plan.rollout.count * rollout.num_env_actors
        if rollout.env_actors and env_plan.count not in (0, expected):
            raise ValueError(f"cluster.plan.env.count must be {expected} (rollout workers {plan.rollout.count} x "
                             f"rollout.num_envs {rollout.num_envs} x 2: a set for rollout, one for evaluations), "
                             f"or 0 to leave environment actors unreserved; got {env_plan.count}")
        return self


class Checks:
    """What a dry run found: each check that failed (name: problem) and each it could not run
    (and why). A real start has none: its first failing check raises."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.not_run: list[str] = []

    def run(self, name: str, check: Callable[[], Any]) -> Any:
        try:
            return check()
        except ValueError as exc:
            self.failed.append(str(exc) if str(exc).startswith(name) else f"{name}: {exc}")
            return None


def preflight(config: JobConfig, dry: Checks | None = None) -> None:
    """Checks that need the machine rather than the config alone, before any actor starts: Hub
    models are fetched into the cache, the models and their tokenizers load (path, chat
    template), remote teachers and the judge answer (and a remote teacher's context holds the
    prompt budget), the environment builds and has the train and eval splits, and the metrics
    port is free. ValueError names the first problem.

    `dry` (a dry run): nothing is downloaded; every check runs and records its problem there;
    a check that needs a model that is missing (or not in the cache yet) is said not run."""
    import socket

    def check(name: str, body: Callable[[], Any]) -> Any:
        return body() if dry is None else dry.run(name, body)

    unavailable, student = _check_models(config, check, dry)
    _check_teachers(config, check, dry, unavailable, student)
    _check_privileged(config, check)
    if config.judge is not None and config.judge.serve is None:
        # reachable, model served, key accepted (a served judge is checked once its server is up)
        if config.model.path in unavailable:
            dry.not_run.append(f"judge ({config.judge.backend}): needs the student's tokenizer")
        else:
            check(f"judge ({config.judge.backend})", lambda: _check_judge(config))
    check("rollout.split", lambda: check_split(config.env, config.rollout.split, "rollout.split"))
    check("run.eval_split", lambda: check_split(config.env, config.run.eval_split, "run.eval_split"))
    algorithm = ALGORITHMS[config.learner.algorithm.name]
    if algorithm.schedule is not None and config.teacher is not None:
        # Built as the run builds it, with what SR_T needs checked instead of measured.
        check("learner.algorithm schedule", lambda: algorithm.schedule(
            config.learner.algorithm, lambda: _teacher_success_known(config), None))
    if algorithm.curriculum is not None:  # B2F reads its expert trajectories here
        check("curriculum", lambda: algorithm.curriculum(config.learner.algorithm))
    _check_loggers(config, check)
    if config.run.metrics_port is not None:
        def port_free() -> None:
            with socket.socket() as probe:
                try:
                    probe.bind((config.run.metrics_host, config.run.metrics_port))
                except OSError as exc:
                    raise ValueError(f"run.metrics_port {config.run.metrics_port} on {config.run.metrics_host} is not "
                                     f"free ({exc.strerror}); choose another or set run.metrics_port=null") from exc

        check("run.metrics_port", port_free)


def _check_privileged(config: JobConfig, check: Callable[[str, Callable[[], Any]], Any]) -> None:
    """Each privileged context asked for (the student's, each teacher's): the skill bank loads,
    and the environment has a map if one is asked for."""
    from envs.privileged import PrivilegedContext

    for where, privileged in [("rollout.loop.privileged", config.rollout.loop.privileged)] + \
            [("teacher.privileged", t.privileged) for t in config.teachers]:
        if privileged.enabled:
            def loads() -> None:
                try:
                    PrivilegedContext(privileged).check(make_env(config.env))
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None

            check(where, loads)


def _check_loggers(config: JobConfig, check: Callable[[str, Callable[[], Any]], Any]) -> None:
    """The optional packages the run's loggers need are installed."""
    import importlib.util

    if config.run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        check("run.tensorboard", lambda: _raise("run.tensorboard is true but the tensorboard package is not "
                                                "installed: pip install -e '.[tensorboard]', or set run.tensorboard=false"))
    wandb = config.run.wandb
    if wandb is not None and wandb.mode != "disabled" and importlib.util.find_spec("wandb") is None:
        check("run.wandb", lambda: _raise("run.wandb is set but the wandb package is not installed: pip install -e "
                                          "'.[wandb]', or remove run.wandb"))


def _check_models(config: JobConfig, check: Callable, dry: Checks | None) -> tuple[set[str], Any]:
    """Hub names are downloaded here, once, before any actor reads them from the cache (not in a
    dry run: there a model missing from the cache is unavailable). Returns (the paths of the
    models unavailable, the student's tokenizer or None)."""
    from models.loading import fetch_model, load_tokenizer, resolve_model_dir

    unavailable: set[str] = set()
    for model in [config.model] + [t.model for t in config.teachers if teacher_backend(t.backend).loads_model] + \
            ([config.judge.serve.model] if config.judge is not None and config.judge.serve is not None else []):
        if dry is None:
            fetch_model(model)
        elif model.path not in unavailable and check(f"model {model.path}", lambda: resolve_model_dir(model)) is None:
            unavailable.add(model.path)
    student = None
    if config.model.path not in unavailable:
        student = check("model.path tokenizer", lambda: load_tokenizer(config.model))
    return unavailable, student


def _check_teachers(config: JobConfig, check: Callable, dry: Checks | None, unavailable: set[str], student) -> None:
    """What each teacher backend reaches answers; a model teacher's tokenizer and built manifest."""
    for i, teacher in enumerate(config.teachers):
        where = "teacher" if config.teacher is not None and i == 0 else "teacher_routes teacher"
        entry = teacher_backend(teacher.backend)
        if entry.check is not None:
            if student is None:
                dry.not_run.append(f"{where} ({teacher.backend}): needs the student's tokenizer")
            else:
                check(f"{where} ({teacher.backend})", lambda: _check_teacher_reach(config, teacher, student))
        if entry.loads_model:
            if teacher.model.path in unavailable:
                dry.not_run.append(f"{where} {teacher.model.path}: its model is not available")
            else:
                check(f"{where} {teacher.model.path}", lambda: _check_model_teacher(config, teacher, student))


def _raise(message: str) -> None:
    raise ValueError(message)


def _check_teacher_reach(config: JobConfig, teacher: TeacherConfig, student) -> None:
    """What the backend reaches answers, and accepts the job's longest context."""
    max_len = teacher_backend(teacher.backend).check(teacher, student)
    if max_len is not None and config.rollout.loop.max_context_tokens > max_len:
        raise ValueError(f"rollout.loop.max_context_tokens ({config.rollout.loop.max_context_tokens}) is longer "
                         f"than the {teacher.backend} teacher's context ({max_len} tokens): it would refuse to "
                         f"score long turns")


def _check_model_teacher(config: JobConfig, teacher: TeacherConfig, student) -> None:
    """Its tokenizer loads and is the student's (unless teacher.cross_tokenizer); a built teacher's manifest."""
    from models.loading import load_tokenizer, resolve_model_dir
    from teacher.privileged import check_built_teacher
    from teacher.service import check_same_tokenizer

    tokenizer = load_tokenizer(teacher.model)
    if student is not None and not teacher.cross_tokenizer:
        check_same_tokenizer(student, tokenizer)
    check_built_teacher(resolve_model_dir(teacher.model), teacher.privileged, config.env, config.rollout.loop.prompt)


def _teacher_success_known(config: JobConfig) -> float:
    """Preflight's stand-in for jobs.training.teacher_success: ValueError when the run could not
    measure the teacher's eval success (SR_T); 1.0 otherwise (nothing is measured here)."""
    from models.loading import resolve_model_dir
    from teacher.privileged import read_teacher_manifest

    teacher = config.teacher
    entry = teacher_backend(teacher.backend)
    if not entry.scores_text:  # the environment's expert is the teacher: its success is measured at start
        return 1.0
    if entry.loads_model and read_teacher_manifest(resolve_model_dir(teacher.model)) is not None:
        return 1.0
    raise ValueError(f"learner.algorithm {config.learner.algorithm.name} needs the teacher's eval success with "
                     f"privileged context (SR_T), which is unknown for this {teacher.backend} teacher (only a teacher "
                     f"built by jobs.build_teacher, or the oracle, tells it)")


def _check_judge(config: JobConfig) -> None:
    import asyncio

    from judge.registry import judge_backend

    async def check_judge() -> None:
        judge = judge_backend(config.judge.backend).build(config.judge, config.model, config.env)
        try:
            await judge.check()
        finally:
            await judge.close()

    asyncio.run(check_judge())


RESUME_MAY_CHANGE = ("run.", "cluster.address", "cluster.num_cpus")
"""Keys `--resume` accepts changed without `--allow-change` (a dotted key, or a section ending in
a dot): the run's length, cadence and outputs, and where it runs. Anything else (the model, the
algorithm, the data) would continue a checkpoint under settings it was not trained with."""


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(saved: JobConfig, config: JobConfig) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (saved value, new value) for every key whose value differs (run.dir aside:
    `--resume` names the directory)."""
    old, new = _flat(saved.model_dump(mode="json")), _flat(config.model_dump(mode="json"))
    return {key: (old.get(key), new.get(key)) for key in sorted(old.keys() | new.keys())
            if key != "run.dir" and old.get(key) != new.get(key)}


RUN_OUTPUTS = ("config.yaml", "checkpoints", "metrics.parquet", "warm_start.parquet", "summary.json", "hf",
               "warm_start_hf", "best_hf", "best.json", "tensorboard", "logs")
"""What a training run writes into run.dir (jobs.training); `--overwrite` removes these and nothing else."""


def used_run_dir(run_dir: Path) -> list[str]:
    """What a run left in `run_dir` that a new run would mix with (empty: unused)."""
    return [name for name in ("config.yaml", "checkpoints", "metrics.parquet") if (run_dir / name).exists()]


def remove_run_outputs(run_dir: Path) -> None:
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def check_run_dir(config: JobConfig, resume: bool, allow_change: tuple[str, ...] = (),
                  overwrite: bool = False) -> dict[str, tuple[Any, Any]]:
    """Before anything starts. A fresh run refuses a directory another run used (its `latest`
    checkpoint and metrics would mix with this run's) unless `overwrite` (run_job then removes
    the RUN_OUTPUTS there, once every check passed). A
    resume needs a checkpoint that verifies and a readable metrics.parquet, and refuses a config
    that differs from the run's config.yaml outside RESUME_MAY_CHANGE and `allow_change`.
    Returns the accepted changes; ValueError names the problem."""
    from jobs.records import read_records
    from jobs.training import latest_checkpoint

    run_dir = Path(config.run.dir)
    if not resume:
        used = used_run_dir(run_dir)
        if used and not overwrite:
            raise ValueError(f"run.dir {run_dir} holds another run ({', '.join(used)}): continue it with --resume "
                             f"{run_dir}, choose another run.dir, or pass --overwrite to start over there")
        return {}
    latest_checkpoint(run_dir)
    if (run_dir / "metrics.parquet").exists():
        read_records(run_dir / "metrics.parquet")
    try:
        saved = load_config(JobConfig, run_dir / "config.yaml")
    except ConfigError as exc:
        raise ValueError(f"--resume {run_dir}: its config.yaml no longer validates ({exc})") from None
    changes = config_changes(saved, config)
    allowed = RESUME_MAY_CHANGE + tuple(allow_change)
    refused = [key for key in changes if not any(key == a or (a.endswith(".") and key.startswith(a))
                                                  or key.startswith(a + ".") for a in allowed)]
    if refused:
        listed = "; ".join(f"{key}: {changes[key][0]!r} -> {changes[key][1]!r}" for key in refused)
        raise ValueError(f"--resume {run_dir}: the config differs from the one the run was trained with ({listed}). "
                         f"Continuing a checkpoint under other settings is refused unless you name the keys: "
                         f"--allow-change {','.join(refused)}")
    return changes


def check_cluster(config: ClusterConfig) -> str:
    """The plan fits the cluster the run would join (ValueError with need vs have); returns which
    one: the configured cluster (joined and left, no actor started) or the embedded node."""
    address = config.address or os.environ.get("RAY_ADDRESS")
    if address:
        import ray

        try:
            ray.init(address=address)
            available = ray.cluster_resources()
        except ConnectionError as exc:
            raise ValueError(f"no Ray cluster answers at {address}: {exc}") from None
        finally:
            ray.shutdown()
        where = f"the cluster at {address}"
    else:
        available = {"CPU": float(config.num_cpus), "GPU": 0.0}
        where = (f"the embedded node ({config.num_cpus} CPU, no GPU; set cluster.address or $RAY_ADDRESS to run "
                 f"on a cluster)")
    try:
        config.plan.check(available)
    except ValueError as exc:  # the plan is printed above it
        raise ValueError(f"{str(exc).splitlines()[0]} on {where}") from None
    return f"the plan fits {where}"


def dry_run(config: JobConfig, resume: bool, allow_change: tuple[str, ...]) -> int:
    """--dry-run: the resolved config and plan, then every check a real start makes before its
    first actor -- the run directory, preflight, the plan against the cluster -- each failure
    named, and each check that could not run said with why. Exit 2 when one failed."""
    print(dump_config(config))
    print(config.cluster.plan.describe())
    checks = Checks()
    checks.run("run.dir", lambda: check_run_dir(config, resume, allow_change))
    preflight(config, checks)
    fits = checks.run("cluster", lambda: check_cluster(config.cluster))
    print("dry run:", "every check passed" if not checks.failed else f"{len(checks.failed)} check(s) failed")
    for line in checks.failed:
        print(f"  FAILED   {line}")
    if fits:
        print(f"  ok       {fits}")
    for line in checks.not_run:
        print(f"  not run  {line}")
    return 2 if checks.failed else 0


def connect(config: ClusterConfig, namespace: str, plugins: tuple[str, ...] = (), log_level: LogLevel = "info"):
    """Join the configured cluster (or start an embedded node) in `namespace`, where the run's
    named actors live (`ray.get_actor("worker-0", namespace=...)`). Only the embedded node gets
    the loopback settings (cluster.local.LOOPBACK_ENV, Ray's auth turned off among them); a
    cluster is joined with the environment as the user set it. `plugins`: modules every worker
    process imports first (cluster/plugins.py); `log_level`: below `info`, the driver's Ray
    logger says only warnings (not "Started a local Ray instance")."""
    import logging

    from cluster.plugins import plugins_runtime_env

    runtime_env = plugins_runtime_env(plugins)
    logging_level = logging.INFO if log_level == "info" else logging.WARNING
    address = config.address or os.environ.get("RAY_ADDRESS")
    if address:
        import ray

        return ray.init(address=address, namespace=namespace, logging_level=logging_level,
                        **({"runtime_env": runtime_env} if plugins else {}))
    from cluster.local import init_local_ray

    return init_local_ray(num_cpus=config.num_cpus, namespace=namespace, runtime_env=runtime_env,
                          logging_level=logging_level)


def run_namespace(run: RunConfig) -> str:
    """The run's Ray namespace: its directory's name, so two runs on one cluster never share actor names."""
    return f"apprentice-{Path(run.dir).resolve().name}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML file with JobConfig sections")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved config and resource plan, and run every check a start makes "
                             "before its first actor (nothing is downloaded or started)")
    parser.add_argument("--resume", help="continue the run in this directory from its latest checkpoint")
    parser.add_argument("--allow-change", default="", metavar="KEY[,KEY...]",
                        help="with --resume: config keys (or sections, ending in '.') that may differ from the run's "
                             f"config.yaml, beyond {', '.join(RESUME_MAY_CHANGE)}")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in a run.dir another run used: its checkpoints, metrics, exports and "
                             "config.yaml are removed first (other files stay)")
    parser.add_argument("--miniature", action="store_true",
                        help="run the preset in miniature (jobs/miniature.py): tiny models, 2 steps, the same "
                             "plan, dtypes and code path, GPUs turned into CPU shares")
    parser.add_argument("--keep-gpus", action="store_true",
                        help="with --miniature: keep the plan's GPUs as Ray resources (a cluster that declares them)")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="a module of yours that registers an environment, algorithm or backend: imported here "
                             "before the config is validated and in every worker process of the job (repeatable)")
    parser.add_argument("--verbose", action="store_true",
                        help="print the workers' third-party output too (vLLM, torch, Ray): run.log_level=info")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    args = parser.parse_args(argv)
    config_path = args.config
    if args.resume and not config_path:
        config_path = str(Path(args.resume) / "config.yaml")
    if args.keep_gpus and not args.miniature:
        parser.error("--keep-gpus goes with --miniature")
    if args.allow_change and not args.resume:
        parser.error("--allow-change goes with --resume")
    if args.overwrite and args.resume:
        parser.error("--overwrite starts the run over; --resume continues it: pass one")
    transform = None
    if args.miniature:
        from functools import partial

        from jobs.miniature import miniature

        transform = partial(miniature, gpus="gpus" if args.keep_gpus else "cpu")
    try:
        import_plugins(tuple(args.plugin))
        config = load_config(JobConfig, config_path, args.overrides + ["run.log_level=info"] * args.verbose,
                             transform)
    except (ConfigError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.resume:
        config = config.model_copy(update={"run": config.run.model_copy(update={"dir": args.resume})})
    allow_change = tuple(key for key in args.allow_change.split(",") if key)
    if args.dry_run:
        return dry_run(config, bool(args.resume), allow_change)
    return run_job(config, resume=bool(args.resume), overwrite=args.overwrite, allow_change=allow_change,
                   plugins=tuple(args.plugin))


class StopSignals:
    """SIGINT/SIGTERM: the first asks the run to stop after its step (checkpoint, `hf/`); a second
    one, or `stop_timeout_s` after the first (a step, an evaluation or a teardown that does not
    end), ends the process at once. Ray then removes the job's actors; the latest checkpoint
    and the metrics written with it stay."""

    def __init__(self, stop_timeout_s: float) -> None:
        self.requested = False
        self.stop_timeout_s = stop_timeout_s
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame) -> None:
        if self.requested:
            self._exit(signum, "again")
        self.requested = True
        print(f"signal {signum}: stopping after this step (at most {self.stop_timeout_s:.0f} s; a second signal "
              f"exits at once)", flush=True)
        timer = threading.Timer(self.stop_timeout_s, self._exit, (signum, f"{self.stop_timeout_s:.0f} s ago"))
        timer.daemon = True
        timer.start()

    @staticmethod
    def _exit(signum: int, when: str) -> None:
        print(f"signal {signum} {when}: exiting now; the latest checkpoint is kept", flush=True)
        os._exit(128 + signum)


def run_job(config: JobConfig, resume: bool = False, finish: Callable[[TrainingRun], None] | None = None,
            allow_change: tuple[str, ...] = (), overwrite: bool = False, plugins: tuple[str, ...] = ()) -> int:
    """Preflight, cluster, actors, the loop, close; the exit status (2: bad input, 1: the run
    stopped on a failure it names, NO_SIGNAL_EXIT: it stopped early because no group carried a
    learning signal any more, its policy exported as at a normal end). `finish` runs on the
    trained run before its actors stop (jobs.build_teacher measures the teacher there);
    `allow_change` and `overwrite`: check_run_dir; `plugins`: modules the driver imported, which
    every worker process imports too."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    status = _join_cluster(config, resume, allow_change, overwrite, plugins)
    if status is not None:
        return status
    stop = StopSignals(config.run.stop_timeout_s)
    limit = config.run.max_wall_s
    deadline = None if limit is None else time.monotonic() + limit

    def should_stop() -> bool:
        return stop.requested or (deadline is not None and time.monotonic() > deadline)

    return _train(config, resume, finish, should_stop, deadline)


def _join_cluster(config: JobConfig, resume: bool, allow_change: tuple[str, ...], overwrite: bool,
                  plugins: tuple[str, ...]) -> int | None:
    """Every check before any actor starts, then the cluster joined; an exit status when the job
    cannot start (2, with the reason on stderr), else None."""
    try:  # before any actor starts
        changes = check_run_dir(config, resume, allow_change, overwrite)
        preflight(config)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    namespace = run_namespace(config.run)
    context = connect(config.cluster, namespace, plugins, config.run.log_level)
    import ray

    if ray.util.list_named_actors():  # this namespace's, alive
        print(f"a run in Ray namespace {namespace} is already running on this cluster (its actors hold the "
              f"names); give this run another run.dir name", file=sys.stderr)
        return 2
    try:
        config.cluster.plan.check(ray.cluster_resources())
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if overwrite and not resume and used_run_dir(Path(config.run.dir)):
        print(f"--overwrite: removing the previous run's {', '.join(RUN_OUTPUTS)} from {config.run.dir}", flush=True)
        remove_run_outputs(Path(config.run.dir))
    for key, (old, new) in changes.items():
        print(f"resume: {key} changed from {old!r} to {new!r}", flush=True)
    print(banner(config, namespace, resume, context.dashboard_url), flush=True)
    print(config.cluster.plan.describe(), flush=True)
    return None


def banner(config: JobConfig, namespace: str, resume: bool = False, dashboard: str | None = None) -> str:
    """What is about to run and where to watch it (`dashboard`: the Ray dashboard's address, when
    the cluster serves one)."""
    teachers = ", ".join(t.backend for t in config.teachers) or "none"
    metrics = ("off" if config.run.metrics_port is None
               else f"http://{config.run.metrics_host}:{config.run.metrics_port}/metrics")
    return (f"apprentice: {config.learner.algorithm.name} on {config.env.name} ({config.rollout.split}), model "
            f"{config.model.path}, teacher {teachers}; {config.run.steps} steps"
            + (" in all, resumed from its newest checkpoint" if resume else
               f" after a {config.warm_start.num_episodes}-episode warm start" if config.warm_start.num_episodes else "")
            + f"\nrun dir {config.run.dir}; metrics {metrics}; status: python -m jobs.status {config.run.dir}"
            + f"\nray namespace {namespace}: actors buffer, learner-<rank>, worker-<i>, teacher-<j>"
            + (f"; dashboard http://{dashboard}" if dashboard else ""))


def end_summary(run: TrainingRun, wall_s: float, report: Path | None) -> list[str]:
    """The last lines of a job: versions, evaluations, wall clock, where the report is."""
    rows = run.recorder.rows
    lines = [f"run ended at version {run.version} ({len(rows)} learner steps recorded"
             + (f", after {run.warm_steps} warm-start SFT steps" if run.warm_steps else "")
             + f") in {wall_s:.0f} s"]
    evals = last_and_best_eval(rows)
    if evals:
        latest, best = evals
        lines.append(f"eval {latest.eval_success:.3f} at version {latest.version}, best {best.eval_success:.3f} at "
                     f"version {best.version}")
    if report is not None:
        lines.append(f"report {report} and its figures")
    return lines


def _train(config: JobConfig, resume: bool, finish: Callable[[TrainingRun], None] | None,
           should_stop: Callable[[], bool], deadline: float | None) -> int:
    """The run, rebuilt from its newest checkpoint after each failure it can recover from, up to
    run.max_failures times, then its report and summary; the exit status. `deadline`: the
    time.monotonic() run.max_wall_s ends at, or None."""
    start = time.monotonic()
    logs = open_logs(config)
    try:
        with filtered_worker_logs(Path(config.run.dir), config.run.log_level):
            return _recovering(config, resume, finish, should_stop, deadline, logs, start)
    finally:
        for log in logs:
            log.close()


def open_logs(config: JobConfig) -> list[RunLog]:
    """TensorBoard and W&B as the run asks, one each for the whole job (its recoveries too)."""
    run_dir = Path(config.run.dir)
    logs = []
    if config.run.tensorboard:
        from jobs.tensorboard import TensorBoardLog

        logs.append(TensorBoardLog(run_dir / "tensorboard"))
    if config.run.wandb is not None and config.run.wandb.mode != "disabled":
        from jobs.wandb_log import WandbLog

        logs.append(WandbLog(config.run.wandb, run_dir, config.model_dump(mode="json")))
    return logs


def _recovering(config: JobConfig, resume: bool, finish: Callable[[TrainingRun], None] | None,
                should_stop: Callable[[], bool], deadline: float | None, logs: list[RunLog], start: float) -> int:
    import ray

    from jobs.recorder import NoLearningSignal, NonFiniteTraining
    from jobs.training import RunStalled, TrainingRun
    from learner.group import LearnerHung

    recoveries, faults = 0, {}
    while True:
        run = TrainingRun(config, resume=resume, recoveries=recoveries, faults=faults, logs=logs)
        recovering = False
        try:
            run.start(should_stop)
            run.loop(should_stop, deadline)
            if finish is not None:
                finish(run)
            break
        except NonFiniteTraining as exc:  # the same data would do it again: no recovery
            print(f"run stopped: {exc}", file=sys.stderr, flush=True)
            return 1
        except NoLearningSignal as exc:  # the same policy would do it again: no recovery
            print(f"run stopped: {exc}", file=sys.stderr, flush=True)
            return NO_SIGNAL_EXIT
        # A dead rank can surface elsewhere first: the workers fail on the weights it owned, and
        # the pool gives up on them (RuntimeError) before the driver calls the rank again.
        except (RunStalled, LearnerHung, ray.exceptions.RayError, RuntimeError) as exc:
            cause = run.failure(exc)
            if cause is None:
                raise
            if recoveries >= config.run.max_failures or should_stop():
                print(f"run stopped: {cause}; continue with: python -m jobs.train --resume {run.dir} (from its "
                      f"newest checkpoint)", file=sys.stderr, flush=True)
                return 1
            recoveries += 1
            recovering = True
            faults = run.fault_totals()
            print(f"recovery {recoveries}/{config.run.max_failures}: {cause}; every actor is rebuilt from the "
                  f"newest checkpoint", flush=True)
        finally:
            run.close(wait=recovering)
        resume = (Path(config.run.dir) / "checkpoints" / "latest").exists()
    report = None
    if config.run.report and (run.dir / "metrics.parquet").is_file():
        from jobs.report import FIGURES, load_run, write_report

        report = write_report([load_run(run.dir, run.dir.name)], run.dir)
        for log in logs:
            log.figures([run.dir / f"{name}.png" for name in FIGURES], run.version)
    print("\n".join(end_summary(run, time.monotonic() - start, report)), flush=True)
    print(json.dumps({"final_version": run.version, "run_dir": str(run.dir)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
