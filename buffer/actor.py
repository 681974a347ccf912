"""The replay buffer as an async Ray actor, and the helpers producers and the learner call.

Bytes live in Ray's object store. A producer encodes one Arrow table per batch of finished
trajectories (`encode_trajectories`: one contiguous IPC buffer) and passes it to `put`; the
actor puts it back into the object store under its own ownership -- so samples survive the
death of the worker that produced them (an object dies with its owner) -- and keeps only that
reference, the rows and their versions. Each `ray.put` costs ~0.6 ms whatever its size
(measured: 1 KB to 600 KB alike, 35 µs per table when 20 go in one put), most of a put's time
in this single-threaded actor, so the tables that arrived since the last `get` wait in the
actor's memory (copied: a view of the producer's object would die with it) and go into the
object store together, one object holding a tuple of tables, when the next `get` needs them
or `BufferConfig.flush_bytes` have gathered. It releases a table when its last row is
consumed, evicted or dropped (an object is freed with the last of its tables), and answers
`get` with a `SampleBatch` naming a few tables and their rows; the learner reads those rows
straight from the object store (`fetch_samples`).

The actor runs the pure-Python core (buffer.core) in its single asyncio loop: put, admit
and stats never wait; `get` waits on an event that every put sets, so it never busy-loops,
and gives up after its timeout with whatever fresh samples it has.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from buffer.contracts import SAMPLE_SCHEMA, Trajectory, samples_to_table
from buffer.core import AdmissionController, Entry, GroupLease, LeaseTable, RingBuffer, accepted_samples
from buffer.expansion import expand


class BufferConfig(BaseModel):
    """Replay buffer settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capacity_samples: int = Field(default=4096, ge=1)
    """Ring capacity; when full the oldest samples are overwritten (counted as evicted)."""
    max_staleness: int = Field(default=2, ge=0)
    """Δmax: drop samples more than this many versions behind the learner (0 = on-policy)."""
    batch_size: int = Field(default=32, ge=1)
    """B: samples the learner consumes per step (admission control's unit of room)."""
    weights_lag: int = Field(default=0, ge=0)
    """L: versions the rollout workers' weights may be behind the learner's when a sample starts
    (run.publish_every - 1; a job sets it). Admission keeps Δmax - L learner steps of samples in
    flight, so samples from a round's old weights are not started only to go stale waiting."""
    samples_per_episode_prior: float = Field(default=4.0, gt=0)
    """Expected samples per episode until the first episodes finish; a job sets it to the
    rollout's turn limit unless given (jobs.train.JobConfig)."""
    staleness_of: Literal["turn", "episode", "group"] = "turn"
    """Which version Δmax counts from. turn: each sample's own (the weights that wrote that
    turn), so an episode longer than Δmax learner steps loses its early turns. episode: the
    version of its episode's last turn for every sample of the episode, so Δmax bounds how long
    a finished episode waits. group: the newest turn of the put that delivered it, for every
    sample of the put (a group's final put holds the whole group, delivered when its slowest
    episode ends: Δmax then bounds how long a delivered group waits; a segment counts from its
    own newest turn). Under episode and group earlier turns may be older than Δmax, which the
    learner's off-policy correction (each token's own behaviour log-prob) accounts for
    (docs/algorithms.md §6)."""
    flush_bytes: int = Field(default=16 << 20, ge=0)
    """Tables put since the last `get` wait in the actor's memory, to go into the object store
    in one put, until the next `get` or until they hold this many bytes (0: each table is put
    as it arrives, ~0.6 ms of the actor's time per put)."""


@dataclass(frozen=True)
class EncodedSamples:
    """Samples on their way into the buffer: one encoded Arrow table and its rows' versions."""

    data: np.ndarray
    """encode_table's Arrow IPC bytes (SAMPLE_SCHEMA), uint8, shape [num_bytes]."""
    policy_versions: tuple[int, ...]
    """Policy version of each row, shape [num_samples]."""
    episode_versions: tuple[int, ...]
    """Policy version of the last turn of each row's episode (of its segment, for a segment of a
    running episode), shape [num_samples]."""
    turns: tuple[tuple[str, int], ...]
    """(trajectory id, turn index) of each row, shape [num_samples]: what the buffer stores once."""

    @property
    def num_samples(self) -> int:
        return len(self.policy_versions)

    @property
    def num_bytes(self) -> int:
        return self.data.nbytes


