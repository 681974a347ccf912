"""The replay buffer actor with several producer actors and one consumer."""

import dataclasses

import pytest

from buffer.actor import BufferConfig, SampleBatch, create_buffer_actor, encode_trajectories, fetch_samples
from buffer.contracts import Trajectory, Turn, table_to_samples
from buffer.core import GroupLease


def trajectory(tid: str, num_turns: int, version: int) -> Trajectory:
    turns = tuple(Turn(turn_index=k, prompt_ids=tuple(range(k + 3)), response_ids=(7, 8, k),
                       behaviour_logprobs=(-0.5, -0.25, -1.0), policy_version=version) for k in range(num_turns))
    return Trajectory(tid, f"g-{tid}", "train", 0, "go_to", turns, True, 1.0, 0.5)


@pytest.fixture()
def ray_mod(ray_session):
    import ray

    return ray


def test_producers_and_a_consumer(ray_mod, monkeypatch):
    ray = ray_mod
    buffer = create_buffer_actor(BufferConfig(capacity_samples=1000, max_staleness=2, batch_size=64))

    @ray.remote(num_cpus=0)
    class Producer:
        def __init__(self, name, buffer):
            self.name, self.buffer = name, buffer

        def run(self, trajectories):
            for i, t in enumerate(trajectories):
                lease = GroupLease(t.group_id, self.name, "train", i, group_size=1, index=i)
                assert ray.get(self.buffer.admit_group.remote(lease))
                encoded = encode_trajectories([t])
                assert ray.get(self.buffer.put_group.remote(encoded, t.group_id))
            return len(trajectories)

    producers = [Producer.remote(f"p{j}", buffer) for j in range(3)]
    ray.get([p.run.remote([trajectory(f"p{j}-{i}", 1 + i % 4, 0) for i in range(8)])
             for j, p in enumerate(producers)])
    for p in producers:  # the buffer holds its own copies: they outlive their producers
        ray.kill(p)
    stats = ray.get(buffer.stats.remote())
    expected = 3 * sum(1 + i % 4 for i in range(8))
    assert stats["num_put"] == expected and stats["num_resident"] == expected

    seen, objects = set(), set()
    while True:
        batch = ray.get(buffer.get.remote(16, learner_version=1, timeout_s=0.2))
        if not batch.num_samples:
            break
        assert isinstance(batch, SampleBatch) and batch.num_samples <= 16
        objects |= set(batch.table_refs)
        gets, real_get = [], ray.get
        with monkeypatch.context() as m:
            m.setattr(ray, "get", lambda refs, **kw: gets.append(list(refs)) or real_get(refs, **kw))
            samples = table_to_samples(fetch_samples(batch))
        # Each object read once, however many of the batch's tables it holds.
        assert [sorted(map(str, g)) for g in gets] == [sorted(map(str, set(batch.table_refs)))]
        keys = [(s.trajectory_id, s.turn_index) for s in samples]
        assert [s.policy_version for s in samples] == [v for vs in batch.policy_versions for v in vs]
        assert not seen & set(keys), "a sample came back twice"
        seen |= set(keys)
        for s in samples:
            assert s.response_ids == (7, 8, s.turn_index) and len(s.prompt_ids) == s.turn_index + 3
    assert len(seen) == expected
    assert len(objects) == 1  # the 24 tables went into the object store in one put, at the first get
    stats = ray.get(buffer.stats.remote())
    assert stats["num_consumed"] == expected and stats["staleness_histogram"] == {1: expected}
    assert stats["num_put"] == stats["num_consumed"] + stats["num_dropped_stale"] + stats["num_evicted"] + \
        stats["num_resident"]
    assert stats["num_tables_held"] == 0  # every table reference was released


def test_tables_are_put_once_flush_bytes_gather_and_a_dropped_one_never(ray_mod):
    import asyncio

    from buffer.actor import ReplayBuffer

    async def run():
        buf = ReplayBuffer(BufferConfig(capacity_samples=100, max_staleness=0))
        await buf.put(encode_trajectories([trajectory("old", 2, 0)]))
        await buf.set_version(1)  # both rows stale: the table goes before it was ever put
        assert not buf._pending and not buf._tables
        buf = ReplayBuffer(BufferConfig(capacity_samples=100, max_staleness=0, flush_bytes=0))  # put at once
        await buf.set_version(1)
        for i in range(2):
            await buf.put(encode_trajectories([trajectory(f"t{i}", 2, 1)]))
        assert not buf._pending
        batch = await buf.get(4, learner_version=1, timeout_s=0)
        assert len(set(batch.table_refs)) == 2 and batch.parts == (0, 0)
        assert [s.trajectory_id for s in table_to_samples(fetch_samples(batch))] == ["t0", "t0", "t1", "t1"]

    asyncio.run(run())


