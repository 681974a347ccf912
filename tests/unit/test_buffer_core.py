"""Ring buffer core and admission control, exhaustively and as a hypothesis state machine."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from buffer.core import AdmissionController, Entry, RingBuffer, accepted_samples


def entries(versions, start=0):
    return [Entry(version=v, payload=start + i) for i, v in enumerate(versions)]


def check_counts(buf):
    c = buf.counters
    assert c.put == c.consumed + c.dropped_stale + c.evicted + len(buf)
    assert len(buf) <= buf.capacity
    assert sum(c.staleness_histogram.values()) == c.consumed


def test_fifo_and_each_sample_once():
    buf = RingBuffer(capacity=10)
    buf.put(entries([0] * 6))
    assert [e.payload for e in buf.get(4, learner_version=0)] == [0, 1, 2, 3]
    assert [e.payload for e in buf.get(4, learner_version=0)] == [4, 5]
    assert buf.get(4, learner_version=0) == []
    check_counts(buf)


def test_full_ring_overwrites_the_oldest_and_counts_evictions():
    buf = RingBuffer(capacity=4)
    assert buf.put(entries([0] * 3)) == 0
    assert buf.put(entries([0] * 3, start=3)) == 2
    assert [e.payload for e in buf.get(10, 0)] == [2, 3, 4, 5]
    assert buf.counters.evicted == 2
    check_counts(buf)


def test_stale_samples_are_dropped_and_counted():
    buf = RingBuffer(capacity=10, max_staleness=2)
    buf.put(entries([0, 1, 2, 3, 0, 3]))
    got = buf.get(10, learner_version=3)
    assert [e.payload for e in got] == [1, 2, 3, 5]
    assert buf.counters.dropped_stale == 2
    assert buf.counters.staleness_histogram == {2: 1, 1: 1, 0: 2}
    check_counts(buf)


def test_on_policy_when_max_staleness_is_zero():
    buf = RingBuffer(capacity=10, max_staleness=0)
    buf.put(entries([4, 5, 5]))
    assert [e.version for e in buf.get(10, 5)] == [5, 5]


def test_drop_stale_sweeps_everywhere_and_keeps_order():
    buf = RingBuffer(capacity=5, max_staleness=1)
    buf.put(entries([3, 0, 3, 1, 3]))
    assert buf.num_fresh(3) == 3
    assert buf.drop_stale(3) == 2
    assert len(buf) == 3
    buf.put(entries([3, 3], start=5))  # wraps around over tombstones
    assert [e.payload for e in buf.get(10, 3)] == [2, 4, 5, 6]
    check_counts(buf)


def test_get_stops_at_n_without_dropping_beyond():
    buf = RingBuffer(capacity=10, max_staleness=0)
    buf.put(entries([1, 1, 0, 0]))
    assert len(buf.get(2, 1)) == 2
    assert buf.counters.dropped_stale == 0 and len(buf) == 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="capacity"):
        RingBuffer(capacity=0)
    with pytest.raises(ValueError, match="max_staleness"):
        RingBuffer(capacity=1, max_staleness=-1)
    with pytest.raises(ValueError, match="n must be"):
        RingBuffer(capacity=1).get(-1, 0)


def test_admission_formula():
    adm = AdmissionController(batch_size=8, max_staleness=2, samples_per_episode_prior=4.0)
    # (2 + 0 + 1) * 8 = 24 samples = 6 episodes of 4 at version 0.
    assert adm.admit(10, learner_version=0, accepted=0) == 6
    assert adm.admit(1, learner_version=0, accepted=0) == 0
    adm.finish(2, num_samples=4)  # episodes were shorter: 2 samples each
    assert adm.samples_per_episode == 2.0
    # capacity = 24 - (4 accepted + 4 running * 2) = 12 -> 6 more episodes.
    assert adm.capacity(0, accepted=4) == 12
    assert adm.admit(10, learner_version=0, accepted=4) == 6
    # The learner advancing a version opens one batch of room.
    assert adm.admit(10, learner_version=1, accepted=4) == 4
    adm.abort(3)
    assert adm.running_episodes == 11
    with pytest.raises(ValueError, match="running"):
        adm.finish(12, 1)
    with pytest.raises(ValueError, match="batch_size"):
        AdmissionController(batch_size=0)


def test_lost_samples_give_admission_room_back():
    buf = RingBuffer(capacity=4, max_staleness=2)
    adm = AdmissionController(batch_size=4, samples_per_episode_prior=1.0)
    assert adm.admit(100, 0, accepted_samples(buf)) == 12
    adm.finish(12, 12)
    buf.put(entries([0] * 12))  # 8 evicted by the small ring
    assert accepted_samples(buf) == 4
    assert adm.admit(100, 0, accepted_samples(buf)) == 8


class BufferMachine(RuleBasedStateMachine):
    """Random puts, gets, sweeps and version bumps against the invariants."""

    def __init__(self):
        super().__init__()
        self.buf = None
        self.version = 0
        self.next_id = 0
        self.returned = set()
        self.put_versions = {}

    @rule(capacity=st.integers(1, 12), max_staleness=st.integers(0, 3))
    @precondition(lambda self: self.buf is None)
    def create(self, capacity, max_staleness):
        self.buf = RingBuffer(capacity=capacity, max_staleness=max_staleness)

    @rule(lags=st.lists(st.integers(0, 5), max_size=8))
    @precondition(lambda self: self.buf is not None)
    def put(self, lags):
        batch = []
        for lag in lags:
            batch.append(Entry(version=max(0, self.version - lag), payload=self.next_id))
            self.put_versions[self.next_id] = batch[-1].version
            self.next_id += 1
        self.buf.put(batch)

    @rule(n=st.integers(0, 10))
    @precondition(lambda self: self.buf is not None)
    def get(self, n):
        got = self.buf.get(n, self.version)
        assert len(got) <= n
        ids = [e.payload for e in got]
        assert ids == sorted(ids), "FIFO order"
        for e in got:
            assert e.payload not in self.returned, "returned twice"
            assert self.version - e.version <= self.buf.max_staleness, "too stale"
            self.returned.add(e.payload)

    @rule()
    @precondition(lambda self: self.buf is not None)
    def sweep(self):
        self.buf.drop_stale(self.version)
        assert self.buf.num_fresh(self.version) == len(self.buf)

    @rule(step=st.integers(1, 3))
    def advance(self, step):
        self.version += step

    @invariant()
    def counts_add_up(self):
        if self.buf is not None:
            check_counts(self.buf)


TestBufferMachine = BufferMachine.TestCase
TestBufferMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_discarded_entries_are_reported():
    gone = []
    buf = RingBuffer(capacity=3, max_staleness=0, on_discard=gone.append)
    buf.put(entries([0, 1, 1]))
    buf.put(entries([1], start=3))  # evicts payload 0
    assert [e.payload for e in gone] == [0]
    buf.put(entries([0], start=4))  # evicts 1; 4 is stale at version 1
    assert [e.payload for e in buf.get(1, learner_version=1)] == [2]
    buf.drop_stale(1)
    assert [e.payload for e in gone] == [0, 1, 4]
    check_counts(buf)


def test_lease_table_is_exactly_once():
    from buffer.core import GroupLease, LeaseTable

    table = LeaseTable()
    leases = [GroupLease(f"w0:{i}", "w0", "train", i, 4, i) for i in range(3)]
    for lease in leases:
        table.lease(lease)
    table.lease(GroupLease("w1:0", "w1", "train", 9, 4, 0))
    with pytest.raises(ValueError, match="already leased"):
        table.lease(leases[0])
    assert table.complete("w0:1") == leases[1]
    assert table.complete("w0:1") is None  # duplicate put
    assert table.complete("nope") is None
    with pytest.raises(ValueError, match="already leased"):
        table.lease(leases[1])  # a completed group cannot come back
    assert table.outstanding("w0") == [leases[0], leases[2]]
    assert table.next_index("w0") == 3 and table.next_index("w2") == 0
    assert table.num_completed("w0") == 1 and table.num_outstanding == 3
    assert table.release("w0:2") == leases[2] and table.outstanding("w0") == [leases[0]]


def test_all_or_nothing_admission():
    adm = AdmissionController(batch_size=4, max_staleness=0, samples_per_episode_prior=1.0)
    assert adm.admit(3, 0, 0, all_or_nothing=True) == 3
    assert adm.admit(2, 0, 0) == 1
    assert adm.admit(2, 0, 0, all_or_nothing=True) == 0 and adm.running_episodes == 4  # no room left


def test_a_learner_short_of_less_than_a_group_still_gets_one():
    """max_staleness 0, batch 32, groups of 8 episodes at ~7 samples each: the learner holds 28
    samples and needs 4; a group is admitted (it overshoots) instead of nothing, forever."""
    adm = AdmissionController(batch_size=32, max_staleness=0, samples_per_episode_prior=7.0)
    assert adm.admit(8, learner_version=0, accepted=28, all_or_nothing=True) == 8
    assert adm.admit(8, learner_version=0, accepted=28, all_or_nothing=True) == 0  # that group covers it


def test_a_group_passes_the_bound_only_when_the_learners_next_step_needs_it():
    """The tiny default's shape: groups of 4 episodes of 10 turns, B = 32, Δmax = 2 (room 96):
    two groups fit; a third would keep 120 samples in flight, so it waits (the Δmax = 0 test
    above is the exception: a learner whose next step lacks samples gets a group anyway)."""
    adm = AdmissionController(batch_size=32, max_staleness=2, samples_per_episode_prior=10.0)
    assert adm.admit(4, 0, 0, all_or_nothing=True) == 4
    assert adm.admit(4, 0, 0, all_or_nothing=True) == 4
    assert adm.capacity(0, 0) == 16
    assert adm.admit(4, 0, 0, all_or_nothing=True) == 0
    adm.finish(8, num_samples=60)  # both groups ended; 20 of their samples went stale (not accepted)
    assert adm.samples_per_episode == 7.5
    assert adm.admit(4, 1, accepted=32 + 8, all_or_nothing=True) == 4  # room 88
    assert adm.admit(4, 1, accepted=32 + 8, all_or_nothing=True) == 4  # room 58 >= 30
    assert adm.admit(4, 1, accepted=32 + 8, all_or_nothing=True) == 0  # room 28: in flight covers the next step


def test_groups_that_deliver_nothing_do_not_skew_the_estimate():
    adm = AdmissionController(batch_size=8, samples_per_episode_prior=4.0)
    adm.admit(4, 0, 0)
    adm.finish(4, num_samples=0)
    assert adm.samples_per_episode == 4.0 and adm.running_episodes == 0
    adm.admit(2, 0, 0)
    adm.finish(2, num_samples=1)
    assert adm.samples_per_episode == 1.0  # never below one sample per episode


def test_segments_store_each_turn_once_across_a_re_run():
    """A group delivered in segments, its worker killed, the group re-run from turn 0: every
    (trajectory, turn) is stored once, and nothing after the final put."""
    from buffer.core import GroupLease, LeaseTable

    table = LeaseTable()
    table.lease(GroupLease("w0:0", "w0", "train", 0, 2, 0))
    assert table.store("w0:0", (("w0:0/0", 0), ("w0:0/0", 1), ("w0:0/1", 0))) == [True, True, True]
    assert table.num_stored("w0:0") == 3
    # The re-run plays both episodes again; turns the first incarnation stored are refused.
    rerun = (("w0:0/0", 0), ("w0:0/0", 1), ("w0:0/0", 2), ("w0:0/1", 0), ("w0:0/1", 1))
    assert table.store("w0:0", rerun) == [False, False, True, False, True]
    assert table.complete("w0:0") is not None and table.num_stored("w0:0") == 0
    assert table.store("w0:0", (("w0:0/0", 3),)) is None  # completed: a late segment is refused
    assert table.store("nope", (("nope/0", 0),)) is None


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 8), min_size=1, max_size=4), data=st.data())
def test_any_segmentation_and_re_runs_store_every_turn_exactly_once(lengths, data):
    """Episodes cut into segments anywhere, interrupted by re-runs that start over at turn 0
    (a killed worker), then finished: the union of stored rows is every turn, once."""
    from buffer.core import GroupLease, LeaseTable

    table = LeaseTable()
    table.lease(GroupLease("g", "w", "train", 0, len(lengths), 0))
    stored: list[tuple[str, int]] = []
    for _ in range(data.draw(st.integers(0, 3))):  # incarnations killed part-way
        for e, n in enumerate(lengths):
            upto = data.draw(st.integers(0, n))
            turns = tuple((f"g/{e}", k) for k in range(upto))
            cut = data.draw(st.integers(0, upto))
            for part in (turns[:cut], turns[cut:]):
                stored += [t for t, new in zip(part, table.store("g", part)) if new]
    final = tuple((f"g/{e}", k) for e, n in enumerate(lengths) for k in range(n))
    stored += [t for t, new in zip(final, table.store("g", final)) if new]
    assert table.complete("g") is not None
    assert sorted(stored) == sorted(final)


def test_segments_delivered_by_running_episodes_count_once_in_admission():
    """Samples a running episode delivered are resident (in `accepted`) and no longer expected."""
    adm = AdmissionController(batch_size=10, max_staleness=0, samples_per_episode_prior=4.0)
    assert adm.admit(2, 0, accepted=0) == 2 and adm.capacity(0, accepted=0) == 2.0
    adm.deliver(3)  # a segment of 3 samples: resident now
    assert adm.capacity(0, accepted=3) == 2.0
    adm.deliver(6)  # more than expected: nothing more counted as still to come
    assert adm.capacity(0, accepted=9) == 1.0
    adm.finish(2, num_samples=10, delivered_before=9)
    assert adm.running_episodes == 0 and adm.delivered_running == 0 and adm.samples_per_episode == 5.0
    adm.admit(1, 1, accepted=10)
    adm.deliver(2)
    adm.abort(1, delivered_before=2)  # the owner is gone; its 2 samples stay resident
    assert adm.delivered_running == 0 and adm.capacity(1, accepted=12) == 8.0
    with pytest.raises(ValueError, match="delivered before"):
        adm.finish(0, num_samples=1, delivered_before=2)


def test_admission_counts_learner_steps_from_the_version_the_buffer_began_at():
    """After a warm start (or a resume) the learner is at v0 > 0 and has consumed nothing from
    this buffer: room is (Δmax + 1)·B, not (Δmax + v0 + 1)·B (which would admit without bound)."""
    adm = AdmissionController(batch_size=8, max_staleness=2, samples_per_episode_prior=1.0)
    adm.first_version = 384
    assert adm.capacity(384, accepted=0) == 24
    assert adm.admit(100, 384, accepted=0) == 24
    adm.finish(24, num_samples=24)
    assert adm.capacity(384, accepted=24) == 0
    assert adm.capacity(385, accepted=24) == 8  # one learner step later: B more room


@pytest.mark.parametrize("weights_lag, dropped", [(0, True), (5, False)])
def test_rounds_of_published_weights_start_nothing_that_goes_stale(weights_lag, dropped):
    """Weights published every 6 learner steps (L = 5) under Δmax = 5, episodes of one sample
    generated the moment they are admitted (the fastest rollout): counting L, admission starts
    only what the learner takes before the round's weights are Δmax old, and nothing is dropped;
    counting the workers' weights as the learner's (L = 0) it starts Δmax + 1 batches from weights
    already up to 5 versions old, and the resident ones go stale at the next round."""
    batch, max_staleness, publish_every = 4, 5, 6
    buf = RingBuffer(capacity=256, max_staleness=max_staleness)
    adm = AdmissionController(batch_size=batch, max_staleness=max_staleness, samples_per_episode_prior=1.0,
                              weights_lag=weights_lag)
    published = 0
    for version in range(60):
        started = adm.admit(1000, version, accepted_samples(buf))
        buf.put(entries([published] * started))
        adm.finish(started, started)
        assert len(buf.get(batch, version)) == batch  # the learner never waits
        if (version + 1) % publish_every == 0:
            published = version + 1
    assert (buf.counters.dropped_stale > 0) == dropped
    assert max(buf.counters.staleness_histogram) <= max_staleness
    with pytest.raises(ValueError, match="weights_lag"):
        AdmissionController(batch_size=4, max_staleness=2, weights_lag=3)
