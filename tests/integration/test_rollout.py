"""Rollout workers, the pool, the teacher service and the buffer together on one local Ray."""

import dataclasses
import os
import signal
import sys
import time

import pytest

from actors.agent_loop import LoopConfig
from actors.engine import SamplingConfig
from actors.pool import RolloutPool
from actors.rollout_worker import RolloutConfig
from buffer.actor import BufferConfig, create_buffer_actor, fetch_samples
from buffer.contracts import table_to_samples
from cluster.actor_state import actor_state
from envs.babyai_text import BabyAITextConfig
from jobs.recorder import answers_within
from learner.algorithms import AlgorithmConfig
from models.loading import ModelConfig
from teacher.registry import register_teacher_backend, teacher_backend
from teacher.service import TeacherConfig, create_teacher_service

NANO = ModelConfig(path="tiny:nano")


def drain(ray, buffer, version=0):
    samples = []
    while True:
        batch = ray.get(buffer.get.remote(256, learner_version=version, timeout_s=0.2))
        if not batch.num_samples:
            return samples
        samples.extend(table_to_samples(fetch_samples(batch)))


def rollout_config(**kw):
    return RolloutConfig(engine="hf", num_envs=4, group_size=2, sampling=SamplingConfig(max_new_tokens=24, seed=0),
                         loop=LoopConfig(max_turns=3), **kw)


def test_pool_with_an_oracle_and_a_cross_tokenizer_teacher_fills_the_buffer(ray_session):
    """Teacher 0 is the oracle; teacher 1 a model whose tokenizer is not the student's (nano384 for
    the nano student, teacher.cross_tokenizer), built in its actor from the registry like any other."""
    import ray

    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    cross = TeacherConfig(backend="hf", model=ModelConfig(path="tiny:nano384"), cross_tokenizer=True,
                          batch_window_s=0.05)
    teachers = [create_teacher_service(config, NANO, BabyAITextConfig(), name=f"teacher-{j}", num_cpus=0)
                for j, config in enumerate([TeacherConfig(backend="oracle", batch_window_s=0.05), cross])]
    pool = RolloutPool(2, rollout_config(), NANO, buffer, teachers, num_cpus=0.5,
                       algorithm=AlgorithmConfig(name="opd"))
    pool.start(max_groups_per_worker=3)
    pool.wait(timeout_s=300)
    samples = drain(ray, buffer)
    groups = {s.group_id for s in samples}
    assert groups == {f"worker-{w}:{i}" for w in range(2) for i in range(3)}
    assert len({s.trajectory_id for s in samples}) == 12  # 6 groups x G=2
    by_traj = {}
    for s in samples:
        by_traj.setdefault(s.trajectory_id, []).append(s)
        assert s.teacher_logprobs is not None and len(s.teacher_logprobs) == len(s.response_ids)
        assert s.policy_version == 0
    for traj in by_traj.values():
        assert sorted(s.turn_index for s in traj) == list(range(traj[0].num_turns))
    # Both episodes of a group ran the same task.
    for g in groups:
        assert len({(s.split, s.task_seed) for s in samples if s.group_id == g}) == 1
    # The cross-tokenizer teacher scored the untrained student's text (its exactness: unit tests).
    crossed = [s for s in samples if s.group_id.startswith("worker-1:")]
    assert all(lp <= 0 for s in crossed for lp in s.teacher_logprobs)
    assert sum(lp < 0 for s in crossed for lp in s.teacher_logprobs) > len(crossed)
    # Worker i sends its 3 groups to teacher i.
    stats = ray.get([t.stats.remote() for t in teachers])
    assert [s["num_requests"] for s in stats] == [3, 3]
    assert sum(s["num_turns_scored"] for s in stats) == len(samples)
    for w in range(2):
        assert stats[w]["num_turns_scored"] == sum(1 for s in samples if s.group_id.startswith(f"worker-{w}:"))
    buffer_stats = ray.get(buffer.stats.remote())
    assert buffer_stats["num_outstanding_groups"] == 0 and buffer_stats["num_duplicate_groups"] == 0


