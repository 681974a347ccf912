"""The rollout worker pool: N RolloutWorker actors, restarted when they die.

Each worker runs with Ray `max_restarts`; when one dies, its `run` call fails, Ray
restarts the actor (same arguments), and the pool calls `run` again. The restarted
worker asks the buffer for the groups it had leased and re-runs them before new ones,
and the buffer stores each group once (`put_group`): no episode is lost or duplicated.
"""

from __future__ import annotations

from typing import Any

from actors.rollout_worker import RolloutConfig, RolloutWorker
from learner.models import ModelConfig


class RolloutPool:
    """Driver-side handle on the workers; worker i sends its groups to teacher i mod len(teachers)."""

    def __init__(self, num_workers: int, config: RolloutConfig, model: ModelConfig, buffer, teachers=(),
                 num_cpus: float = 1.0, num_gpus: float = 0.0, max_restarts: int = 3,
                 placement: list[Any] | None = None) -> None:
        import ray

        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.config = config
        self.buffer = buffer
        actor = ray.remote(RolloutWorker)
        self.workers = []
        for i in range(num_workers):
            options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": max_restarts,
                                       "max_task_retries": 0, "max_concurrency": 8}
            if placement is not None:
                options["scheduling_strategy"] = placement[i]
            teacher = teachers[i % len(teachers)] if teachers else None
            self.workers.append(actor.options(**options).remote(i, num_workers, config, model, buffer, teacher))
        self._runs: dict[int, Any] = {}
        self._max_groups: int | None = None
        self.num_failed_runs = 0

    def start(self, max_groups_per_worker: int | None = None) -> None:
        self._max_groups = max_groups_per_worker
        self._runs = {i: w.run.remote(max_groups_per_worker) for i, w in enumerate(self.workers)}

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Restart the runs of workers that died; True when every run has finished."""
        import ray

        if not self._runs:
            return True
        ready, _ = ray.wait(list(self._runs.values()), num_returns=len(self._runs), timeout=timeout_s)
        for ref in ready:
            index = next(i for i, r in self._runs.items() if r == ref)
            try:
                ray.get(ref)
                del self._runs[index]
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                # The actor is restarting; the new incarnation re-runs its leased groups.
                self.num_failed_runs += 1
                self._runs[index] = self.workers[index].run.remote(self._max_groups)
        return not self._runs

    def wait(self, timeout_s: float = 600.0) -> None:
        """Block until every run finished (finite max_groups_per_worker)."""
        import time

        deadline = time.monotonic() + timeout_s
        while not self.poll(timeout_s=min(1.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rollout did not finish within {timeout_s} s")

    def publish_weights(self, weights, version: int):
        """Weights (a state dict, or the ObjectRef of one) go into the object store once; every
        worker loads them before its next round."""
        import ray

        ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
        return [w.update_weights.remote([ref], version) for w in self.workers]

    def stop(self) -> None:
        import ray

        ray.get([w.stop.remote() for w in self.workers])

    def stats(self) -> list[dict[str, float]]:
        import ray

        return ray.get([w.stats.remote() for w in self.workers])

    def evaluate(self, split: str, seeds: list[int]) -> list[dict[str, Any]]:
        """Greedy evaluation, seeds spread over the workers."""
        import ray

        n = len(self.workers)
        parts = ray.get([w.evaluate.remote(split, seeds[i::n]) for i, w in enumerate(self.workers)])
        return sorted((row for part in parts for row in part), key=lambda row: row["seed"])
