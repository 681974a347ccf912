"""The replay buffer core: a fixed-capacity ring with a staleness filter, and admission control.

Pure Python, no Ray import: the Ray actor in buffer/actor.py wraps it.

Lock-free by ownership. The core lives inside one asyncio event loop (the buffer actor);
every put, get and admit runs to completion between two awaits, so no lock is taken and
no caller ever waits on one: producers' puts never block (a full ring overwrites its oldest
entry and counts it as evicted) and the consumer's get never holds producers back (it
waits on an event, outside the core). Were the core ever shared between threads, the
single-producer/single-consumer form of this ring would need the head index published
with release/acquire atomics after the slot is written, and multiple producers a
fetch-and-add on the tail; tombstoning a stale slot would need a compare-and-swap.

Order: FIFO. With admission bounding how far producers run ahead, the oldest resident
samples are the ones closest to the staleness limit, so consuming them first minimises
what is dropped as stale; freshest-first would strand old samples until they expire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

P = TypeVar("P")


@dataclass(frozen=True)
class Entry(Generic[P]):
    """One resident sample: its policy version and an opaque payload (a sample, or a reference)."""

    version: int
    """Learner version that generated the sample."""
    payload: P
    """What get() hands back: the Sample itself, or where its bytes live."""


@dataclass
class BufferCounters:
    """Cumulative counts; `put == consumed + dropped_stale + evicted + resident` always."""

    put: int = 0
    consumed: int = 0
    evicted: int = 0
    dropped_stale: int = 0
    staleness_histogram: dict[int, int] = field(default_factory=dict)
    """Consumed samples by staleness (learner version at consumption - sample version)."""


class RingBuffer(Generic[P]):
    """Fixed capacity in samples; puts overwrite the oldest when full; gets filter staleness.

    `on_discard` is called with every entry that leaves without being returned (evicted or
    dropped as stale), so an owner can release what the payload refers to.
    """

    def __init__(self, capacity: int, max_staleness: int = 2,
                 on_discard: Callable[[Entry[P]], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 sample, got {capacity}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 (0 = on-policy), got {max_staleness}")
        self.capacity = capacity
        self.max_staleness = max_staleness
        self._slots: list[Entry[P] | None] = [None] * capacity
        self._head = 0  # index of the oldest slot in use
        self._used = 0  # slots between head and tail, tombstones included
        self._resident = 0  # live entries
        self._on_discard = on_discard
        self.counters = BufferCounters()

    def __len__(self) -> int:
        return self._resident

    def put(self, entries: list[Entry[P]]) -> int:
        """Append entries; returns how many resident entries were evicted to make room."""
        evicted = 0
        for entry in entries:
            if self._used == self.capacity:
                oldest = self._slots[self._head]
                if oldest is not None:
                    evicted += 1
                    self._resident -= 1
                    self._discard(oldest)
                self._slots[self._head] = None
                self._head = (self._head + 1) % self.capacity
                self._used -= 1
            self._slots[(self._head + self._used) % self.capacity] = entry
            self._used += 1
            self._resident += 1
        self.counters.put += len(entries)
        self.counters.evicted += evicted
        return evicted

    def get(self, n: int, learner_version: int) -> list[Entry[P]]:
        """Up to n entries, oldest first, each at most max_staleness versions behind; staler ones are dropped."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out: list[Entry[P]] = []
        while len(out) < n and self._used:
            entry = self._slots[self._head]
            self._slots[self._head] = None
            self._head = (self._head + 1) % self.capacity
            self._used -= 1
            if entry is None:
                continue
            self._resident -= 1
            staleness = learner_version - entry.version
            if staleness > self.max_staleness:
                self.counters.dropped_stale += 1
                self._discard(entry)
                continue
            out.append(entry)
            hist = self.counters.staleness_histogram
            hist[staleness] = hist.get(staleness, 0) + 1
        self.counters.consumed += len(out)
        return out

    def num_fresh(self, learner_version: int) -> int:
        """Resident entries that get() would still return at this version."""
        return sum(1 for e in self._live() if learner_version - e.version <= self.max_staleness)

    def drop_stale(self, learner_version: int) -> int:
        """Tombstone every resident entry too stale for `learner_version`; returns the count."""
        dropped = 0
        for i in range(self._used):
            slot = (self._head + i) % self.capacity
            entry = self._slots[slot]
            if entry is not None and learner_version - entry.version > self.max_staleness:
                self._slots[slot] = None
                dropped += 1
                self._discard(entry)
        self._resident -= dropped
        self.counters.dropped_stale += dropped
        return dropped

    def _discard(self, entry: Entry[P]) -> None:
        if self._on_discard is not None:
            self._on_discard(entry)

    def _live(self):
        for i in range(self._used):
            entry = self._slots[(self._head + i) % self.capacity]
            if entry is not None:
                yield entry