def test_get_waits_for_puts_and_times_out(ray_mod):
    ray = ray_mod
    buffer = create_buffer_actor(BufferConfig())
    assert ray.get(buffer.get.remote(4, learner_version=0, timeout_s=0.3)).num_samples == 0
    pending = buffer.get.remote(5, learner_version=0, timeout_s=120)
    ready, _ = ray.wait([pending], timeout=0.5)
    assert not ready, "get returned before any data"
    ray.get(buffer.put.remote(encode_trajectories([trajectory("a", 3, 0)])))
    ready, _ = ray.wait([pending], timeout=0.5)
    assert not ready, "get returned with 3 of 5 samples before its timeout"
    ray.get(buffer.put.remote(encode_trajectories([trajectory("b", 2, 0)])))
    assert ray.get(pending, timeout=60).num_samples == 5


def test_staleness_filter_and_version_sweep(ray_mod):
    ray = ray_mod
    buffer = create_buffer_actor(BufferConfig(max_staleness=2))
    ray.get(buffer.put.remote(encode_trajectories([trajectory("old", 2, 0), trajectory("new", 2, 3)])))
    assert ray.get(buffer.set_version.remote(3)) == 2
    got = table_to_samples(fetch_samples(ray.get(buffer.get.remote(10, learner_version=3, timeout_s=0.1))))
    assert [s.trajectory_id for s in got] == ["new", "new"]
    stats = ray.get(buffer.stats.remote())
    assert stats["num_dropped_stale"] == 2 and stats["staleness_histogram"] == {0: 2}
    with pytest.raises(ray.exceptions.RayTaskError, match="went backwards"):
        ray.get(buffer.get.remote(1, learner_version=1, timeout_s=0))


def test_staleness_counted_per_episode_or_group_keeps_the_early_turns(ray_mod):
    ray = ray_mod
    # A 4-turn episode whose turns came from versions 0, 1, 2 and 3 (weights updated between turns),
    # and a 1-turn episode of the same group that ended at version 1.
    long = trajectory("long", 4, 0)
    long = dataclasses.replace(long, turns=tuple(dataclasses.replace(t, policy_version=k)
                                                 for k, t in enumerate(long.turns)))
    encoded = encode_trajectories([long, trajectory("short", 2, 3), trajectory("early", 1, 1)])
    assert encoded.policy_versions == (0, 1, 2, 3, 3, 3, 1) and encoded.episode_versions == (3, 3, 3, 3, 3, 3, 1)
    kept = {}
    for staleness_of in ("turn", "episode", "group"):
        buffer = create_buffer_actor(BufferConfig(max_staleness=2, staleness_of=staleness_of))
        ray.get(buffer.put.remote(encoded))
        batch = ray.get(buffer.get.remote(10, learner_version=4, timeout_s=0.1))
        samples = table_to_samples(fetch_samples(batch))
        kept[staleness_of] = [(s.trajectory_id, s.turn_index, s.policy_version) for s in samples]
        # The batch says which version staleness was counted from; the samples keep their own.
        counted = {"turn": [s.policy_version for s in samples], "group": [3] * len(samples),
                   "episode": [3 if s.trajectory_id != "early" else 1 for s in samples]}[staleness_of]
        assert [v for vs in batch.policy_versions for v in vs] == counted
        ray.kill(buffer)
    assert kept["turn"] == [("long", 2, 2), ("long", 3, 3), ("short", 0, 3), ("short", 1, 3)]
    assert kept["episode"] == [("long", k, k) for k in range(4)] + [("short", 0, 3), ("short", 1, 3)]
    assert kept["group"] == kept["episode"] + [("early", 0, 1)]


