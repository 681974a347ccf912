"""The rollout worker's weight application, on a recording engine (no Ray, no model)."""

import asyncio
import types
from collections import defaultdict

import numpy as np

from actors.rollout_worker import RolloutWorker


class RecordingEngine:
    def __init__(self):
        self.version, self.loaded = 0, []

    def update_weights(self, state, version):
        self.loaded.append(version)
        self.version = version


class NoMetrics:
    def observe(self, *args):
        pass


def test_weights_applied_concurrently_by_run_and_evaluate_only_go_forward():
    # `evaluate` takes v4 and waits long for its weights; meanwhile v5 is published and `run`
    # applies it. v4's fetch then finishes: loading it would put the engine back a version.
    worker = types.SimpleNamespace(engine=RecordingEngine(), _engine_lock=asyncio.Lock(), _pending_weights=None,
                                   _stats=defaultdict(float), metrics=NoMetrics())
    apply = RolloutWorker._apply_weights.__get__(worker)
    update = RolloutWorker.update_weights.__get__(worker)

    async def fetched(after_s):
        await asyncio.sleep(after_s)
        return {"w": np.zeros(2, dtype=np.float32)}

    async def scenario():
        await update([fetched(0.2)], 4)
        slow = asyncio.create_task(apply())
        await asyncio.sleep(0.01)
        await update([fetched(0.0)], 5)
        await apply()
        await slow

    asyncio.run(scenario())
    assert worker.engine.loaded == [5] and worker.engine.version == 5


def test_a_worker_that_progressed_between_failures_is_never_retired_but_a_crash_loop_is():
    from actors.pool import FailuresInARow

    failures = FailuresInARow(limit=2)
    for _ in range(10):  # a long run: a failure now and then, episodes finished in between
        assert failures.failed(0)
        failures.progressed(0)
    assert failures.failed(1) and failures.failed(1) and not failures.failed(1)  # three in a row
    assert failures[1] == 3 and failures[0] == 0
