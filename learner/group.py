"""Learner ranks as Ray actors forming one torch.distributed group, and the driver-side handle.

The ranks may sit on any nodes: they meet at rank 0's node address (a TCPStore on a socket
rank 0 bound there). Each rank receives the same `SampleBatch` (references only), reads the rows
from the object store, keeps its share -- whole episodes, dealt round-robin, so packing still
applies -- and runs `Trainer.train_step`. Rank 0 publishes full weights: it gathers the unsharded state
dict once and puts it into the object store; rollout workers load that one object. (On
GPU the same API fits an NCCL broadcast from rank 0 to the engines.)
"""

from __future__ import annotations

import time
from typing import Any

from buffer.actor import SampleBatch, fetch_samples
from buffer.contracts import table_to_samples
from buffer.expansion import to_sequences
from learner.algorithms import AlgorithmConfig
from models.loading import ModelConfig
from learner.trainer import LearnerConfig, Trainer


SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_of(address: str) -> str | None:
    """The name of the (Linux) network interface holding IPv4 `address`, None when none does."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def socket_ifname(configured: str | None, node_address: str, environ: dict[str, str]) -> dict[str, str]:
    """The SOCKET_IFNAME_VARS a rank sets before it joins: the configured interface; else none
    where the environment already names one; else the interface of the node's Ray address.
    Without them gloo binds the address the hostname resolves to, which may be a public one."""
    if configured is None and any(environ.get(var) for var in SOCKET_IFNAME_VARS):
        return {}
    name = configured or interface_of(node_address)
    if name is None:
        raise ValueError(f"no network interface holds this node's Ray address {node_address}: set "
                         f"learner.socket_ifname to the interface the learner ranks should use")
    return dict.fromkeys(SOCKET_IFNAME_VARS, name)


def shard_by_episode(samples: list, rank: int, world_size: int) -> list:
    """This rank's samples: whole episodes, dealt round-robin in order of first appearance."""
    order: dict[str, int] = {}
    for s in samples:
        order.setdefault(s.trajectory_id, len(order))
    return [s for s in samples if order[s.trajectory_id] % world_size == rank]