def test_routed_teacher_scores_exactly_the_samples_its_route_matches(ray_session):
    import ray

    from teacher.routing import TeacherRoute

    env = BabyAITextConfig(task_types=("go_to", "pick_up"))
    oracle = TeacherConfig(backend="oracle", batch_window_s=0.05)
    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    default = create_teacher_service(oracle, NANO, env, name="teacher-0", num_cpus=0)
    routed = create_teacher_service(oracle, NANO, env, name="teacher-pickup", num_cpus=0)
    route = TeacherRoute(name="pickup", values=("pick_up",), teacher=oracle)
    pool = RolloutPool(1, rollout_config(), NANO, buffer, [default], num_cpus=0.5, env=env,
                       algorithm=AlgorithmConfig(name="opd"), routed_teachers={"pickup": routed}, routes=(route,))
    pool.start(max_groups_per_worker=4)
    pool.wait(timeout_s=300)
    samples = drain(ray, buffer)
    assert len({s.group_id for s in samples}) == 4 and all(s.teacher_logprobs is not None for s in samples)
    pick_up = sum(1 for s in samples if s.task_type == "pick_up")
    assert 0 < pick_up < len(samples)
    default_stats, routed_stats = ray.get([default.stats.remote(), routed.stats.remote()])
    assert routed_stats["num_turns_scored"] == pick_up
    assert default_stats["num_turns_scored"] == len(samples) - pick_up


def test_group_end_hook_sets_grpo_advantages(ray_session):
    import ray

    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    config = RolloutConfig(engine="hf", num_envs=4, group_size=4, sampling=SamplingConfig(max_new_tokens=24, seed=0),
                           loop=LoopConfig(max_turns=3))
    pool = RolloutPool(1, config, NANO, buffer, num_cpus=0.5, algorithm=AlgorithmConfig(name="grpo"))
    pool.start(max_groups_per_worker=2)
    pool.wait(timeout_s=300)
    samples = drain(ray, buffer)
    # An untrained model mostly fails every episode alike: such zero-variance groups carry no signal,
    # are dropped, and still complete their lease (an empty put).
    totals = pool.group_totals()  # the driver's hint while the learner waits; not reset by `stats`
    stats = pool.stats()[0]
    assert stats["num_groups_put"] == 2
    assert len({s.group_id for s in samples}) == 2 - stats.get("num_groups_without_signal", 0)
    flat = stats.get("num_groups_without_signal", 0)
    assert totals == pool.group_totals()
    assert (totals["num_groups_delivered"], totals["num_groups_without_signal"]) == (2, flat)
    # The dropped groups' episodes, for the driver's cause when no group carries a signal any more.
    assert totals["num_episodes_without_signal"] == 4 * flat
    assert totals["num_successes_without_signal"] in (0, 4, 8)  # a flat group: all or none of its 4
    assert flat <= totals["num_turns_without_signal"] // 4 <= 3 * flat
    assert 0 <= totals["num_format_errors_without_signal"] <= totals["num_turns_without_signal"]
    assert all(s.advantage is not None for s in samples)
    assert ray.get(buffer.stats.remote())["num_outstanding_groups"] == 0


def test_weight_updates_reach_workers_between_rounds(ray_session):
    import ray

    from models.loading import load_model

    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    pool = RolloutPool(1, rollout_config(), NANO, buffer, num_cpus=0.5)
    pool.start(max_groups_per_worker=2)
    pool.wait(timeout_s=300)
    assert {s.policy_version for s in drain(ray, buffer)} == {0}
    pool.publish_weights(load_model(ModelConfig(path="tiny:nano", seed=5)).state_dict(), version=1)
    pool.start(max_groups_per_worker=4)
    pool.wait(timeout_s=300)
    assert {s.policy_version for s in drain(ray, buffer, version=1)} == {1}
    assert pool.stats()[0]["policy_version"] == 1
    rows = pool.evaluate("eval50", list(range(4)))
    assert [r["seed"] for r in rows] == [0, 1, 2, 3] and all(r["policy_version"] == 1 for r in rows)
    # Weights published while no run is applying them (after a warm start) are evaluated too.
    pool.publish_weights(load_model(ModelConfig(path="tiny:nano", seed=6)).state_dict(), version=2)
    assert all(r["policy_version"] == 2 for r in pool.evaluate("eval50", list(range(2))))


