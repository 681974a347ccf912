"""Learner ranks as Ray actors forming one torch.distributed group, and the driver-side handle.

Each rank receives the same `SampleBatch` (references only), reads the rows from the object
store, keeps its share -- whole episodes, dealt round-robin, so packing still applies -- and
runs `Trainer.train_step`. Rank 0 publishes full weights: it gathers the unsharded state
dict once and puts it into the object store; rollout workers load that one object. (On
GPU the same API fits an NCCL broadcast from rank 0 to the engines.)
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

from buffer.actor import SampleBatch, fetch_samples
from buffer.contracts import table_to_samples
from buffer.expansion import to_sequences
from learner.algorithms import AlgorithmConfig
from learner.models import ModelConfig
from learner.trainer import LearnerConfig, Trainer


def shard_by_episode(samples: list, rank: int, world_size: int) -> list:
    """This rank's samples: whole episodes, dealt round-robin in order of first appearance."""
    order: dict[str, int] = {}
    for s in samples:
        order.setdefault(s.trajectory_id, len(order))
    return [s for s in samples if order[s.trajectory_id] % world_size == rank]


class LearnerRank:
    """Actor body: joins the process group, then owns one Trainer."""

    def __init__(self, rank: int, world_size: int, store_path: str, config: LearnerConfig, model: ModelConfig,
                 backend: str = "gloo") -> None:
        """`store_path`: the rendezvous file of the group on the ranks' node (the plan keeps the
        learner ranks on one node). A file, not torch's TCPStore, whose server listens on every
        interface whatever address it is given (seen with `ss`), while every listener of a job
        stays on 127.0.0.1."""
        import torch
        import torch.distributed as dist

        from cluster.metrics import ActorMetrics

        device = "cuda" if backend == "nccl" else "cpu"
        if device == "cuda":
            torch.cuda.set_device(0)  # Ray gives each rank its own visible GPU
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size)
        self.trainer = Trainer(config, model, device=device)
        self.name = f"learner-{rank}"
        self.metrics = ActorMetrics("learner", self.name)

    def __repr__(self) -> str:  # the dashboard's Repr column
        return f"LearnerRank({self.name}, v{self.trainer.version})"

    def train(self, batch: SampleBatch, algorithm: AlgorithmConfig | None = None,
              lr: float | None = None) -> dict[str, float]:
        t = self.trainer
        samples = shard_by_episode(table_to_samples(fetch_samples(batch)), t.rank, t.world_size)
        stats = t.train_step(to_sequences(samples, packing=t.config.packing), algorithm, lr)
        self.metrics.set("learner_version", stats["version"])
        self.metrics.set("learner_step_seconds", stats["step_s"])
        self.metrics.set("opd_reverse_kl", stats["reverse_kl"])
        return stats

    def publish(self) -> list | None:
        """Rank 0 returns [ObjectRef] of the full state dict as numpy arrays (read zero-copy by
        the workers); other ranks take part in the gather and return None."""
        import ray

        state = self.trainer.full_state_dict()
        if self.trainer.rank != 0:
            return None
        return [ray.put({k: v.numpy() for k, v in state.items()})]

    def version(self) -> int:
        return self.trainer.version

    def save(self, directory: str, extra: dict[str, Any] | None = None) -> str:
        return str(self.trainer.save_checkpoint(directory, extra))

    def load(self, directory: str) -> dict[str, Any]:
        return self.trainer.load_checkpoint(directory)

    def export_hf(self, directory: str) -> str | None:
        from learner.models import load_tokenizer

        tokenizer = load_tokenizer(self.trainer.model_config) if self.trainer.rank == 0 else None
        out = self.trainer.export_hf(directory, tokenizer)
        return None if out is None else str(out)

    def logprobs(self, batch: SampleBatch) -> list[list[float]]:
        samples = table_to_samples(fetch_samples(batch))
        return [lp.tolist() for lp in self.trainer.evaluate_logprobs(to_sequences(samples, packing=False))]


class LearnerGroup:
    """Driver-side handle on N learner ranks."""

    def __init__(self, num_ranks: int, config: LearnerConfig, model: ModelConfig, num_cpus: float = 1.0,
                 num_gpus: float = 0.0, placement: list[Any] | None = None, named: bool = False) -> None:
        """`named`: rank r is the named actor `learner-<r>` (in the job's namespace)."""
        import ray

        if num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
        store_path = os.path.join(tempfile.gettempdir(), f"apprentice-learner-{uuid.uuid4().hex}")
        backend = "nccl" if num_gpus > 0 else "gloo"
        actor = ray.remote(LearnerRank)
        self.ranks = []
        for r in range(num_ranks):
            options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
            if named:
                options["name"] = f"learner-{r}"
            if placement is not None:
                options["scheduling_strategy"] = placement[r]
            self.ranks.append(actor.options(**options).remote(r, num_ranks, store_path, config, model, backend))

    def _all(self, method: str, *args) -> list:
        """The call on every rank. A rank that died fails the call at once (the others would
        wait for it in a collective until the process-group timeout)."""
        import ray

        refs = [getattr(r, method).remote(*args) for r in self.ranks]
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ray.get(ready[0])
        return ray.get(refs)

    def train(self, batch: SampleBatch, algorithm: AlgorithmConfig | None = None,
              lr: float | None = None) -> dict[str, float]:
        return self._all("train", batch, algorithm, lr)[0]

    def publish(self):
        """ObjectRef of the full state dict (rank 0's), ready for RolloutPool.publish_weights."""
        return self._all("publish")[0][0]

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