class AdmissionController:
    """Bounds how far rollout runs ahead of the learner, so it does not generate work that would be dropped.

    Unit: samples. With B samples per learner step, version v, staleness bound Δmax and the
    rollout workers' weights up to L versions behind the learner's (`weights_lag`: the rounds of
    `run.publish_every` = L + 1; 0 when every version is published),
        capacity = (Δmax - L + (v - v0) + 1) * B - (accepted + running)
    where v0 is the learner's version when this buffer began feeding it (`first_version`: after
    a warm start or a resume the learner is at v0 > 0 and has consumed nothing from it yet),
    `accepted` counts samples that were or will be trained on (consumed + resident: samples
    lost to eviction or staleness give their room back, so a loss cannot deadlock the
    learner), and `running` is the episodes in flight times the mean samples per
    finished episode (a prior until the first episode finishes), less the samples those
    episodes already delivered in segments (they are in `accepted`). Episodes are admitted
    whole, as many as fit. A group (`all_or_nothing`) is admitted whole when its expected
    samples fit, and past the bound (by less than one group) only when the learner's next
    step would otherwise lack samples even after every running episode delivers:
        need_next = (v - v0 + 1) * B - (accepted + running) = capacity - (Δmax - L) * B > 0
    Without that exception a learner short of fewer samples than a group yields would wait
    forever (with max_staleness 0, or when a group's early turns went stale and it delivered
    less than estimated); admitting on any room instead let every group overshoot, and a
    group of several long episodes (the tiny default's 4 x 10 turns against B = 32) then
    kept more samples in flight than the bound, whose early turns went stale.
    A sample started now comes from weights as old as v - L, so only Δmax - L versions are left
    for it to wait in: with L counted as 0, rounds of 60 published versions under Δmax = 62 kept
    63 batches in flight from weights up to 59 versions old, and 45% of the samples put went
    stale (docs/babyai_text.md, "The job's hour in the probe's shape").
    """

    def __init__(self, batch_size: int, max_staleness: int = 2, samples_per_episode_prior: float = 4.0,
                 weights_lag: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 sample, got {batch_size}")
        if not 0 <= weights_lag <= max_staleness:
            raise ValueError(f"weights_lag must be in [0, max_staleness={max_staleness}], got {weights_lag}")
        if samples_per_episode_prior <= 0:
            raise ValueError(f"samples_per_episode_prior must be > 0, got {samples_per_episode_prior}")
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.weights_lag = weights_lag
        self.running_episodes = 0
        self._prior = samples_per_episode_prior
        self._finished_episodes = 0
        self._finished_samples = 0
        self.delivered_running = 0
        """Samples running episodes delivered in segments, before they finished."""
        self.first_version = 0
        """v0: the learner's version when this buffer began feeding it."""

    @property
    def _wait_bound(self) -> int:
        """Learner steps a sample may wait between its start and its consumption: Δmax - L."""
        return self.max_staleness - self.weights_lag

    @property
    def samples_per_episode(self) -> float:
        if self._finished_episodes == 0:
            return self._prior
        return max(1.0, self._finished_samples / self._finished_episodes)

    def capacity(self, learner_version: int, accepted: int) -> float:
        """Samples that may still be started at this version."""
        limit = (self._wait_bound + learner_version - self.first_version + 1) * self.batch_size
        still_to_come = max(0.0, self.running_episodes * self.samples_per_episode - self.delivered_running)
        return limit - (accepted + still_to_come)

    def admit(self, num_episodes: int, learner_version: int, accepted: int, all_or_nothing: bool = False) -> int:
        """Reserve up to num_episodes episodes (all_or_nothing: all of them if they fit or the
        learner's next step needs them, else none); returns the grant."""
        if num_episodes < 0:
            raise ValueError(f"num_episodes must be >= 0, got {num_episodes}")
        room = self.capacity(learner_version, accepted)
        if all_or_nothing:
            fits = room >= num_episodes * self.samples_per_episode
            needed = room - self._wait_bound * self.batch_size > 0
            granted = num_episodes if fits or needed else 0
        else:
            granted = max(0, min(num_episodes, int(room // self.samples_per_episode)))
        self.running_episodes += granted
        return granted

    def deliver(self, num_samples: int) -> None:
        """Running episodes delivered a segment of num_samples samples (they go on)."""
        self.delivered_running += num_samples

    def finish(self, num_episodes: int, num_samples: int, delivered_before: int = 0) -> None:
        """Episodes admitted earlier ended and produced num_samples samples in all, of which
        `delivered_before` came in earlier segments."""
        if not 0 <= delivered_before <= min(num_samples, self.delivered_running):
            raise ValueError(f"{delivered_before} samples delivered before, of {num_samples} in all and "
                             f"{self.delivered_running} delivered by running episodes")
        self._release(num_episodes)
        self.delivered_running -= delivered_before
        if num_samples:
            # Groups filtered out (no signal) deliver nothing: they say nothing about episode length.
            self._finished_episodes += num_episodes
            self._finished_samples += num_samples

    def abort(self, num_episodes: int, delivered_before: int = 0) -> None:
        """Episodes admitted earlier will not deliver more (their worker is gone): give their room
        back; `delivered_before` of their samples came in segments and stay."""
        self._release(num_episodes)
        self.delivered_running -= delivered_before

    def _release(self, num_episodes: int) -> None:
        if not 0 <= num_episodes <= self.running_episodes:
            raise ValueError(f"releasing {num_episodes} episodes but {self.running_episodes} are running")
        self.running_episodes -= num_episodes


def accepted_samples(buffer: RingBuffer[Any]) -> int:
    """Samples that were or will be trained on: consumed + resident."""
    return buffer.counters.consumed + len(buffer)


@dataclass(frozen=True)
class GroupLease:
    """A GRPO group admitted to rollout: G episodes of one task, owned by one worker."""

    group_id: str
    """Unique id; also the trajectories' group id."""
    owner: str
    """Worker that runs the group."""
    split: str
    """Split of the task."""
    seed: int
    """Seed of the task."""
    group_size: int
    """G: episodes in the group."""
    index: int
    """Position of the group in its owner's stream (0, 1, ...)."""


class LeaseTable:
    """Exactly-once bookkeeping of admitted groups, per (episode, turn).

    A group is leased when admitted and completed when its last trajectories are put; a
    second put of the same group (a worker that died after putting, then re-ran it) is
    refused. Before that, a leased group may deliver segments (a running episode's finished
    turns, `RolloutConfig.segments`): each (trajectory, turn index) is stored once, and a
    re-run's turns that an earlier incarnation stored are refused. A restarted worker gets
    its outstanding leases back and re-runs them, so a death loses nothing and duplicates
    nothing. Completed ids are kept (a few bytes each) to refuse late duplicates.
    """

    def __init__(self) -> None:
        self._leased: dict[str, GroupLease] = {}
        self._stored: dict[str, set[tuple[str, int]]] = {}
        """Outstanding group -> the (trajectory id, turn index) its segments stored."""
        self._completed: set[str] = set()
        self._next_index: dict[str, int] = {}
        self._completed_by_owner: dict[str, int] = {}

    def lease(self, lease: GroupLease) -> None:
        if lease.group_id in self._leased or lease.group_id in self._completed:
            raise ValueError(f"group {lease.group_id!r} was already leased")
        self._leased[lease.group_id] = lease
        self._next_index[lease.owner] = max(self._next_index.get(lease.owner, 0), lease.index + 1)

    def store(self, group_id: str, turns: tuple[tuple[str, int], ...]) -> list[bool] | None:
        """Which of a segment's rows, named (trajectory id, turn index), are new (recorded as
        stored now); None when the group is not outstanding (unknown or completed)."""
        if group_id not in self._leased:
            return None
        stored = self._stored.setdefault(group_id, set())
        new = []
        for turn in turns:
            new.append(turn not in stored)
            stored.add(turn)
        return new

    def num_stored(self, group_id: str) -> int:
        """Rows an outstanding group's segments stored so far."""
        return len(self._stored.get(group_id, ()))

    def complete(self, group_id: str) -> GroupLease | None:
        """The lease, now completed; None when the group is unknown or already completed."""
        lease = self._leased.pop(group_id, None)
        if lease is not None:
            self._stored.pop(group_id, None)
            self._completed.add(group_id)
            self._completed_by_owner[lease.owner] = self._completed_by_owner.get(lease.owner, 0) + 1
        return lease

    def release(self, group_id: str) -> GroupLease | None:
        """Drop a lease that will never complete; returns it, or None if unknown."""
        self._stored.pop(group_id, None)
        return self._leased.pop(group_id, None)

    def outstanding(self, owner: str) -> list[GroupLease]:
        return sorted((l for l in self._leased.values() if l.owner == owner), key=lambda l: l.index)

    def next_index(self, owner: str) -> int:
        """Where the owner's stream continues (after every group it ever leased)."""
        return self._next_index.get(owner, 0)

    def num_completed(self, owner: str) -> int:
        return self._completed_by_owner.get(owner, 0)

    @property
    def num_outstanding(self) -> int:
        return len(self._leased)
