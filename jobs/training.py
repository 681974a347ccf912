"""One training run: the services it builds, its driver loop, its checkpoints.

The loop (`TrainingRun.loop`) and its back-pressure. Rollout workers run on their own from the
start; the driver's loop is the learner's:

    rollout worker (each, on its own)             driver: TrainingRun.loop
    ---------------------------------             ------------------------
    ask the buffer to admit a whole group         wait for B fresh samples   <- the learner's
      (room for (Δmax + v - v0 + 1)·B samples       (1 s polls: a stop or a      only wait
       at learner version v; refused: back off)     dead worker is seen)
    load the published weights, if newer          one optimizer step on every rank: v += 1
                                                    (with jobs.aggregate: on the fresh samples
                                                     and past ones drawn beside them)
    generate the group's episodes                 publish the weights (one object-store put;
    the algorithm's group-end stages                every worker acknowledges)
      (advantages, teacher / judge scoring)       buffer.set_version(v): drops the too stale
    put the group into the buffer  ---------->    record, export, one log line (StepRecorder)
                                                  every eval_every: greedy eval; the
                                                    algorithm's schedule hook (after_step)
                                                  every checkpoint_every: checkpoint

Admission bounds the samples in flight, so rollout runs at most Δmax versions ahead and never
waits for the learner otherwise; the driver publishes before it moves the buffer's version, so
a group admitted for version v starts on v's weights. On SIGINT/SIGTERM and at the end the
learner checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from cluster.files import write_atomic
from jobs.config import dump_config
from jobs.recorder import NoLearningSignal, SignalWatch, StepRecorder
from jobs.records import RunLog, StepRecord, read_records, write_records
from learner.trainer import PREVIOUS, check_checkpoint


def wait_until_dead(actor, timeout_s: float = 60.0) -> None:
    """Return once calls to a killed actor fail (ray.kill takes effect asynchronously)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            return
        except ray.exceptions.GetTimeoutError:
            # A call to an actor with max_task_retries=-1 (the services) is retried while Ray
            # learns of the kill, and may outlast one wait on a loaded machine.
            continue
        time.sleep(0.2)
    raise TimeoutError(f"a killed actor still answers after {timeout_s} s")


def teacher_success(config) -> float:
    """The teacher's eval success, for a schedule that asks (RetireOPD's SR_T): a built teacher's
    (jobs.build_teacher measured it, with its privileged context, on its eval split); or the
    environment expert's success on the eval split when the oracle (the expert itself) is the teacher."""
    from actors.agent_loop import EpisodeTask, run_episodes
    from actors.expert import ExpertPolicy
    from envs.registry import make_env
    from models.loading import resolve_model_dir
    from teacher.privileged import read_teacher_manifest
    from teacher.registry import teacher_backend

    if teacher_backend(config.teacher.backend).scores_text:  # preflight checked the manifest is there
        return max(read_teacher_manifest(resolve_model_dir(config.teacher.model))["teacher_success"], 1e-6)
    tasks = [EpisodeTask(config.run.eval_split, seed) for seed in range(config.run.eval_tasks)]
    results = run_episodes(lambda: make_env(config.env), tasks, ExpertPolicy(), config.rollout.loop,
                           batch_size=32, progress="teacher success (SR_T): the expert")
    return max(sum(r.success for r in results) / len(results), 1e-6)


def _checkpoint_version(path: Path) -> int:
    return int(path.name.removeprefix("step_").removesuffix(PREVIOUS))


