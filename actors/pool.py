"""The rollout worker pool: N RolloutWorker actors, restarted when they die.

Each worker runs with Ray `max_restarts`; when one dies, its `run` call fails, Ray
restarts the actor (same arguments), and the pool calls `run` again. The restarted
worker asks the buffer for the groups it had leased and re-runs them before new ones,
and the buffer stores each group once (`put_group`): no episode is lost or duplicated.

A `run` that raises (its engine died, say: vLLM's engine core can fail under the actor)
leaves the actor alive but useless, so the pool kills it and lets Ray restart it like a
crashed one. A worker that failed more than `max_restarts` times in a row leaves the
pool and its leased groups go back to the buffer's admission (`abort_owner`), so the learner
does not wait for groups that will never come; with no worker left the job fails, naming
the last error. "In a row": a worker that finished an episode since its last failure starts
counting again (`FailuresInARow`), so a long run survives any number of spaced failures; Ray's
own restart count (lifetime) is unlimited, the pool decides.
"""

from __future__ import annotations

import time
from typing import Any

from actors.counters import GROUP_TOTALS
from actors.rollout_worker import RolloutConfig, RolloutWorker, WorkerSpec
from actors.routing import DEFAULT_ROUTE
from cluster.actor_names import resolve
from models.loading import ModelConfig

EXTRA_WORKER_SEEDS = 100_000_000
"""First task seed of workers added after the pool started (the first workers' streams,
i * num_workers + w, would need 10^8 groups to get there)."""