@dataclass(frozen=True)
class SampleBatch:
    """Samples by reference: rows of Arrow tables (SAMPLE_SCHEMA) that live in the object store."""

    table_refs: tuple[Any, ...]
    """ray.ObjectRef of the object holding each table: a tuple of encode_table's Arrow IPC byte
    arrays (one put of several tables), shape [num_tables]."""
    parts: tuple[int, ...]
    """Which array of its object each table is, shape [num_tables]."""
    rows: tuple[tuple[int, ...], ...]
    """Row indices taken from each table, shape [num_tables][rows of that table]."""
    policy_versions: tuple[tuple[int, ...], ...]
    """The version staleness was counted from for each of those rows (BufferConfig.staleness_of:
    the row's own policy version, its episode's last, or its put's newest), same shape as rows."""

    @property
    def num_samples(self) -> int:
        return sum(len(r) for r in self.rows)

    def __add__(self, other: "SampleBatch") -> "SampleBatch":
        """Both batches' samples (a learner step gathered over several waits)."""
        return SampleBatch(self.table_refs + other.table_refs, self.parts + other.parts, self.rows + other.rows,
                           self.policy_versions + other.policy_versions)

    def __post_init__(self) -> None:
        if not len(self.table_refs) == len(self.parts) == len(self.rows) == len(self.policy_versions):
            raise ValueError("table_refs, parts, rows and policy_versions must have one entry per table")
        if any(len(r) != len(v) for r, v in zip(self.rows, self.policy_versions)):
            raise ValueError("every row needs a policy version")


EMPTY_BATCH = SampleBatch((), (), (), ())