class LearnerRank:
    """Actor body: joins the process group (`join`), then owns one Trainer."""

    def __init__(self, rank: int, world_size: int, config: LearnerConfig, model: ModelConfig) -> None:
        self.rank, self.world_size = rank, world_size
        self.config, self.model_config = config, model
        self.name = f"learner-{rank}"
        self._listener = None
        self.trainer: Trainer | None = None

    def listen(self) -> tuple[str, int]:
        """Rank 0: bind the group's rendezvous port on this node's address as Ray reports it
        (127.0.0.1 on the embedded node; the node's cluster address elsewhere), which every
        rank on any node can reach. The socket is handed to torch's TCPStore in `join`: given
        a host and port alone, its server listens on every interface."""
        import socket

        import ray

        host = ray.util.get_node_ip_address()
        self._listener = socket.create_server((host, 0), backlog=self.world_size + 8)
        return host, self._listener.getsockname()[1]

    def join(self, address: tuple[str, int], timeout_s: float) -> None:
        """Form the process group through rank 0's store at `address` (each rank waits for the
        others at most `timeout_s`), then build the Trainer.
        The device is what this process has: CUDA (NCCL) where Ray gave it a GPU torch can use,
        else CPU (gloo) -- so declared GPUs without CUDA (the simulated cluster,
        docs/architecture.md) run the same placement on CPU."""
        from datetime import timedelta

        import os

        import ray
        import torch
        import torch.distributed as dist

        from cluster.metrics import ActorMetrics

        os.environ.update(socket_ifname(self.config.socket_ifname, ray.util.get_node_ip_address(), dict(os.environ)))
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(0)  # Ray gives each rank its own visible GPU
        host, port = address
        timeout = timedelta(seconds=timeout_s)
        if self.rank == 0:
            assert self._listener is not None, "listen() runs on rank 0 before join()"
            store = dist.TCPStore(host, port, self.world_size, is_master=True, timeout=timeout,
                                  master_listen_fd=self._listener.detach())
        else:
            store = dist.TCPStore(host, port, self.world_size, is_master=False, timeout=timeout)
        dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=self.rank, world_size=self.world_size)
        self.trainer = Trainer(self.config, self.model_config, device="cuda" if cuda else "cpu")
        self.metrics = ActorMetrics("learner", self.name)

    def __repr__(self) -> str:
        # The dashboard's Repr column and the log prefix, read once after __init__ by Ray: no version.
        return f"LearnerRank({self.name})"

    def train(self, batch: SampleBatch, algorithm: AlgorithmConfig | None = None,
              lr: float | None = None, num_minibatches: int | None = None, clock: float = 0.0) -> dict[str, float]:
        t = self.trainer
        samples = shard_by_episode(table_to_samples(fetch_samples(batch)), t.rank, t.world_size)
        stats = t.train_step(to_sequences(samples, packing=t.config.packing), algorithm, lr, num_minibatches, clock)
        self.metrics.set("learner_version", stats["version"])
        self.metrics.set("learner_step_seconds", stats["step_s"])
        self.metrics.set("opd_reverse_kl", stats["reverse_kl"])
        return stats

    def publish(self) -> tuple[list, dict[str, Any]] | None:
        """Rank 0 returns ([ObjectRef] of the full state dict in `model.dtype` (`PublishedWeights`,
        read zero-copy by the workers), {num_bytes, dtypes}); other ranks take part in the gather
        and return None."""
        import ray

        from models.weights import PublishedWeights

        state = self.trainer.full_state_dict()
        if self.trainer.rank != 0:
            return None
        weights = PublishedWeights.from_state_dict(state)
        info = {"num_bytes": sum(a.nbytes for a in weights.arrays.values()),
                "dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in state.values()})}
        return [ray.put(weights)], info

    def version(self) -> int:
        return self.trainer.version

    def save(self, directory: str, extra: dict[str, Any] | None = None) -> str:
        return str(self.trainer.save_checkpoint(directory, extra))

    def load(self, directory: str) -> dict[str, Any]:
        return self.trainer.load_checkpoint(directory)

    def export_hf(self, directory: str) -> str | None:
        from models.loading import load_tokenizer

        tokenizer = load_tokenizer(self.trainer.model_config) if self.trainer.rank == 0 else None
        out = self.trainer.export_hf(directory, tokenizer)
        return None if out is None else str(out)

    def logprobs(self, batch: SampleBatch) -> list[list[float]]:
        samples = table_to_samples(fetch_samples(batch))
        return [lp.tolist() for lp in self.trainer.evaluate_logprobs(to_sequences(samples, packing=False))]


class LearnerHung(RuntimeError):
    """Learner ranks that did not answer a call in time (`LearnerGroup._all`)."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


class LearnerGroup:
    """Driver-side handle on N learner ranks."""

    def __init__(self, num_ranks: int, config: LearnerConfig, model: ModelConfig, num_cpus: float = 1.0,
                 num_gpus: float = 0.0, placement: list[Any] | None = None, named: bool = False,
                 join_timeout_s: float = 600.0) -> None:
        """`named`: rank r is the named actor `learner-<r>` (in the job's namespace). The ranks may
        land on any nodes: they meet at rank 0's node address (`LearnerRank.listen`)."""
        import ray

        if num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
        actor = ray.remote(LearnerRank)
        self.ranks = []
        for r in range(num_ranks):
            options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
            if named:
                options["name"] = f"learner-{r}"
            if placement is not None:
                options["scheduling_strategy"] = placement[r]
            self.ranks.append(actor.options(**options).remote(r, num_ranks, config, model))
        self.published: dict[str, Any] = {}
        self.call_timeout_s = max(config.call_timeout_s, join_timeout_s)  # the first call builds the model
        address = ray.get(self.ranks[0].listen.remote())
        self._all("join", address, join_timeout_s)
        self.call_timeout_s = config.call_timeout_s

    def _all(self, method: str, *args) -> list:
        """The call on every rank. A rank that died fails the call at once (the others would
        wait for it in a collective until the process-group timeout); ranks that have not
        answered within `learner.call_timeout_s` are hung: killed (like a dead rank, the run
        cannot go on without them), and LearnerHung names them."""
        import ray

        refs = [getattr(r, method).remote(*args) for r in self.ranks]
        pending = list(refs)
        deadline = time.monotonic() + self.call_timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0.0))
            if not ready:
                hung = [r for r, ref in enumerate(refs) if ref in pending]
                for r in hung:
                    ray.kill(self.ranks[r], no_restart=True)
                raise LearnerHung(f"learner rank(s) {hung} did not answer `{method}` within {self.call_timeout_s:.0f} s "
                                  f"(learner.call_timeout_s): killed as hung", hung)
            ray.get(ready[0])
        return ray.get(refs)

    def train(self, batch: SampleBatch, algorithm: AlgorithmConfig | None = None,
              lr: float | None = None, num_minibatches: int | None = None, clock: float = 0.0) -> dict[str, float]:
        """Trainer.train_step on every rank's shard of `batch`; rank 0's stats (global)."""
        return self._all("train", batch, algorithm, lr, num_minibatches, clock)[0]

    def publish(self):
        """ObjectRef of the full state dict (rank 0's), ready for RolloutPool.publish_weights;
        `published` then says its size and dtypes."""
        refs, self.published = self._all("publish")[0]
        return refs[0]

    def version(self) -> int:
        return self._all("version")[0]

    def save(self, directory: str, extra: dict[str, Any] | None = None) -> str:
        return self._all("save", directory, extra)[0]

    def load(self, directory: str) -> dict[str, Any]:
        return self._all("load", directory)[0]

    def export_hf(self, directory: str) -> str:
        return self._all("export_hf", directory)[0]

    def logprobs(self, batch: SampleBatch) -> list[list[float]]:
        return self._all("logprobs", batch)[0]