def test_an_sft_pool_rolls_out_the_experts_calls_tagged_with_the_current_weights_and_evaluates_the_model(ray_session):
    """sft (`Algorithm.demonstrations`): behaviour cloning for a whole run, the SFT-only arm."""
    import ray

    from models.loading import load_model

    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    # The starter level, whose bot solves every task within 10 turns.
    config = RolloutConfig(engine="hf", num_envs=4, group_size=2, sampling=SamplingConfig(max_new_tokens=24, seed=0),
                           loop=LoopConfig(max_turns=10))
    starter = BabyAITextConfig(room_size=6, num_distractors=0, task_types=("go_to", "pick_up"))
    pool = RolloutPool(1, config, NANO, buffer, num_cpus=0.5, env=starter, algorithm=AlgorithmConfig(name="sft"))
    pool.start(max_groups_per_worker=2)
    pool.wait(timeout_s=300)
    first = drain(ray, buffer)
    pool.publish_weights(load_model(ModelConfig(path="tiny:nano", seed=5)).state_dict(), version=1)
    pool.start(max_groups_per_worker=4)  # a running total
    pool.wait(timeout_s=300)
    second = drain(ray, buffer, version=1)
    assert ({s.policy_version for s in first}, {s.policy_version for s in second}) == ({0}, {1})
    # The expert's calls in the student's format (log-prob 0: it is deterministic), successes only:
    # the untrained nano model would have failed these episodes.
    assert all(s.well_formed and set(s.behaviour_logprobs) == {0.0} and s.success for s in first + second)
    assert len({s.trajectory_id for s in first + second}) == 8
    # Evaluations play the model: the untrained student's greedy calls mostly do not parse.
    rows = pool.evaluate("eval", list(range(2)))
    assert all(r["policy_version"] == 1 for r in rows) and sum(r["num_format_errors"] for r in rows) > 0, rows


def test_a_killed_worker_is_restarted_and_nothing_is_lost_or_duplicated(ray_session):
    import ray

    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    config = RolloutConfig(engine="hf", num_envs=2, group_size=2, sampling=SamplingConfig(max_new_tokens=32, seed=0),
                           loop=LoopConfig(max_turns=12))
    pool = RolloutPool(1, config, NANO, buffer, num_cpus=0.5, max_restarts=2)
    worker = pool.workers[0]
    pid = ray.get(worker.pid.remote())
    pool.start(max_groups_per_worker=4)
    # Kill while a group is leased but not yet stored.
    deadline, put = time.monotonic() + 120, 0
    while time.monotonic() < deadline:
        put += ray.get(worker.stats.remote()).get("num_groups_put", 0)  # deltas since the last call
        if ray.get(buffer.stats.remote())["num_outstanding_groups"] and put >= 1:
            break
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    pool.wait(timeout_s=300)
    assert pool.num_failed_runs >= 1
    assert ray.get(worker.pid.remote()) != pid
    # The new incarnation counts from 0: what it reports is its own work, the re-run lease included.
    stats = pool.stats()[0]
    assert stats["num_recovered_groups"] >= 1 and 1 <= stats["num_groups_put"] <= 4 - put
    samples = drain(ray, buffer)
    groups = sorted({s.group_id for s in samples})
    assert groups == [f"worker-0:{i}" for i in range(4)]
    per_traj = {}
    for s in samples:
        per_traj.setdefault(s.trajectory_id, []).append(s.turn_index)
    assert all(sorted(turns) == list(range(len(turns))) for turns in per_traj.values())  # none half-stored
    assert len(per_traj) == 8
    assert ray.get(buffer.stats.remote())["num_outstanding_groups"] == 0


