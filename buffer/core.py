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

    Unit: samples. With B samples per learner step, version v and staleness bound Δmax,
        capacity = (Δmax + v + 1) * B - (accepted + running)
    where `accepted` counts samples that were or will be trained on (consumed + resident:
    samples lost to eviction or staleness give their room back, so a loss cannot deadlock
    the learner), and `running` is the episodes in flight times the mean samples per
    finished episode (a prior until the first episode finishes). Episodes are admitted
    whole, as many as fit.
    """

    def __init__(self, batch_size: int, max_staleness: int = 2, samples_per_episode_prior: float = 4.0) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 sample, got {batch_size}")
        if samples_per_episode_prior <= 0:
            raise ValueError(f"samples_per_episode_prior must be > 0, got {samples_per_episode_prior}")
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.running_episodes = 0
        self._prior = samples_per_episode_prior
        self._finished_episodes = 0
        self._finished_samples = 0

    @property
    def samples_per_episode(self) -> float:
        if self._finished_episodes == 0:
            return self._prior
        return self._finished_samples / self._finished_episodes

    def capacity(self, learner_version: int, accepted: int) -> float:
        """Samples that may still be started at this version."""
        limit = (self.max_staleness + learner_version + 1) * self.batch_size
        return limit - (accepted + self.running_episodes * self.samples_per_episode)

    def admit(self, num_episodes: int, learner_version: int, accepted: int) -> int:
        """Reserve up to num_episodes episodes; returns how many were granted (0 = wait)."""
        if num_episodes < 0:
            raise ValueError(f"num_episodes must be >= 0, got {num_episodes}")
        room = self.capacity(learner_version, accepted)
        granted = max(0, min(num_episodes, int(room // self.samples_per_episode)))
        self.running_episodes += granted
        return granted

    def finish(self, num_episodes: int, num_samples: int) -> None:
        """Episodes admitted earlier ended and produced num_samples samples."""
        self._release(num_episodes)
        self._finished_episodes += num_episodes
        self._finished_samples += num_samples

    def abort(self, num_episodes: int) -> None:
        """Episodes admitted earlier will not deliver (a worker died): give their room back."""
        self._release(num_episodes)

    def _release(self, num_episodes: int) -> None:
        if not 0 <= num_episodes <= self.running_episodes:
            raise ValueError(f"releasing {num_episodes} episodes but {self.running_episodes} are running")
        self.running_episodes -= num_episodes


def accepted_samples(buffer: RingBuffer[Any]) -> int:
    """Samples that were or will be trained on: consumed + resident."""
    return buffer.counters.consumed + len(buffer)