class FailuresInARow:
    """Failed runs per worker since it last made progress (finished an episode)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[int, int] = {}

    def failed(self, index: int) -> bool:
        """Count a failure; True while the worker may be restarted (at most `limit` in a row)."""
        self._counts[index] = self._counts.get(index, 0) + 1
        return self._counts[index] <= self.limit

    def progressed(self, index: int) -> None:
        self._counts.pop(index, None)

    def __getitem__(self, index: int) -> int:
        return self._counts.get(index, 0)


class RolloutPool:
    """Driver-side handle on the workers; worker i sends its groups to teacher i mod len(teachers),
    except the trajectories that `routes` send to one of `routed_teachers` (name -> service)."""

    def __init__(self, num_workers: int, config: RolloutConfig, model: ModelConfig, buffer, teachers=(),
                 num_cpus: float = 1.0, num_gpus: float = 0.0, max_restarts: int = 3,
                 placement: list[Any] | None = None, worker_cls: type = RolloutWorker, env=None,
                 algorithm=None, teacher_active: bool = True, named: bool = False,
                 routed_teachers: dict[str, Any] | None = None, routes: tuple = (), judge=None,
                 env_placement: tuple[float, list] | None = None) -> None:
        """`buffer`, `teachers`, `routed_teachers`' values and `judge`: handles, or names of the job's
        actors (cluster.actor_names); `env`, `algorithm`, `teacher_active` and `judge`: see
        `WorkerSpec`; `named`: worker i is the named actor `worker-<i>` (in the job's namespace);
        `env_placement`: (CPUs of each environment actor, the plan's strategies for them:
        `RolloutConfig.num_env_actors` per worker, in worker order). Workers added later (a stopped teacher's bundles) run theirs
        unreserved."""
        import ray

        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.config = config
        self.buffer = resolve(buffer)
        self._actor = ray.remote(worker_cls)
        self._shared = (config, model, buffer)
        self._env, self._algorithm = env, algorithm
        self.max_restarts = max_restarts
        self.named = named
        self._routed = (dict(routed_teachers or {}), tuple(routes))
        self._judge = judge
        self.workers = []
        per_worker = config.num_env_actors
        for i in range(num_workers):
            teacher = teachers[i % len(teachers)] if teachers else None
            envs = None if env_placement is None else \
                (env_placement[0], env_placement[1][i * per_worker:(i + 1) * per_worker])
            self.workers.append(self._new_worker(i, num_cpus, num_gpus, None if placement is None else placement[i],
                                                 teacher, (0, num_workers, i), teacher_active, envs))
        self._runs: dict[int, Any] = {}
        self._max_groups: int | None = None
        self._start_version = 0
        self._started = False
        self._stopping = False
        self.num_failed_runs = 0
        self._failures = FailuresInARow(max_restarts)
        self._weights: tuple[Any, int] | None = None
        """The latest published (ObjectRef of the weights, version)."""
        self._restarting: dict[int, Any] = {}
        """Workers restarting after a counted failure -> (a `pid` probe, the pid of the incarnation
        that failed if it was still alive): a probe answered by a new pid ends the restart."""
        self.left: dict[int, str] = {}
        """Workers that left the pool: index -> the error that ended them."""

    def _new_worker(self, index: int, num_cpus: float, num_gpus: float, strategy, teacher, stream: tuple[int, int, int],
                    teacher_active: bool = True, env_placement: tuple[float, list] | None = None):
        options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": -1,
                                   "max_task_retries": 0, "max_concurrency": 8}
        if self.named:
            options["name"] = f"worker-{index}"
        if strategy is not None:
            options["scheduling_strategy"] = strategy
        config, model, buffer = self._shared
        routed, routes = self._routed if teacher_active else ({}, ())
        teachers = {**({DEFAULT_ROUTE: teacher} if teacher is not None else {}), **routed}
        return self._actor.options(**options).remote(WorkerSpec(
            index, stream, config, model, buffer, self._env, self._algorithm, teachers, routes, teacher_active,
            self._judge, env_placement))

    def add_workers(self, count: int, num_cpus: float, num_gpus: float, placement: list[Any] | None = None) -> None:
        """Start `count` more workers (into the bundles a stopped teacher left), without its scoring stage,
        with the latest weights, running like the others. Their task seeds come from a stream of
        their own (EXTRA_WORKER_SEEDS + i * count + j), which the first workers' never reach."""
        first = len(self.workers)
        for j in range(count):
            worker = self._new_worker(first + j, num_cpus, num_gpus, None if placement is None else placement[j],
                                      None, (EXTRA_WORKER_SEEDS, count, j), teacher_active=False)
            self.workers.append(worker)
            if self._started:
                self._runs[first + j] = self._run(first + j)

    def stop_teacher(self) -> None:
        """Every worker stops sending groups to the teacher; returns once none is waiting on it."""
        # A worker returns once its teacher calls drained, which a hung teacher delays by up to its deadline.
        self._gather({i: self.workers[i].drop_teacher.remote() for i in self.active},
                     self.config.service_timeout_s + self.config.call_timeout_s)

    def start(self, max_groups_per_worker: int | None = None, start_version: int = 0) -> None:
        """Start every worker's `run`; `start_version`: the first main-loop learner version (a
        curriculum counts from it)."""
        self._max_groups = max_groups_per_worker
        self._start_version = start_version
        self._started = True
        self._stopping = False
        self._runs = {i: self._run(i) for i in range(len(self.workers))}

    def _run(self, index: int):
        """Call the worker's `run` with the latest published weights: a restarted incarnation
        loads them before its first round even if an `update_weights` sent while it was
        restarting was lost (it would otherwise roll out stale groups the buffer drops)."""
        return self.workers[index].run.remote(self._max_groups, self._start_version, self._latest_weights())

    def _latest_weights(self) -> tuple[list, int] | None:
        return None if self._weights is None else ([self._weights[0]], self._weights[1])

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Restart the runs of workers that died; True when every run has finished."""
        import ray

        if not self._runs:
            return True
        self._settle_restarts()
        ready, _ = ray.wait(list(self._runs.values()), num_returns=len(self._runs), timeout=timeout_s)
        for ref in ready:
            index = next(i for i, r in self._runs.items() if r == ref)
            try:
                ray.get(ref)
                del self._runs[index]
                self._failures.progressed(index)
            except ray.exceptions.ActorUnavailableError as exc:
                if index in self._restarting:  # the restart of a failure already counted: ask again soon
                    if self._stopping:
                        del self._runs[index]
                    else:
                        time.sleep(0.2)
                        self._runs[index] = self._run(index)
                else:  # the process died under the call and Ray is restarting it
                    self._failed(index, exc)
            except ray.exceptions.RayActorError as exc:
                # The actor died and Ray restarts it; the new incarnation re-runs its leased groups.
                self._failed(index, exc)
            except ray.exceptions.RayTaskError as exc:
                # The actor lives but its run raised (a dead engine): restart it the same way.
                old_pid = ray.get(self.workers[index].pid.remote())
                ray.kill(self.workers[index], no_restart=False)
                self._failed(index, exc, old_pid)
        if not self.active:
            raise RuntimeError(f"every rollout worker failed more than max_restarts={self.max_restarts} times in a row; "
                               f"last error: {list(self.left.values())[-1]}")
        return not self._runs

    @property
    def active(self) -> list[int]:
        """Indices of the workers still in the pool."""
        return [i for i in range(len(self.workers)) if i not in self.left]

    def _settle_restarts(self) -> None:
        """Forget the restarts whose new incarnation answered (a later failure counts again)."""
        import ray

        for index, (probe, old_pid) in list(self._restarting.items()):
            if not ray.wait([probe], timeout=0)[0]:
                continue
            try:
                if ray.get(probe) == old_pid:  # answered before the kill took effect
                    self._restarting[index] = (self.workers[index].pid.remote(), old_pid)
                else:
                    del self._restarting[index]
            except ray.exceptions.ActorUnavailableError:
                self._restarting[index] = (self.workers[index].pid.remote(), old_pid)
            except ray.exceptions.RayActorError:
                del self._restarting[index]  # gone for good: its run fails too and is counted there

    def _failed(self, index: int, exc: Exception, old_pid: int | None = None) -> None:
        import ray

        self.num_failed_runs += 1
        may_restart = self._failures.failed(index)
        if self._stopping:  # Ray restarts the actor; its run is over
            del self._runs[index]
            return
        if may_restart:
            self._runs[index] = self._run(index)
            self._restarting[index] = (self.workers[index].pid.remote(), old_pid)
            return
        del self._runs[index]
        self._restarting.pop(index, None)
        self.left[index] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        ray.kill(self.workers[index], no_restart=True)
        released = ray.get(self.buffer.abort_owner.remote(f"worker-{index}"))
        print(f"rollout worker {index} left the pool after {self._failures[index]} failed runs in a row "
              f"({self.left[index]}); {released} leased groups released; its last error:\n{exc}", flush=True)

    def wait(self, timeout_s: float = 600.0) -> None:
        """Block until every run finished (finite max_groups_per_worker)."""
        deadline = time.monotonic() + timeout_s
        while not self.poll(timeout_s=min(1.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rollout did not finish within {timeout_s} s")

    def publish_weights(self, weights, version: int) -> None:
        """Weights (a state dict, or the ObjectRef of one) go into the object store once; every
        worker loads them before its next round. A worker that is restarting gets them with
        its next `run` (the pool re-sends the latest weights first)."""
        import ray

        ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
        self._weights = (ref, version)
        self._gather({i: self.workers[i].update_weights.remote([ref], version) for i in self.active})

    def stop(self) -> None:
        """Every run ends after its current round; a run that fails from now on is not restarted
        (a restarted incarnation never saw the stop and would roll out until the wait times out)."""
        self._stopping = True
        self._gather({i: self.workers[i].stop.remote() for i in self.active})

    def group_totals(self) -> dict[str, int]:
        """GROUP_TOTALS summed over the answering workers' current incarnations."""
        totals = dict.fromkeys(GROUP_TOTALS, 0)
        for answer in self._gather({i: self.workers[i].group_totals.remote() for i in self.active}).values():
            for key in totals:
                totals[key] += answer[key]
        return totals

    def stats(self) -> list[dict[str, float]]:
        """Each answering worker's counters since its previous answer (deltas). A worker that is
        restarting or out of the pool does not answer; the counts of an incarnation between its last
        answer and its death are lost. A worker that finished an episode made progress: its
        failures in a row start again from 0."""
        answers = self._gather({i: self.workers[i].stats.remote() for i in self.active})
        for index, delta in answers.items():
            if delta.get("num_episodes"):
                self._failures.progressed(index)
        return list(answers.values())

    def evaluate(self, split: str, seeds: list[int], timeout_s: float = 600.0) -> list[dict[str, Any]]:
        """Greedy evaluation with the latest published weights, seeds spread over the workers; a
        worker that dies mid-eval has its share re-run by the next worker that answers."""
        pending = {i: seeds[k::len(self.active)] for k, i in enumerate(self.active)}
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            parts = self._gather({i: self.workers[i].evaluate.remote(split, part, self._latest_weights())
                                  for i, part in pending.items()}, max(deadline - time.monotonic(), 1.0))
            rows.extend(row for part in parts.values() for row in part)
            failed = [seed for i, part in pending.items() if i not in parts for seed in part]
            if not failed:
                return sorted(rows, key=lambda row: row["seed"])
            if time.monotonic() > deadline:
                raise RuntimeError(f"evaluation did not finish within {timeout_s} s: {len(failed)} tasks could "
                                   f"not be run (workers dead or restarting)")
            # The workers that just answered are alive; a restarting one fails calls at once, so
            # with none alive wait for the restarts rather than spend the tries.
            alive = [i for i in pending if i in parts]
            if not alive:
                time.sleep(1.0)
                alive = self.active
            pending = {i: failed[k::len(alive)] for k, i in enumerate(alive) if failed[k::len(alive)]}

    def _gather(self, refs: dict[int, Any], timeout_s: float | None = None) -> dict[int, Any]:
        """Results of calls fanned out to workers; a worker that died or is restarting is left
        out, and so is one that has not answered within `timeout_s` (default
        `rollout.call_timeout_s`): it is hung, so it is killed and Ray restarts it (its `run`
        then fails and the pool counts and restarts it like any crash)."""
        import ray

        if not refs:
            return {}
        timeout_s = self.config.call_timeout_s if timeout_s is None else timeout_s
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        ready = set(ready)
        out = {}
        for index, ref in refs.items():
            if ref not in ready:
                print(f"rollout worker {index} did not answer within {timeout_s:.0f} s: it is hung, killed and "
                      f"restarted", flush=True)
                ray.kill(self.workers[index], no_restart=False)
                continue
            try:
                out[index] = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                print(f"rollout worker {index} did not answer ({type(exc).__name__}); it is restarted by the pool",
                      flush=True)
        return out