class ReplayBuffer:
    """Async actor body; start it with `create_buffer_actor`."""

    def __init__(self, config: BufferConfig) -> None:
        from cluster.metrics import ActorMetrics

        self.config = config
        # Ring payload: (table key, row). Tables: key -> [ObjectRef (None until put), rows still
        # resident, bytes, index in its object]; the bytes of those not put yet wait in _pending.
        self._tables: dict[int, list[Any]] = {}
        self._pending: dict[int, np.ndarray] = {}
        self._next_key = 0
        self._ring: RingBuffer[tuple[int, int]] = RingBuffer(config.capacity_samples, config.max_staleness,
                                                            on_discard=lambda e: self._release(e.payload[0]))
        self._admission = AdmissionController(config.batch_size, config.max_staleness,
                                              config.samples_per_episode_prior, config.weights_lag)
        self._leases = LeaseTable()
        self._num_duplicates = 0
        self._num_duplicate_turns = 0
        self._version = 0
        self._new_data = asyncio.Event()
        self.metrics = ActorMetrics("buffer", "buffer")
        self._exported = {"evicted": 0, "stale": 0}

    def __repr__(self) -> str:  # the dashboard's Repr column
        return f"ReplayBuffer({self.config.capacity_samples} samples, max_staleness {self.config.max_staleness})"

    async def admit_group(self, lease: GroupLease) -> bool:
        """Admit a whole group of `lease.group_size` episodes, or refuse (the caller waits and retries)."""
        if not self._admission.admit(lease.group_size, self._version, accepted_samples(self._ring),
                                     all_or_nothing=True):
            return False
        self._leases.lease(lease)
        return True

    async def recover(self, owner: str) -> tuple[list[GroupLease], int, int]:
        """For a (re)started worker: its outstanding leases, where its stream continues, groups it completed."""
        return self._leases.outstanding(owner), self._leases.next_index(owner), self._leases.num_completed(owner)

    async def abort_owner(self, owner: str) -> int:
        """A worker is gone for good: release its outstanding groups. Returns how many."""
        leases = self._leases.outstanding(owner)
        for lease in leases:
            delivered = self._leases.num_stored(lease.group_id)
            self._leases.release(lease.group_id)
            self._admission.abort(lease.group_size, delivered_before=delivered)
        return len(leases)

    async def put_group(self, samples: EncodedSamples, group_id: str, final: bool = True) -> bool:
        """Store a leased group's samples, each (trajectory, turn) exactly once: a repeated or
        unknown group is refused (False), and so are the rows of turns already stored (counted).
        `final=False`: a segment of running episodes (`RolloutConfig.segments`); the group stays
        leased until its final put."""
        before = self._leases.num_stored(group_id)
        new = self._leases.store(group_id, samples.turns)
        if new is None:
            self._num_duplicates += 1
            return False
        rows = [row for row, is_new in enumerate(new) if is_new]
        self._num_duplicate_turns += samples.num_samples - len(rows)
        await self.put(samples, rows)
        if final:
            lease = self._leases.complete(group_id)
            self._admission.finish(lease.group_size, before + len(rows), delivered_before=before)
        else:
            self._admission.deliver(len(rows))
        return True

    async def put(self, samples: EncodedSamples, rows: list[int] | None = None) -> int:
        """Store samples (only `rows` of them, when given) outside any lease or admission
        (offline data, benchmarks). Returns evictions."""
        rows = list(range(samples.num_samples)) if rows is None else rows
        if not rows:
            return 0
        key = self._next_key
        self._next_key += 1
        self._tables[key] = [None, len(rows), samples.num_bytes, 0]
        self._pending[key] = samples.data.copy()
        if sum(data.nbytes for data in self._pending.values()) >= self.config.flush_bytes:
            self._flush()
        versions = staleness_versions(samples, self.config.staleness_of)
        evicted = self._ring.put([Entry(versions[row], (key, row)) for row in rows])
        self._new_data.set()
        self._export()
        return evicted

    async def get(self, n: int, learner_version: int, timeout_s: float = 60.0) -> SampleBatch:
        """Up to n samples fresh for `learner_version`, waiting up to timeout_s for enough of them."""
        self._advance(learner_version)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        taken: list[Entry[tuple[int, int]]] = []
        while True:
            taken.extend(self._ring.get(n - len(taken), self._version))
            remaining = deadline - loop.time()
            if len(taken) >= n or remaining <= 0:
                break
            self._new_data.clear()
            try:
                await asyncio.wait_for(self._new_data.wait(), remaining)
            except TimeoutError:
                pass
        by_table: dict[int, tuple[list[int], list[int]]] = {}
        for entry in taken:
            key, row = entry.payload
            rows, versions = by_table.setdefault(key, ([], []))
            rows.append(row)
            versions.append(entry.version)
        if any(key in self._pending for key in by_table):
            self._flush()
        refs = tuple(self._tables[key][0] for key in by_table)
        parts = tuple(self._tables[key][3] for key in by_table)
        for entry in taken:
            self._release(entry.payload[0])
            self.metrics.observe("consumed_staleness", self._version - entry.version)
        self._export()
        return SampleBatch(refs, parts, tuple(tuple(r) for r, _ in by_table.values()),
                           tuple(tuple(v) for _, v in by_table.values()))

    async def begin(self, learner_version: int) -> None:
        """The learner's version as this buffer starts feeding it, before any `get` (after a warm
        start or a resume): admission counts the learner's steps from here."""
        if self._ring.counters.consumed:
            raise ValueError(f"begin({learner_version}) after {self._ring.counters.consumed} samples were consumed")
        self._admission.first_version = learner_version
        self._advance(learner_version)

    async def set_version(self, learner_version: int) -> int:
        """The learner published a new version; drops what became too stale. Returns drops."""
        return self._advance(learner_version)

    async def stats(self) -> dict[str, Any]:
        c = self._ring.counters
        return {
            "learner_version": self._version,
            "num_resident": len(self._ring),
            "num_fresh": self._ring.num_fresh(self._version),
            "capacity": self._ring.capacity,
            "occupancy": len(self._ring) / self._ring.capacity,
            "num_put": c.put,
            "num_consumed": c.consumed,
            "num_evicted": c.evicted,
            "num_dropped_stale": c.dropped_stale,
            "staleness_histogram": dict(c.staleness_histogram),
            "num_running_episodes": self._admission.running_episodes,
            "admission_capacity": self._admission.capacity(self._version, accepted_samples(self._ring)),
            "num_tables_held": len(self._tables),
            "num_bytes_held": sum(held[2] for held in self._tables.values()),
            "num_outstanding_groups": self._leases.num_outstanding,
            "num_duplicate_groups": self._num_duplicates,
            "num_duplicate_turns": self._num_duplicate_turns,
            "num_delivered_running": self._admission.delivered_running,
        }

    def _advance(self, learner_version: int) -> int:
        if learner_version < self._version:
            raise ValueError(f"learner version went backwards: {learner_version} < {self._version}")
        self._version = learner_version
        dropped = self._ring.drop_stale(learner_version)
        self._export()
        return dropped

    def _export(self) -> None:
        c = self._ring.counters
        self.metrics.set("buffer_occupancy", len(self._ring) / self._ring.capacity)
        for reason, total in (("evicted", c.evicted), ("stale", c.dropped_stale)):
            self.metrics.inc("buffer_dropped", total - self._exported[reason], reason=reason)
            self._exported[reason] = total

    def _flush(self) -> None:
        """One object-store put of the tables waiting for one; the buffer owns the object."""
        import ray

        ref = ray.put(tuple(self._pending.values()))
        for part, key in enumerate(self._pending):
            self._tables[key][0], self._tables[key][3] = ref, part
        self._pending.clear()

    def _release(self, key: int) -> None:
        held = self._tables[key]
        held[1] -= 1
        if held[1] == 0:
            del self._tables[key]
            self._pending.pop(key, None)