@pytest.mark.parametrize("first_version", [0, 384])
def test_admission_makes_producers_wait_until_the_learner_advances(ray_mod, first_version):
    """From version 0, and from a learner that begins at 384 (after a warm start or a resume)."""
    ray = ray_mod
    buffer = create_buffer_actor(BufferConfig(batch_size=4, max_staleness=1, samples_per_episode_prior=2.0))
    ray.get(buffer.begin.remote(first_version))

    def lease(index: int, size: int) -> GroupLease:
        return GroupLease(f"w:{index}", "w", "train", index, group_size=size, index=index)

    # (1 + 0 + 1) * 4 = 8 samples of room = 4 episodes of 2; a group is admitted whole while any
    # room is left (it may pass the bound by less than itself), then nothing until room opens.
    assert ray.get(buffer.admit_group.remote(lease(0, 4)))
    assert not ray.get(buffer.admit_group.remote(lease(1, 1)))
    group = encode_trajectories([trajectory(f"t{i}", 2, first_version) for i in range(4)])
    assert ray.get(buffer.put_group.remote(group, "w:0"))
    assert not ray.get(buffer.put_group.remote(group, "w:0"))  # stored once
    assert not ray.get(buffer.admit_group.remote(lease(1, 1)))
    assert ray.get(buffer.get.remote(4, learner_version=first_version, timeout_s=1)).num_samples == 4
    assert not ray.get(buffer.admit_group.remote(lease(1, 1)))  # consuming alone does not open room...
    with pytest.raises(ray.exceptions.RayTaskError, match="after 4 samples were consumed"):
        ray.get(buffer.begin.remote(first_version))
    ray.get(buffer.set_version.remote(first_version + 1))
    assert ray.get(buffer.admit_group.remote(lease(1, 2)))  # ...a new learner version does: 4 samples
    assert not ray.get(buffer.admit_group.remote(lease(2, 1)))
    # A worker gone for good gives its leased groups' room back.
    assert ray.get(buffer.abort_owner.remote("w")) == 1
    stats = ray.get(buffer.stats.remote())
    assert stats["num_running_episodes"] == 0 and stats["num_outstanding_groups"] == 0 \
        and stats["num_duplicate_groups"] == 1


def test_segments_store_each_turn_once_and_count_once_in_admission(ray_mod):
    ray = ray_mod
    buffer = create_buffer_actor(BufferConfig(batch_size=4, max_staleness=1, samples_per_episode_prior=4.0))
    assert ray.get(buffer.admit_group.remote(GroupLease("w:0", "w", "train", 0, group_size=1, index=0)))
    episode = trajectory("w:0/0", 4, 0)
    first = encode_trajectories([dataclasses.replace(episode, turns=episode.turns[:2])])
    assert ray.get(buffer.put_group.remote(first, "w:0", final=False))
    assert ray.get(buffer.put_group.remote(first, "w:0", final=False))  # a re-run's: refused row by row
    stats = ray.get(buffer.stats.remote())
    assert (stats["num_put"], stats["num_duplicate_turns"], stats["num_delivered_running"]) == (2, 2, 2)
    assert stats["admission_capacity"] == 8 - 2 - (4 - 2)  # resident, plus what the episode still owes
    assert ray.get(buffer.put_group.remote(encode_trajectories([episode]), "w:0"))  # final: turns 2, 3 are new
    assert not ray.get(buffer.put_group.remote(first, "w:0", final=False))  # after the final put
    stats = ray.get(buffer.stats.remote())
    assert (stats["num_put"], stats["num_duplicate_turns"], stats["num_delivered_running"]) == (4, 4, 0)
    assert stats["num_running_episodes"] == 0 and stats["num_outstanding_groups"] == 0
    samples = table_to_samples(fetch_samples(ray.get(buffer.get.remote(8, learner_version=0, timeout_s=1))))
    assert [s.turn_index for s in samples] == [0, 1, 2, 3]


def test_producers_far_ahead_of_the_learner_hold_bounded_bytes(ray_mod):
    """Soak: 120 groups of 8 samples into a 64-sample ring while the learner takes 8 samples per
    10 groups. Evicted tables are released: the buffer never holds more than the ring's worth of
    tables (64 / 8 + one partly evicted), and its byte count stays within that many tables."""
    ray = ray_mod
    buffer = create_buffer_actor(BufferConfig(capacity_samples=64, max_staleness=1000, batch_size=8))
    largest, held = 0, []
    for g in range(120):
        group = [trajectory(f"s{g}-{i}", 2, 0) for i in range(4)]  # 4 episodes x 2 turns = 8 samples
        encoded = encode_trajectories(group)
        largest = max(largest, encoded.num_bytes)
        ray.get(buffer.put.remote(encoded))
        if g % 10 == 9:
            assert ray.get(buffer.get.remote(8, learner_version=0, timeout_s=1)).num_samples == 8
        stats = ray.get(buffer.stats.remote())
        held.append(stats["num_bytes_held"])
        assert stats["num_tables_held"] <= 64 // 8 + 1
        assert stats["num_bytes_held"] <= (64 // 8 + 1) * largest
    assert stats["num_evicted"] > 800 and max(held) > 0
    assert stats["num_put"] == stats["num_consumed"] + stats["num_dropped_stale"] + stats["num_evicted"] + \
        stats["num_resident"]