def latest_checkpoint(run_dir: Path) -> Path:
    """The run's newest checkpoint that verifies (`check_checkpoint`): a crash can leave the one
    `latest` names incomplete, or only its previous copy (`Trainer.save_checkpoint`), or a newer
    complete one that `latest` was not yet moved to. ValueError naming the problem when none
    verifies (the newest one's problem)."""
    checkpoints = Path(run_dir) / "checkpoints"
    latest = checkpoints / "latest"
    if not latest.exists():
        raise ValueError(f"--resume {run_dir}: no checkpoint there (missing {latest})")
    named = checkpoints / latest.read_text().strip()
    found = {p for p in checkpoints.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")} | {named}
    # Newest version first; at one version the checkpoint itself before its previous copy.
    first_error = None
    for path in sorted(found, key=lambda p: (-_checkpoint_version(p), p.name.endswith(PREVIOUS))):
        try:
            check_checkpoint(path)
            return path
        except ValueError as exc:
            first_error = first_error or exc
    raise first_error


def prune_checkpoints(checkpoints: Path, keep: int) -> list[Path]:
    """Remove all but the `keep` newest complete checkpoints, and what crashed saves left (a
    `.tmp` being written, a re-save's previous copy); returns what was removed. Called after a
    save completed, so no save is in progress."""
    complete = sorted((p for p in checkpoints.glob("step_*") if p.is_dir() and not p.name.endswith((".tmp", PREVIOUS))
                       and (p / "trainer_state.json").is_file()), key=_checkpoint_version, reverse=True)
    leftovers = [p for p in checkpoints.glob("step_*") if p.is_dir() and p.name.endswith((".tmp", PREVIOUS))]
    removed = complete[keep:] + leftovers
    for path in removed:
        shutil.rmtree(path)
    return removed


METRICS_EVERY_S = 30.0
"""metrics.parquet is rewritten at every checkpoint and, between them, after a step once this
long has passed (what `jobs.status` reads of a running job; the whole file each time)."""
SIGNAL_READ_EVERY_S = 5.0
"""How often a waiting driver reads the workers' group totals (SignalWatch: one call per worker)."""
BUFFER, JUDGE = "buffer", "judge"
"""The Ray names of the job's buffer and judge actors (in its namespace; jobs.train.run_namespace)."""


def teacher_name(key: int | str) -> str:
    """The Ray name of teacher service `key`: its bundle's index, or its route's name."""
    return f"teacher-{key}"


BEST_HF, BEST_JSON = "best_hf", "best.json"
"""run.export_best: the policy of the best periodic evaluation (a HF directory) and its version and
success, beside the final `hf`."""


def read_best(run_dir: Path) -> dict[str, float]:
    """The run's best periodic evaluation so far (run.export_best; -inf before any)."""
    path = run_dir / BEST_JSON
    return json.loads(path.read_text()) if path.is_file() else {"version": -1, "eval_success": float("-inf")}


class RunStalled(RuntimeError):
    """No sample reached the learner for run.stall_timeout_s."""


def clock_share(before: float, loop_start: float, deadline: float | None, now: float) -> float:
    """The share of the main loop's wall clock spent at `now` (learner.schedule_end): `before`,
    what the runs this one continues (a resume, a recovery) had spent, then this run's share of the
    rest, from its loop's start to run.max_wall_s's `deadline` (None: no clock, `before` stays)."""
    if deadline is None:
        return before
    left = max(0.0, deadline - now) / max(deadline - loop_start, 1e-9)
    return 1 - (1 - before) * min(1.0, left)


class TrainingRun:
    """Builds the actors of a JobConfig, runs learner steps, records metrics and checkpoints."""

    def __init__(self, config, resume: bool = False, recoveries: int = 0, faults: dict[str, int] | None = None,
                 logs: Sequence[RunLog] = ()) -> None:
        """`recoveries`: how many times the job rebuilt its actors before this one (jobs.train.run_job);
        `faults`: the FAULT_TOTALS the run it replaces had reached (`fault_totals`); `logs`: where
        step records also go (TensorBoard, W&B), opened and closed by the job, across recoveries."""
        from buffer.actor import create_buffer_actor
        from cluster.metrics import Metric, MetricsExporter
        from cluster.plan import reserve
        from learner.algorithms import ALGORITHMS
        from learner.group import LearnerGroup

        self.config = config
        self.dir = Path(config.run.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        # On a resume, the config it goes on with (jobs.train.check_run_dir accepted its changes).
        write_atomic(self.dir / "config.yaml", lambda tmp: tmp.write_text(dump_config(config)))
        plan = config.cluster.plan
        self.placement_groups, strategies = reserve(plan)
        self.algorithm = ALGORITHMS[config.learner.algorithm.name]
        self.metrics = MetricsExporter(config.run.metrics_host, config.run.metrics_port,
                                       [Metric(g.name, "gauge", g.help) for g in self.algorithm.gauges])
        self.recoveries = recoveries
        self.metrics.inc("job_recoveries", recoveries)  # a new exporter each time: the job's total
        self.buffer = create_buffer_actor(config.buffer, name=BUFFER)
        algorithm = config.learner.algorithm
        self.schedule = None
        """The algorithm's TeacherSchedule (learner/algorithms.py): a resume reads its state back
        first, so a teacher it stopped is not started again."""
        if self.algorithm.schedule is not None:
            state = check_checkpoint(latest_checkpoint(self.dir))["extra"]["schedule"] if resume else None
            self.schedule = self.algorithm.schedule(algorithm, lambda: teacher_success(config), state)
        self._plan, self._strategies = plan, strategies
        routed = self._start_teachers()
        self.judge = self._start_judge()
        self.pool = self._start_pool(routed)
        self.teachers += list(routed.values())  # their stats, restarts and the final kill too
        self.learner = LearnerGroup(plan.learner.count, config.learner, config.model, num_cpus=plan.learner.cpus,
                                    num_gpus=plan.learner.gpus, placement=strategies["learner"], named=True)
        if not self.teacher_active:
            self._give_teacher_bundles_to_rollout()
        self.logs = tuple(logs)
        self._metrics_written = time.monotonic()
        limit, algorithm = config.run.max_groups_without_signal, config.learner.algorithm
        self.signal = SignalWatch(None if limit is None else limit * self.algorithm.flat_streak_scale(algorithm))
        self._signal_read = 0.0
        self.recorder = StepRecorder(self.metrics, recoveries, faults)
        self.version = 0
        self.warm_steps = 0
        """Learner versions spent on the warm start (run.steps counts the versions after it)."""
        self.clock = 0.0
        """The share of the main loop's wall clock spent at the last step (`loop`), kept by checkpoints."""
        self.target_reached = False
        """An evaluation reached run.target_eval_success: the loop ends."""
        self.aggregate = None
        """The past data every main-loop batch carries (jobs.aggregate), once made."""
        if resume:
            self._resume()

    def _start_teachers(self) -> dict[str, Any]:
        """`self.teachers`: one service per teacher bundle, when the algorithm's stages score with a
        teacher and its schedule has not stopped it (rollout worker i sends its groups to teacher i
        mod M). Returns the routed teachers: one service each, without a bundle (remote servers
        or the oracle), by route name."""
        from teacher.service import create_teacher_service

        config, plan, algorithm = self.config, self._plan, self.config.learner.algorithm
        self.teachers = []
        if config.teacher is not None and self.algorithm.uses_teacher(algorithm) and self.teacher_active:
            self.teachers = [create_teacher_service(config.teacher, config.model, config.env, name=teacher_name(j),
                                                    prompt=config.rollout.loop.prompt, named=True,
                                                    num_cpus=plan.teacher.cpus, num_gpus=plan.teacher.gpus,
                                                    scheduling_strategy=self._strategies["teacher"][j])
                             for j in range(plan.teacher.count)]
        if not self.algorithm.uses_teacher(algorithm):
            return {}
        return {route.name: create_teacher_service(route.teacher, config.model, config.env,
                                                   name=teacher_name(route.name), prompt=config.rollout.loop.prompt,
                                                   named=True, num_cpus=0)
                for route in config.teacher_routes}

    def _start_judge(self):
        """The judge, when the algorithm's stages use one: one service, in the plan's judge bundle
        when it serves its own model; checked (its server answers, serves the model, takes the key)."""
        import ray

        from judge.service import create_judge_service

        if not self.algorithm.uses_judge(self.config.learner.algorithm):
            return None
        config, plan = self.config, self._plan
        judge = create_judge_service(config.judge, config.model, config.env, name=JUDGE, named=True,
                                     num_cpus=plan.judge.cpus, num_gpus=plan.judge.gpus,
                                     scheduling_strategy=self._strategies["judge"][0])
        ray.get(judge.check.remote())
        return judge

    def _start_pool(self, routed: dict[str, Any]):
        """The rollout workers, given the services by name (cluster/actor_names.py: Ray restarts them)."""
        from actors.pool import RolloutPool
        from cluster.actor_names import ActorName

        config, plan, strategies = self.config, self._plan, self._strategies
        rollout = config.rollout.model_copy(update={
            "vllm": config.rollout.vllm.model_copy(update={"tensor_parallel_size": plan.rollout_tensor_parallel})})
        return RolloutPool(plan.rollout.count, rollout, config.model, ActorName(BUFFER),
                           [ActorName(teacher_name(j)) for j in range(len(self.teachers))],
                           num_cpus=plan.rollout.cpus, num_gpus=plan.rollout.gpus, placement=strategies["rollout"],
                           env=config.env, algorithm=config.learner.algorithm, teacher_active=self.teacher_active,
                           named=True, routed_teachers={route: ActorName(teacher_name(route)) for route in routed},
                           routes=config.teacher_routes, judge=None if self.judge is None else ActorName(JUDGE),
                           env_placement=(plan.env.cpus, strategies["env"]) if plan.env.count else None)

    @property
    def teacher_active(self) -> bool:
        return self.schedule is None or self.schedule.teacher_active()

    def loss_config(self, step: int):
        """The loss the learner trains with at main-loop step `step` (0: the first after the warm
        start): the configured one, or its schedule's."""
        algorithm = self.config.learner.algorithm
        return algorithm if self.schedule is None else self.schedule.loss_config(algorithm, step)

    def _give_teacher_bundles_to_rollout(self) -> int:
        """One rollout worker per teacher bundle; none when the teacher role reserved nothing (an
        extra engine would only share the cores the others use). Returns how many started."""
        plan = self._plan
        if not plan.teacher.reserves:
            return 0
        self.pool.add_workers(plan.teacher.count, num_cpus=plan.teacher.cpus, num_gpus=plan.teacher.gpus,
                              placement=self._strategies["teacher"])
        return plan.teacher.count

    def _stop_teacher(self) -> None:
        """The schedule is done with the teacher: no more teacher calls, the teacher actors go and
        their bundles run extra rollout workers."""
        import ray

        self.pool.stop_teacher()
        for teacher in self.teachers:
            ray.kill(teacher, no_restart=True)
        for teacher in self.teachers:  # gone for good before its bundle is reused
            wait_until_dead(teacher)
        num_teachers, self.teachers = len(self.teachers), []
        self.recorder.teachers_replaced()
        added = self._give_teacher_bundles_to_rollout()
        print(f"teacher stopped by the {self.config.learner.algorithm.name} schedule at version {self.version}: "
              f"{num_teachers} teacher service(s) stopped, {added} rollout worker(s) started in their place", flush=True)

    def _resume(self) -> None:
        path = latest_checkpoint(self.dir)
        named = (self.dir / "checkpoints" / "latest").read_text().strip()
        if path.name != named:
            print(f"checkpoint {named} does not verify; resuming from {path.name}, the newest that does", flush=True)
        extra = self.learner.load(str(path))
        self.version = self.learner.version()
        self.warm_steps = int(extra.get("warm_start_steps", 0))
        self.clock = float(extra.get("clock", 0.0))
        metrics = self.dir / "metrics.parquet"
        kept = [r for r in read_records(metrics) if r.version <= self.version] if metrics.exists() else []
        self.recorder.restore(kept)
        print(f"resumed from {path} at version {self.version} ({extra})", flush=True)
        if not self.teacher_active:
            print(f"the {self.config.learner.algorithm.name} schedule had stopped the teacher: no teacher service "
                  f"started", flush=True)

    def start(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        import ray

        if self.version == 0 and self.config.warm_start.num_episodes:
            self.warm_start(should_stop)  # publishes its weights (its evaluation runs on them)
        elif self.version > 0:  # resumed
            self.pool.publish_weights(self.learner.publish(), self.version)
        if self.version > 0:
            ray.get(self.buffer.begin.remote(self.version))
        self.pool.start(start_version=self.warm_steps)

    def warm_start(self, should_stop: Callable[[], bool]) -> None:
        """SFT on the bot's demonstrations (jobs.warm_start), then a checkpoint.

        A stop request ends it early; the checkpoint then holds a partial warm start, and a
        resumed run goes on with the main loop.
        """
        from jobs.console import progress_bar
        from jobs.warm_start import epoch_batches, num_steps, progress, step_lr
        from learner.algorithms import AlgorithmConfig

        ws = self.config.warm_start
        start = time.perf_counter()
        demos = self._demonstrations()
        if self.config.run.steps:  # a warm start alone (run.steps=0) has no batches to add them to
            self._start_aggregate(demos)
        total = num_steps(len(demos), ws)
        print(f"warm start: the expert solved {len(demos)}/{ws.num_episodes} episodes "
              f"({time.perf_counter() - start:.1f} s); {total} SFT steps"
              + (f" at most, {ws.max_wall_s:.0f} s in all" if ws.max_wall_s else ""), flush=True)
        sft = AlgorithmConfig(name="sft", aggregation=self.config.learner.algorithm.aggregation)
        rows = []
        # One bar, not a line per step (hundreds on the default); warm_start.parquet keeps each step.
        bar = progress_bar(total, "warm start: SFT", "step")
        base_lr = ws.lr or self.config.learner.lr
        sft_start = time.perf_counter()
        sft_s = None if ws.max_wall_s is None else ws.max_wall_s - (sft_start - start)
        for step, episodes in enumerate(epoch_batches(demos, ws)):
            done = progress(step, total, time.perf_counter() - sft_start, sft_s)
            if should_stop() or done >= 1:
                break
            row = self._sft_step(episodes, sft, step_lr(done, base_lr, ws))
            if row is not None:
                rows.append(row)
                bar.set_postfix(loss=f"{row['loss']:.4f}", refresh=False)
                bar.update(1)
        bar.close()
        self.warm_steps = self.version
        if not rows:
            if sft_s is not None and sft_s <= 0:
                print(f"warm start: no SFT step: collecting the demonstrations took {sft_start - start:.0f} s "
                      f"of warm_start.max_wall_s={ws.max_wall_s:.0f}", flush=True)
            return
        print(f"warm start: {len(rows)}/{total} SFT steps, loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}",
              flush=True)
        self.pool.publish_weights(self.learner.publish(), self.version)
        if self.config.run.eval_every:
            rows[-1]["eval_success"], rows[-1]["eval_success_by_type"] = self.evaluate()
            self._evaluated(rows[-1]["eval_success"], rows[-1]["eval_success_by_type"])
            print(f"warm start done at version {self.version} in {time.perf_counter() - start:.0f} s: "
                  f"eval {rows[-1]['eval_success']:.2f}", flush=True)
            for log in self.logs:
                log.scalar("eval/eval_success", rows[-1]["eval_success"], self.version)
        pq.write_table(pa.Table.from_pylist(rows), self.dir / "warm_start.parquet")
        self.checkpoint()
        if ws.export:
            self.learner.export_hf(str(self.dir / "warm_start_hf"))

    def _demonstrations(self) -> list:
        """The warm start's demonstrations (a resumed run makes them again for the aggregate)."""
        from jobs.warm_start import demonstrations
        from models.loading import load_tokenizer

        ws = self.config.warm_start
        demos = demonstrations(ws, self.config.rollout, self.config.env, load_tokenizer(self.config.model))
        if not demos:
            raise RuntimeError(f"warm start: the expert solved none of its {ws.num_episodes} episodes within "
                               f"rollout.loop.max_turns={self.config.rollout.loop.max_turns}")
        return demos

    def _start_aggregate(self, demos: list) -> None:
        """The aggregate (jobs.aggregate) when the config asks for one, drawing on `demos`."""
        from jobs.aggregate import Aggregate

        if self.config.aggregate.enabled:
            self.aggregate = Aggregate(self.config.aggregate, demos, self.config.teachers[0].top_k)

    def _sft_step(self, episodes: list, sft, lr: float) -> dict | None:
        """One warm-start step on these demonstrations: its warm_start.parquet row, or None when
        the learner skipped it (a non-finite loss)."""
        import ray

        from buffer.actor import SampleBatch, encode_trajectories

        encoded = encode_trajectories(episodes)
        batch = SampleBatch((ray.put((encoded.data,)),), (0,), (tuple(range(encoded.num_samples)),),
                            (encoded.policy_versions,))
        stats = self.learner.train(batch, sft, lr, num_minibatches=1)
        if stats["skipped"]:
            self.recorder.skipped(stats, self.version, self.config.run.max_nonfinite_steps)
            return None
        self.version = int(stats["version"])
        for log in self.logs:
            log.scalar("warm_start/loss", stats["loss"], self.version)
        return {"version": self.version, "loss": stats["loss"], "num_samples": encoded.num_samples,
                "num_loss_tokens": stats["num_loss_tokens"], "learner_step_s": stats["step_s"],
                "eval_success": None, "eval_success_by_type": None}

    def loop(self, should_stop: Callable[[], bool], deadline: float | None = None) -> None:
        """Learner steps until run.steps, a stop, or run.max_wall_s's `deadline` (time.monotonic())."""
        import ray

        run = self.config.run
        loop_start, clock_before = time.monotonic(), self.clock
        B = self.config.buffer.batch_size
        last = time.perf_counter()
        last_sample = time.monotonic()
        if self.config.aggregate.enabled and self.aggregate is None and self.version < self.warm_steps + run.steps:
            # resumed after the warm start, or none ran
            self._start_aggregate(self._demonstrations() if self.config.aggregate.num_demonstration_samples else [])
        while self.version < self.warm_steps + run.steps and not should_stop() and not self.target_reached:
            wait_start = time.perf_counter()
            batch = self._wait_for_batch(B, should_stop)
            idle = time.perf_counter() - wait_start
            if batch.num_samples:
                last_sample = time.monotonic()
            elif time.monotonic() - last_sample > run.stall_timeout_s and not should_stop():
                self._stalled(time.monotonic() - last_sample)
            if batch.num_samples < B:
                self._say_waiting(batch.num_samples, idle)
                if batch.num_samples == 0:
                    continue
            past = self.aggregate.draw() if self.aggregate is not None else None
            self.clock = clock_share(clock_before, loop_start, deadline, time.monotonic())
            stats = self.learner.train(batch if past is None else batch + past,
                                       self.loss_config(self.version - self.warm_steps), clock=self.clock)
            if stats["skipped"]:
                self.recorder.skipped(stats, self.version, self.config.run.max_nonfinite_steps)
                continue
            self.version = int(stats["version"])
            sync = self._publish() if self.version % run.publish_every == 0 else 0.0
            ray.get(self.buffer.set_version.remote(self.version))
            versions = [v for vs in batch.policy_versions for v in vs]
            if self.aggregate is not None:
                self.aggregate.keep(batch)
            row = self._record(stats, versions, idle, sync, time.perf_counter() - last,
                               0 if past is None else past.num_samples)
            last = time.perf_counter()
            step = self.version - self.warm_steps
            if run.eval_every and step % run.eval_every == 0:
                overall, by_type = self.evaluate()
                row = dataclasses.replace(row, eval_success=overall, eval_success_by_type=by_type)
                self._evaluated(overall, by_type)
            if self.schedule is not None and self.schedule.after_step(self.version, row.reverse_kl, row.eval_success):
                self._stop_teacher()
            self.recorder.rows.append(row)
            for log in self.logs:
                log.record(row)
            print(self._line(row), flush=True)
            if step % run.checkpoint_every == 0:
                self.checkpoint()  # writes the metrics too
            elif time.monotonic() - self._metrics_written > METRICS_EVERY_S:
                self.write_metrics()
        if (self.version - self.warm_steps) % run.checkpoint_every or \
                not (self.dir / "checkpoints" / "latest").exists():
            self.checkpoint()
        # The final policy as a HF directory: jobs.evaluate and the engines load it.
        self.learner.export_hf(str(self.dir / "hf"))

    def _evaluated(self, eval_success: float, by_type: dict[str, float]) -> None:
        """After a periodic evaluation: run.target_eval_success and run.export_best."""
        target = self.config.run.target_eval_success
        if target is not None and eval_success >= target:
            self.target_reached = True
            print(f"eval {eval_success:.2f} reached run.target_eval_success={target}: stopping", flush=True)
        if self.config.run.export_best and eval_success > read_best(self.dir)["eval_success"]:
            # Exported beside, then swapped in: a crash leaves the previous best or none, never a mix.
            best, staging = self.dir / BEST_HF, self.dir / f"{BEST_HF}.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            self.learner.export_hf(str(staging))
            shutil.rmtree(best, ignore_errors=True)
            staging.rename(best)
            record = json.dumps({"version": self.version, "eval_success": eval_success,
                                 "eval_success_by_type": by_type})
            write_atomic(self.dir / BEST_JSON, lambda tmp: tmp.write_text(record))

    def _say_waiting(self, num_samples: int, idle: float) -> None:
        """The learner got fewer samples than a batch: say so, with the likeliest cause when known."""
        totals = self.pool.group_totals()
        hint = ""
        if totals["num_groups_without_signal"]:
            hint = (f"; the workers dropped {totals['num_groups_without_signal']} of the "
                    f"{totals['num_groups_delivered']} groups they finished for carrying no signal (every "
                    f"episode got the same reward; learner.algorithm.drop_zero_variance_groups=false keeps them)")
        print(f"waiting for data: {num_samples}/{self.config.buffer.batch_size} samples after {idle:.0f} s{hint}",
              flush=True)

    def _publish(self) -> float:
        """The learner's weights to every worker (they apply them before their next round); seconds taken."""
        start = time.perf_counter()
        self.pool.publish_weights(self.learner.publish(), self.version)
        sync = time.perf_counter() - start
        if not self.recorder.rows:
            info = self.learner.published
            print(f"weights published in {'/'.join(info['dtypes'])}: {info['num_bytes'] / 2**20:.1f} MiB "
                  f"into the object store, {sync:.2f} s", flush=True)
        return sync

    def _stalled(self, waited_s: float) -> None:
        """No sample for run.stall_timeout_s: checkpoint, then RunStalled with what the workers
        and the buffer say (a hung actor is restarted by the pool; this catches what no timeout
        of one call does, e.g. every group admitted but never delivered)."""
        import ray

        totals = self.pool.group_totals()
        buffer = ray.get(self.buffer.stats.remote())
        path = self.checkpoint()
        raise RunStalled(
            f"no sample reached the learner for {waited_s:.0f} s (run.stall_timeout_s) at version {self.version}: "
            f"{len(self.pool.active)} rollout worker(s) in the pool ({len(self.pool.left)} left it), "
            f"{totals['num_groups_delivered']} groups delivered by their current incarnations, buffer "
            f"{int(buffer['num_resident'])} samples resident; checkpointed at {path}")

    def _watch_signal(self) -> None:
        """Every few seconds, the groups in a row dropped without signal (SignalWatch); at its limit
        the run checkpoints, exports its policy as at any end (a comparison evaluates it) and
        stops, naming the likely cause."""
        if time.monotonic() - self._signal_read < SIGNAL_READ_EVERY_S:
            return
        self._signal_read = time.monotonic()
        cause = self.signal.update(self.pool.group_totals())
        if cause is not None:
            path = self.checkpoint()
            self.learner.export_hf(str(self.dir / "hf"))
            raise NoLearningSignal(f"{cause} (version {self.version}, checkpointed at {path})")

    def _wait_for_batch(self, num_samples: int, should_stop: Callable[[], bool]):
        """Up to num_samples fresh samples, gathered in one-second waits so that a stop request
        or a failed rollout worker is seen within a second (not after run.batch_timeout_s)."""
        import ray

        from buffer.actor import EMPTY_BATCH

        deadline = time.monotonic() + self.config.run.batch_timeout_s
        batch = EMPTY_BATCH
        while batch.num_samples < num_samples and not should_stop():
            self.pool.poll()
            self._watch_signal()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            batch += ray.get(self.buffer.get.remote(num_samples - batch.num_samples, learner_version=self.version,
                                                    timeout_s=min(1.0, remaining)))
        return batch

    def _record(self, stats: dict, versions: list[int], idle: float, sync: float, wall: float,
                num_past_samples: int) -> StepRecord:
        # The loss config is the one this step trained with: the step before the version moved.
        gauges = self.algorithm.gauge_values(self.loss_config(self.version - self.warm_steps - 1),
                                             self.version - self.warm_steps)
        actors = {"buffer": self.buffer, "pool": self.pool, "teachers": self.teachers, "judge": self.judge}
        return self.recorder.record(self.version, stats, versions, {"idle": idle, "sync": sync, "wall": wall},
                                    actors, gauges, teacher_stopped=not self.teacher_active,
                                    num_past_samples=num_past_samples)

    def fault_totals(self) -> dict[str, int]:
        """FAULT_TOTALS as this run's last record has them, plus the rollout failures the pool saw
        since: a recovery carries them over. (Not polled again here: the pool may be half dead;
        a failure it has not seen yet is not counted.)"""
        return self.recorder.fault_totals(self.pool.num_failed_runs)

    def failure(self, exc: Exception) -> str | None:
        """What went wrong when the run cannot go on with these actors, or None when `exc` is not
        such a failure: the buffer or a learner rank died or hung, or no sample came.

        Neither the buffer nor a rank is recreated in place: the buffer holds the exactly-once
        group leases and the ranks hold the sharded model, so the job rebuilds every actor from
        the newest checkpoint (run.max_failures) or stops for `--resume`. When only the buffer
        died, the learner still holds the current weights and checkpoints them first, so no
        step is lost, provided that step was recorded: the buffer can die between a step and its
        record (which asks the buffer for its counts), and a checkpoint then would continue
        after a version metrics.parquet never holds; that step is trained again instead.
        """
        from learner.group import LearnerHung

        if isinstance(exc, (RunStalled, LearnerHung)):
            return str(exc)
        # An error that names no actor (an object a dead rank owned, workers that failed on its
        # weights) is the buffer's or a rank's failure only when one of them is dead.
        actor_id = getattr(exc, "actor_id", None) or self._dead_core_actor()
        if actor_id is None:
            return None
        if actor_id == self.buffer._actor_id.hex():
            lost = f"the replay buffer actor died ({type(exc).__name__}); the samples it held are lost"
            if self.recorder.rows and self.recorder.rows[-1].version == self.version:
                return f"{lost}; checkpointed version {self.version} at {self.checkpoint()}"
            return f"{lost}; version {self.version} was not recorded and is trained again from the newest checkpoint"
        for rank, actor in enumerate(self.learner.ranks):
            if actor_id == actor._actor_id.hex():
                return f"learner rank {rank} died ({type(exc).__name__}) at version {self.version}"
        return None

    def _dead_core_actor(self) -> str | None:
        """The id (hex) of the buffer or a learner rank that no longer answers at all, if one."""
        import ray

        for actor in [self.buffer, *self.learner.ranks]:
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=30)
            except ray.exceptions.RayActorError:
                return actor._actor_id.hex()
            except ray.exceptions.GetTimeoutError:
                continue  # busy, or hung: the call deadlines find a hang
        return None

    def evaluate(self) -> tuple[float, dict[str, float]]:
        """Greedy eval on run.eval_split: success overall and per task type (also exported)."""
        print(f"evaluating {self.config.run.eval_tasks} tasks of {self.config.run.eval_split} at version "
              f"{self.version}", flush=True)
        rows = self.pool.evaluate(self.config.run.eval_split, list(range(self.config.run.eval_tasks)))
        by_type: dict[str, list[bool]] = {}
        for r in rows:
            by_type.setdefault(r["task_type"], []).append(r["success"])
        rates = {task_type: sum(results) / len(results) for task_type, results in sorted(by_type.items())}
        for task_type, rate in rates.items():
            self.metrics.set("eval_success", rate, task_type=task_type)
        overall = sum(r["success"] for r in rows) / max(len(rows), 1)
        self.metrics.set("eval_success", overall, task_type="overall")
        return overall, rates

    @staticmethod
    def _line(row: StepRecord) -> str:
        def rate(value: float | None) -> str:
            return "  - " if value is None else f"{value:.2f}"

        line = (f"step {row.version:4d} loss {row.loss:+.4f} rkl {row.reverse_kl:.3f} "
                f"samples {row.num_samples:3d} stale<= {row.max_staleness} "
                f"train_sr {rate(row.train_success_rate)} fmt_err {rate(row.format_error_rate)} "
                f"learn {row.learner_step_s:.2f}s idle {row.learner_idle_s:.2f}s sync {row.weight_sync_s:.2f}s")
        if row.eval_success is not None:
            line += f" eval {row.eval_success:.2f}"
        # Totals since the run began, once there is one: a user sees each fault the job absorbed.
        restarts = {"rollout": row.rollout_failed_runs, "teacher": row.teacher_restarts, "env": row.env_restarts}
        if any(restarts.values()):
            line += " restarts " + " ".join(f"{name} {num}" for name, num in restarts.items())
        return line

    def checkpoint(self) -> Path:
        name = f"step_{self.version:06d}"
        extra = {"version": self.version, "warm_start_steps": self.warm_steps, "clock": self.clock}
        if self.schedule is not None:
            extra["schedule"] = self.schedule.state_dict()
        path = self.learner.save(str(self.dir / "checkpoints" / name), extra=extra)
        # `latest` is replaced atomically, and only once the checkpoint itself is complete.
        write_atomic(self.dir / "checkpoints" / "latest", lambda tmp: tmp.write_text(name))
        prune_checkpoints(self.dir / "checkpoints", self.config.run.keep_checkpoints)
        self.write_metrics()
        return Path(path)

    def write_metrics(self) -> None:
        if self.recorder.rows:
            write_records(self.dir / "metrics.parquet", self.recorder.rows)
        self._metrics_written = time.monotonic()

    def close(self, wait: bool = False) -> None:
        """Stop the workers, write the metrics, kill every actor and free the plan's resources;
        `wait`: return only once the actors are gone (a recovery reuses their names)."""
        import ray

        from cluster.plan import release

        try:
            if self.pool.workers:
                self.pool.stop()
        finally:
            self.write_metrics()
            self.metrics.close()
            summary = {"version": self.version, "steps": len(self.recorder.rows), "job_recoveries": self.recoveries}
            (self.dir / "summary.json").write_text(json.dumps(summary))
            actors = self.pool.workers + self.learner.ranks + [self.buffer] + self.teachers + \
                ([self.judge] if self.judge is not None else [])
            for actor in actors:
                ray.kill(actor)
            for actor in actors if wait else ():
                wait_until_dead(actor)
            release(self.placement_groups)