def create_buffer_actor(config: BufferConfig, **options: Any):
    """Start the buffer actor (0 CPUs by default: it only moves metadata)."""
    import ray

    options.setdefault("num_cpus", 0)
    return ray.remote(ReplayBuffer).options(**options).remote(config)


def encode_table(table: pa.Table) -> np.ndarray:
    """A table as one Arrow IPC stream in a uint8 array.

    One contiguous buffer puts 3x faster than a pickled table (one buffer per column
    chunk) and is read back zero-copy from the object store's shared memory.
    """
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return np.frombuffer(sink.getvalue(), dtype=np.uint8)


def decode_table(data: np.ndarray) -> pa.Table:
    """Inverse of encode_table, without copying the buffers."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def staleness_versions(samples: EncodedSamples, staleness_of: str) -> tuple[int, ...]:
    """The version Δmax counts from for each row of a put (BufferConfig.staleness_of), shape [num_samples]."""
    if staleness_of == "turn":
        return samples.policy_versions
    if staleness_of == "episode":
        return samples.episode_versions
    return (max(samples.policy_versions),) * samples.num_samples


def encode_trajectories(trajectories: list[Trajectory]) -> EncodedSamples:
    """Expand trajectories into samples, encoded as one Arrow table for `put`."""
    samples = [s for t in trajectories for s in expand(t)]
    # Turns are in order and a turn is never older than the one before it: the last is the newest.
    episode_versions = tuple(t.turns[-1].policy_version for t in trajectories for _ in t.turns)
    return EncodedSamples(encode_table(samples_to_table(samples)), tuple(s.policy_version for s in samples),
                          episode_versions, tuple((s.trajectory_id, s.turn_index) for s in samples))


def fetch_samples(batch: SampleBatch) -> pa.Table:
    """The rows of a batch as one Arrow table, read zero-copy from the object store on this node.

    Rows come grouped by source table, in the order the buffer returned them, so one
    episode's samples stay consecutive and in turn order.
    """
    import ray

    if not batch.table_refs:
        return SAMPLE_SCHEMA.empty_table()
    # One get per object: many of a batch's tables share one (the buffer puts them together), and
    # ray.get deserializes a ref each time it is listed (a 512-GPU batch's ~5,000 tables of a few
    # objects held ~19 GB in the simulated learner; docs/architecture.md, "Flow").
    unique = list(dict.fromkeys(batch.table_refs))
    objects = dict(zip(unique, ray.get(unique)))
    pieces = []
    for ref, part, rows in zip(batch.table_refs, batch.parts, batch.rows):
        table = decode_table(objects[ref][part])
        # Consecutive rows become zero-copy slices.
        start = prev = rows[0]
        for row in rows[1:] + (None,):
            if row is not None and row == prev + 1:
                prev = row
                continue
            pieces.append(table.slice(start, prev - start + 1))
            if row is not None:
                start = prev = row
    return pa.concat_tables(pieces)