def test_segments_deliver_running_episodes_turns_once_across_a_killed_worker(ray_session):
    """rollout.segments with OPD and the oracle teacher: weights published while episodes run
    make them deliver their finished turns early; the worker is SIGKILLed once a segment of a
    still-running group is stored, and its re-run stores only the turns not stored before."""
    import ray

    from models.loading import load_model

    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    teacher = create_teacher_service(TeacherConfig(backend="oracle", batch_window_s=0.05), NANO,
                                     BabyAITextConfig(), num_cpus=0)
    config = RolloutConfig(engine="hf", num_envs=2, group_size=1, segments=True,
                           sampling=SamplingConfig(max_new_tokens=48, seed=0), loop=LoopConfig(max_turns=10))
    pool = RolloutPool(1, config, NANO, buffer, [teacher], num_cpus=0.5, max_restarts=2,
                       algorithm=AlgorithmConfig(name="opd"))
    worker = pool.workers[0]
    pid = ray.get(worker.pid.remote())
    weights = [ray.put(load_model(ModelConfig(path="tiny:nano", seed=s)).state_dict()) for s in (5, 6)]
    pool.start(max_groups_per_worker=8)
    version, deadline, killed = 0, time.monotonic() + 240, False
    while not pool.poll(timeout_s=0.1):
        version += 1
        pool.publish_weights(weights[version % 2], version=version)
        if not killed and ray.get(buffer.stats.remote())["num_delivered_running"]:
            os.kill(pid, signal.SIGKILL)  # a segment is stored and its group still runs
            killed = True
        assert time.monotonic() < deadline, "rollout did not finish"
    assert killed and pool.num_failed_runs >= 1 and ray.get(worker.pid.remote()) != pid
    samples = drain(ray, buffer)
    assert sorted({s.group_id for s in samples}) == [f"worker-0:{i}" for i in range(8)]
    per_traj = {}
    for s in samples:
        per_traj.setdefault(s.trajectory_id, []).append(s.turn_index)
        assert s.teacher_logprobs is not None and len(s.teacher_logprobs) == len(s.response_ids)
    # Each turn once, none missing (a re-run shorter than what its first incarnation stored adds nothing).
    assert all(sorted(turns) == list(range(len(turns))) for turns in per_traj.values()), per_traj
    assert len({s.policy_version for s in samples}) > 1  # turns of one run under several versions
    stats = ray.get(buffer.stats.remote())
    assert stats["num_outstanding_groups"] == 0 and stats["num_delivered_running"] == 0
    assert stats["num_put"] == len(samples)
    # The re-run played the killed groups from turn 0; what the first incarnation stored was refused.
    assert stats["num_duplicate_turns"] >= 1 and stats["num_duplicate_groups"] == 0


def oracle_restarting_slowly(marker: str):
    """The oracle backend, except that while `marker` exists every build -- every restart of the
    service -- first takes 12 s, longer than the calls' deadline: a fake of a slow model load
    only, the service around it is the real one."""
    oracle = teacher_backend("oracle")

    def build(config, ctx):
        if os.path.exists(marker):
            time.sleep(12.0)
        return oracle.build(config, ctx)

    return dataclasses.replace(oracle, build=build)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_killed_or_hung_teacher_service_is_restarted_once_and_its_requests_retried(ray_session, tmp_path, signum):
    """SIGSTOP leaves the teacher alive but silent: the worker kills it after
    rollout.service_timeout_s, and the call is retried on the restarted service as after a crash.
    Its restarts outlast the calls' deadline: the calls left waiting (two groups run at once) kill
    no incarnation but the silent one -- not one that is starting -- so the service is restarted
    once and needs no more restarts than that. The driver's records (jobs/recorder.py) do not
    wait for a silent service's gauges, and count its restarts as Ray does."""
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    marker = tmp_path / "restart-slowly"
    backend = f"oracle_restarting_slowly_{signum.name}"
    register_teacher_backend(backend, oracle_restarting_slowly(str(marker)))
    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    teacher = create_teacher_service(TeacherConfig(backend=backend, batch_window_s=0.05, max_restarts=1),
                                     NANO, BabyAITextConfig(), num_cpus=0)
    pid = ray.get(teacher.stats.remote())["pid"]
    pool = RolloutPool(1, rollout_config(service_timeout_s=10.0), NANO, buffer, [teacher], num_cpus=0.5,
                       algorithm=AlgorithmConfig(name="opd"))
    pool.start(max_groups_per_worker=4)
    deadline = time.monotonic() + 120
    while ray.get(teacher.stats.remote())["num_requests"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    marker.touch()
    os.kill(pid, signum)
    if signum == signal.SIGSTOP:  # the driver's records ask it for gauges meanwhile, with a deadline
        start = time.monotonic()
        assert answers_within([teacher], timeout_s=1.0) == [None] and time.monotonic() - start < 5
    pool.wait(timeout_s=300)
    assert ray.get(teacher.stats.remote())["pid"] != pid
    assert actor_state(teacher).num_restarts == 1
    assert pool.num_failed_runs == 0  # the worker's `score` call was retried, not failed
    samples = drain(ray, buffer)
    assert sorted({s.group_id for s in samples}) == [f"worker-0:{i}" for i in range(4)]
    assert all(s.teacher_logprobs is not None for s in samples)
    assert ray.get(buffer.stats.remote())["num_duplicate_groups"] == 0


def engine_dies_worker(after: int, marker: str | None):
    """A RolloutWorker whose engine raises after `after` generations -- in every incarnation, or
    (with `marker`) only while the marker file exists, i.e. once. A fake of the failure only:
    the worker, pool and buffer around it are the real ones."""
    from actors.rollout_worker import RolloutWorker

    class EngineDiesWorker(RolloutWorker):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            generate, calls = self.engine.generate, [0]

            def dying_generate(prompts, sampling):
                calls[0] += 1
                if calls[0] > after and (marker is None or os.path.exists(marker)):
                    if marker is not None:
                        os.remove(marker)
                    raise RuntimeError("EngineDeadError: the engine core died")
                return generate(prompts, sampling)

            self.engine.generate = dying_generate

    return EngineDiesWorker


def test_a_worker_whose_engine_dies_is_restarted_without_loss(ray_session, tmp_path):
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    marker = tmp_path / "die-once"
    marker.touch()
    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    pool = RolloutPool(1, rollout_config(), NANO, buffer, num_cpus=0.5, max_restarts=2,
                       worker_cls=engine_dies_worker(after=2, marker=str(marker)))
    pid = ray.get(pool.workers[0].pid.remote())
    pool.start(max_groups_per_worker=3)
    pool.wait(timeout_s=300)
    assert pool.num_failed_runs == 1 and not pool.left and not marker.exists()
    assert ray.get(pool.workers[0].pid.remote()) != pid  # killed and restarted, not left with a dead engine
    samples = drain(ray, buffer)
    assert sorted({s.group_id for s in samples}) == [f"worker-0:{i}" for i in range(3)]
    assert len({s.trajectory_id for s in samples}) == 6
    assert ray.get(buffer.stats.remote())["num_outstanding_groups"] == 0


def test_a_worker_that_keeps_failing_leaves_the_pool_and_the_job_fails(ray_session):
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    pool = RolloutPool(1, rollout_config(), NANO, buffer, num_cpus=0.5, max_restarts=1,
                       worker_cls=engine_dies_worker(after=1, marker=None))
    pool.start()
    with pytest.raises(RuntimeError, match="every rollout worker failed more than max_restarts=1 times.*"
                                           "EngineDeadError: the engine core died"):
        pool.wait(timeout_s=300)
    assert pool.left and pool.num_failed_runs == 2
    # Its leased groups went back to admission: nothing outstanding for a worker that is gone.
    assert ray.get(buffer.stats.remote())["num_outstanding_groups"] == 0


def test_driver_calls_survive_a_worker_hung_while_weights_are_published_and_one_killed_during_an_eval(ray_session):
    """The driver's fan-out calls (publish, stats, totals, evaluate, stop) go on past a worker
    that hung (SIGSTOP: alive, not answering; killed once `rollout.call_timeout_s` passed) or died
    under them; a restarted worker evaluates with the latest weights, and an eval whose worker
    died has every seed played exactly once."""
    import threading

    import ray

    from models.loading import load_model

    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    pool = RolloutPool(2, rollout_config(call_timeout_s=10.0), NANO, buffer, num_cpus=0.25, max_restarts=3)
    pids = ray.get([w.pid.remote() for w in pool.workers])
    pool.start()
    deadline = time.monotonic() + 120
    while ray.get(buffer.stats.remote())["num_put"] == 0:  # both are rolling out
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(pids[0], signal.SIGSTOP)
    pool.publish_weights(load_model(ModelConfig(path="tiny:nano", seed=5)).state_dict(), version=1)
    pool.stats()
    pool.group_totals()
    pool.poll()  # worker 0's run failed: restarted with the latest weights
    killed_at = []

    def kill_worker_1_in_its_eval() -> None:
        while not ray.get(pool.workers[1].stats.remote()).get("num_eval_episodes"):
            time.sleep(0.01)
        os.kill(pids[1], signal.SIGKILL)
        killed_at.append(time.monotonic())

    seeds = list(range(24))
    killer = threading.Thread(target=kill_worker_1_in_its_eval)
    killer.start()
    rows = pool.evaluate("eval50", seeds)
    evaluated_at = time.monotonic()
    killer.join()
    assert killed_at[0] < evaluated_at, "worker 1 was not killed during the eval"
    assert [r["seed"] for r in rows] == seeds and all(r["policy_version"] == 1 for r in rows)
    pool.stop()
    pool.wait(timeout_s=300)
    assert pool.num_failed_runs == 2 and not pool.left
    # After the stop the pool no longer waits for restarts: ask until each new incarnation answers.
    assert all(answered_pid(w) != old for w, old in zip(pool.workers, pids))


def answered_pid(worker, timeout_s: float = 120.0) -> int:
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(worker.pid.remote())
        except ray.exceptions.ActorUnavailableError:
            assert time.monotonic() < deadline, "the worker did not come back"
            time.sleep(0.2)


def test_a_gateway_workers_trajectories_in_the_buffer_equal_the_built_in_loops(ray_session):
    """The example agent (a callable: examples/gateway_agent.py) plays through a real worker's
    gateway into the buffer; the built-in loop then plays the same tasks with the same engine and
    weights, greedy, so it samples the same tokens: every stored turn is the built-in loop's --
    prompt and response ids, log-probs, format, rewards. One environment per worker, so both
    generate one sequence at a time (a batch's padding would move the HF engine's numbers)."""
    import ray
    import torch

    from actors.agent_loop import EpisodeTask, ModelPolicy, run_episodes
    from actors.hf_engine import HFEngine
    from envs.registry import make_env, parse_env_config
    from models.loading import load_model, load_tokenizer

    tasks = {"name": "babyai_text", "room_size": 6, "num_distractors": 0, "task_types": ["go_to", "pick_up"]}
    env = parse_env_config({"name": "gateway", "callable": "examples.gateway_agent:run", "tasks": tasks})
    loop = LoopConfig(max_turns=3, prompt={"history_window": "all", "tools": "compact"})
    config = RolloutConfig(engine="hf", num_envs=1, group_size=1, loop=loop,
                           sampling=SamplingConfig(temperature=0.0, max_new_tokens=24, seed=0))
    buffer = create_buffer_actor(BufferConfig(capacity_samples=10_000, batch_size=64))
    pool = RolloutPool(1, config, NANO, buffer, num_cpus=0.5, env=env)
    pool.start(max_groups_per_worker=3)
    pool.wait(timeout_s=300)
    stored = sorted(drain(ray, buffer), key=lambda s: (s.task_seed, s.turn_index))
    assert len({s.trajectory_id for s in stored}) == 3

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker's actor process runs
    try:
        tok = load_tokenizer(NANO)
        engine = HFEngine(load_model(NANO), tok.pad_token_id, [tok.convert_tokens_to_ids("<|im_end|>")])
        built_in = run_episodes(lambda: make_env(env.tasks), [EpisodeTask("train", s) for s in
                                                               sorted({s.task_seed for s in stored})],
                                ModelPolicy(engine, tok, config.sampling, loop), loop, batch_size=1)
    finally:
        torch.set_num_threads(threads)
    turns = [(r, t) for r in built_in for t in r.trajectory.turns]
    assert len(turns) == len(stored)
    for s, (r, t) in zip(stored, turns):
        assert (s.task_seed, s.turn_index, s.prompt_ids, s.response_ids, s.trainable, s.well_formed, s.finish_reason) \
            == (r.task.seed, t.turn_index, t.prompt_ids, t.response_ids, t.trainable, t.well_formed, t.finish_reason)
        assert s.behaviour_logprobs == pytest.approx(t.behaviour_logprobs, abs=1e-4)
        assert (s.turn_reward, s.outcome_reward, s.format_reward, s.success) == \
            (t.turn_reward, r.reward.outcome, r.reward.format, r.success)
