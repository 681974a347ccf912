"""One learner rank: FSDP2 model, AdamW, micro-batched steps, weight export, checkpoints.

Works in any torch.distributed process group (gloo on CPU, NCCL on GPU), also of size 1.
The model is wrapped with FSDP2 `fully_shard` per transformer block, then the root (not on a
lone fp32 rank: nothing to shard). Mixed precision follows `model.dtype`, on any device: the
parameters FSDP shards -- the optimizer's master weights, and AdamW's moments with them -- are
always fp32; forward and backward run in `model.dtype` (FSDP2's
`MixedPrecisionPolicy(param_dtype=...)`), gradients are reduced in fp32. Kept in bf16, a 1e-6
update of a weight near 1 rounds away (bf16 has 8 mantissa bits: its step at 1.0 is 2^-7).
Published weights and HF exports are cast to `model.dtype`; checkpoints keep the fp32 masters,
so a resumed run continues bit for bit (docs/architecture.md, "Precision").

A step whose global loss or gradient norm is not finite changes nothing: the gradients are
dropped, the optimizer, schedule and version stay, and the step's stats say `skipped:
"nonfinite"`; a batch without any trainable token is `skipped: "no_trainable_token"` (else None).

A step: this rank's sequences are split into micro-batches under a token budget; each
micro-batch's loss sum is divided by the *global* number of loss units (all-reduced before
the first forward), so gradient accumulation and data parallelism give exactly the
full-batch gradient. Every rank runs the same number of forward/backward passes (FSDP's
collectives must pair up), padding with empty micro-batches where its shard is smaller.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import shutil
import time
import types
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from pydantic import BaseModel, ConfigDict, Field, model_validator

from buffer.expansion import TrainSequence
from cluster.files import fsync_path, fsync_tree
from learner.algorithms import ALGORITHMS, AlgorithmConfig, AlgorithmSection, LossOutput, TokenBatch
from models.loading import ModelConfig, load_model


def check_checkpoint(directory: str | Path) -> dict[str, Any]:
    """The trainer state of a complete checkpoint; ValueError naming what is missing or unreadable.

    A checkpoint is complete when its trainer_state.json parses, the DCP metadata reads, every
    storage file the metadata names is present with a non-zero size, and every rank's RNG file exists.
    """
    from torch.distributed.checkpoint import FileSystemReader

    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"checkpoint {directory} does not exist")
    try:
        state = json.loads((directory / "trainer_state.json").read_text())
        world_size = int(state["world_size"])
        int(state["version"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint {directory}: trainer_state.json is missing or corrupt ({exc})") from exc
    try:
        metadata = FileSystemReader(str(directory / "dcp")).read_metadata()
    except Exception as exc:  # DCP raises several types for a bad file; all mean the same here
        raise ValueError(f"checkpoint {directory}: the DCP metadata is missing or corrupt ({exc})") from exc
    for name in sorted({item.relative_path for item in metadata.storage_data.values()}):
        shard = directory / "dcp" / name
        if not shard.is_file() or shard.stat().st_size == 0:
            raise ValueError(f"checkpoint {directory}: shard dcp/{name} is missing or empty")
    for rank in range(world_size):
        if not (directory / f"rng_rank{rank}.pt").is_file():
            raise ValueError(f"checkpoint {directory}: rng_rank{rank}.pt is missing")
    return state

PREVIOUS = ".previous"
"""Suffix of the copy a checkpoint re-save keeps until the new one is in place."""


class LearnerConfig(BaseModel):
    """Optimisation settings of the learner."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: AlgorithmSection = AlgorithmConfig()
    lr: float = Field(default=1e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(default=1.0, gt=0)
    warmup_steps: int = Field(default=0, ge=0)
    """Steps from 0 up to `lr`. Like `total_steps`, counted in the steps that follow this schedule:
    a step given its own rate (the warm start's SFT) does not move it, so a run's warmup still
    happens after a warm start in the same job."""
    schedule: Literal["constant", "cosine"] = "constant"
    total_steps: int = Field(default=1000, ge=1)
    """Cosine schedule length."""
    schedule_end: Literal["total_steps", "wall_clock"] = "total_steps"
    """What ends the cosine: `total_steps`, or with `wall_clock` whichever comes first of those steps
    and the end of run.max_wall_s (the main loop's part of it), so that a run given an hour reaches
    the rate's end at the hour however many steps its machine made (the warm start's cosine ends with
    warm_start.max_wall_s alike; docs/architecture.md, "The learner's rate")."""
    num_minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per learner step of the main loop (PPO's minibatches): the batch is dealt at
    random into this many parts, each its own step at the step's rate; the version (staleness,
    publishing, the schedule) moves once. The k-th part trains weights k - 1 updates past the
    step's start, which the loss's off-policy correction sees through each token's behaviour
    log-prob like any staleness (exact under a behaviour-free loss: DAgger's relabelling). The warm
    start's SFT steps take one each (`warm_start.batch_episodes` sizes them)."""
    micro_batch_tokens: int = Field(default=8192, ge=16)
    """Token budget (padded) of one forward/backward."""
    packing: bool = True
    """Merge an episode's nested samples into one sequence (buffer.expansion)."""
    seed: int = 0
    call_timeout_s: float = Field(default=1800.0, gt=0)
    """A rank that has not answered a call (a step, a publish, a checkpoint) within this is hung
    (a collective that never completes, say): the run stops as if it had died, naming it."""
    socket_ifname: str | None = None
    """Network interface gloo and NCCL bind between ranks (their GLOO_SOCKET_IFNAME and
    NCCL_SOCKET_IFNAME); None: the variables as the environment sets them, else the interface
    that carries the node's Ray address (lo on the embedded node), never whatever the hostname
    resolves to."""
    num_threads: int | None = Field(default=None, ge=1)
    """Torch threads of a CPU rank; None keeps the process's setting (actors: OMP_NUM_THREADS=1)."""
    compile: bool = False
    """torch.compile the decoder's forward and backward (in place: names, checkpoints and exports
    unchanged; per block inside FSDP2's hooks on a sharding rank; the LM head runs eagerly, at the
    trained positions alone: `logprobs_at`). The first step compiles one graph
    for every micro-batch shape (tiny:mini on 2 cores: ~1 minute cold), then its updates run 1.5-1.75x
    as fast (benchmarks/learner_overhead.py, docs/architecture.md "Precision")."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward pass: less memory for
    long packed sequences at real shapes, about one more forward pass of compute."""

    @model_validator(mode="after")
    def _one_step_for_the_decoupled_objective(self) -> "LearnerConfig":
        if self.num_minibatches > 1 and self.algorithm.decoupled:
            raise ValueError("learner.num_minibatches > 1 with learner.algorithm.decoupled: the decoupled objective "
                             "takes the proximal policy as the learner's weights in the same forward pass, which "
                             "is the step's start only with one optimizer step per batch; set one of them back")
        return self


def lr_factor(step: int, config: LearnerConfig, clock: float = 0.0) -> float:
    """The rate's factor at scheduled step `step`; `clock` in [0, 1]: the share of the loop's wall
    clock spent, which ends the cosine when it is ahead of the steps (`schedule_end: wall_clock`)."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - config.warmup_steps) / max(1, config.total_steps - config.warmup_steps))
    if config.schedule_end == "wall_clock":
        progress = max(progress, min(1.0, clock))
    return 0.5 * (1 + math.cos(math.pi * progress))


def collate(sequences: list[TrainSequence], learner_version: int, pad_token_id: int) -> TokenBatch:
    """Right-padded tensors of a micro-batch."""
    n, width = len(sequences), max(s.num_tokens for s in sequences)

    def pad(values, fill, dtype):
        out = torch.full((n, width), fill, dtype=dtype)
        for i, v in enumerate(values):
            out[i, :len(v)] = torch.tensor(v, dtype=dtype)
        return out

    versions = pad([s.policy_version for s in sequences], -1, torch.long)
    scored = all(s.teacher_logprobs is not None for s in sequences)
    widths = {len(s.teacher_topk_ids[0]) for s in sequences if s.teacher_topk_ids}
    topk_ids = topk_lps = None
    if all(s.teacher_topk_ids is not None for s in sequences) and len(widths) == 1:
        k = widths.pop()
        topk_ids = torch.full((n, width, k), -1, dtype=torch.long)
        topk_lps = torch.zeros((n, width, k), dtype=torch.float32)
        for i, s in enumerate(sequences):
            topk_ids[i, :s.num_tokens] = torch.tensor(s.teacher_topk_ids, dtype=torch.long)
            topk_lps[i, :s.num_tokens] = torch.tensor(s.teacher_topk_logprobs, dtype=torch.float32)
    return TokenBatch(
        input_ids=pad([s.token_ids for s in sequences], pad_token_id, torch.long),
        attention_mask=pad([[1] * s.num_tokens for s in sequences], 0, torch.long),
        loss_mask=pad([s.loss_mask for s in sequences], False, torch.bool),
        behaviour_logprobs=pad([s.behaviour_logprobs for s in sequences], 0.0, torch.float32),
        teacher_logprobs=pad([s.teacher_logprobs for s in sequences], 0.0, torch.float32) if scored else None,
        advantages=pad([s.advantage for s in sequences], 0.0, torch.float32),
        turn_rewards=pad([s.turn_reward for s in sequences], 0.0, torch.float32),
        staleness=torch.where(versions >= 0, learner_version - versions, torch.zeros_like(versions)),
        turn_index=pad([s.turn_index for s in sequences], -1, torch.long),
        teacher_topk_ids=topk_ids, teacher_topk_logprobs=topk_lps,
        episode_ids=tuple(s.trajectory_id for s in sequences),
    )


def micro_batches(sequences: list[TrainSequence], token_budget: int) -> list[list[TrainSequence]]:
    """Longest first; a micro-batch grows while (its width x its size) fits the budget."""
    out: list[list[TrainSequence]] = []
    for s in sorted(sequences, key=lambda s: s.num_tokens, reverse=True):
        if out and out[-1][0].num_tokens * (len(out[-1]) + 1) <= token_budget:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def minibatches(sequences: list[TrainSequence], num_minibatches: int, seed: int) -> list[list[TrainSequence]]:
    """The sequences dealt at random into `num_minibatches` parts of near-equal size, one optimizer
    step each: a batch that mixes fresh samples with past ones (jobs.aggregate) mixes them in every
    part. Always `num_minibatches` parts, some possibly empty, so every rank takes as many steps."""
    if num_minibatches == 1:
        return [list(sequences)]
    order = list(sequences)
    random.Random(seed).shuffle(order)
    return [order[i::num_minibatches] for i in range(num_minibatches)]


def response_tail(loss_mask: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """Whether each trained token lies in the second half of its response, [N, T] bool (False
    off the mask). A response is the trained tokens of one turn in one row; its first
    ceil(n/2) tokens are the head, so a one-token response is all head. The seeds compare the
    teacher-student gap over heads and tails of long responses (docs/algorithms.md §8)."""
    tail = torch.zeros_like(loss_mask)
    if not loss_mask.any():
        return tail
    num_slots = int(turn_index.max()) + 1
    rows = torch.arange(loss_mask.shape[0]).unsqueeze(1).expand_as(turn_index)
    keys = (rows * num_slots + turn_index)[loss_mask]  # [M], non-decreasing: a row's turns follow each other
    counts = torch.bincount(keys)  # tokens per response
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(keys.numel()) - starts[keys]
    tail[loss_mask] = 2 * rank >= counts[keys]
    return tail


HEAD_CHUNK_POSITIONS = 2048
"""Positions whose full-vocabulary logits exist at once (`logprobs_at`): at Qwen3's 151,936-token
vocabulary a [chunk, V] fp32 tensor is 1.2 GB, and the log-softmax and entropy hold a few
(docs/architecture.md, "Logits where the loss reads them")."""


def _head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                   topk_ids: torch.Tensor | None):
    """At M positions: (log-prob of each target [M], entropy of each prediction [M], log-probs of
    the teacher's top-k ids [M, k] or None); `hidden` [M, H] the decoder's last hidden states."""
    logp_all = torch.log_softmax(head(hidden).float(), dim=-1)  # [M, V]
    entropy = -(logp_all.exp() * logp_all).sum(-1).detach()
    return (logp_all.gather(-1, targets[:, None]).squeeze(-1), entropy,
            None if topk_ids is None else logp_all.gather(-1, topk_ids))


def logprobs_at(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor,
                columns: torch.Tensor, topk_ids: torch.Tensor | None):
    """`_head_logprobs` of the tokens at (rows, columns + 1) [M] from the logits at (rows, columns):
    the decoder runs on every token, the LM head and the log-softmax only where asked, in chunks of
    HEAD_CHUNK_POSITIONS recomputed in the backward pass, so no [N, T, V] tensor ever exists.
    `topk_ids` [M, k] or None. A sharded rank calls it as the model's FSDP forward method
    (`Trainer`): it uses the root module's parameters (embeddings, final norm, head)."""
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    picked = hidden[rows, columns]  # [M, H]
    targets = input_ids[rows, columns + 1]
    head, parts = model.get_output_embeddings(), []
    for start in range(0, max(len(rows), 1), HEAD_CHUNK_POSITIONS):
        part = slice(start, start + HEAD_CHUNK_POSITIONS)
        parts.append(torch.utils.checkpoint.checkpoint(
            _head_logprobs, head, picked[part], targets[part], None if topk_ids is None else topk_ids[part],
            use_reentrant=False))
    logp, entropy, topk = zip(*parts)
    return torch.cat(logp), torch.cat(entropy), None if topk_ids is None else torch.cat(topk)


def token_logprobs(model, batch: TokenBatch, with_topk: bool = False, everywhere: bool = False):
    """(log-prob of each token under the model, entropy of each position's prediction) [N, T]; with
    `with_topk` also the log-probs of the teacher's top-k ids at each position [N, T, k] (None when
    the batch has no teacher top-k). Computed at the trained tokens (`loss_mask`), or at every
    token but the first with `everywhere`; 0 elsewhere."""
    from torch.distributed.fsdp import FSDPModule

    device = next(model.parameters()).device
    input_ids, attention_mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    # The rows' count unbacked: one compiled graph serves every micro-batch (learner.compile; no
    # effect eager). Backed, a batch of one and a batch past 1,024 tokens each compiled a graph of
    # their own, ~30-40 s apiece on 2 cores (docs/architecture.md, "Precision").
    for t in (input_ids, attention_mask):
        torch._dynamo.decorators.mark_unbacked(t, 0)
    wanted = batch.attention_mask[:, 1:].bool() if everywhere else batch.loss_mask[:, 1:]
    rows, columns = wanted.nonzero(as_tuple=True)  # the logits at `columns` predict the tokens at `columns + 1`
    topk_ids = None
    if with_topk and batch.teacher_topk_ids is not None:
        topk_ids = batch.teacher_topk_ids[rows, columns + 1].clamp(min=0).to(device)
    compute = model.logprobs_at if isinstance(model, FSDPModule) else functools.partial(logprobs_at, model)
    logp, entropy, topk = compute(input_ids, attention_mask, rows.to(device), columns.to(device), topk_ids)

    def placed(values: torch.Tensor, *trailing: int) -> torch.Tensor:
        out = torch.zeros(*input_ids.shape, *trailing, dtype=values.dtype)
        return out.index_put((rows, columns + 1), values.cpu())

    out = placed(logp), placed(entropy)
    if not with_topk:
        return out
    return (*out, None if topk is None else placed(topk, topk.shape[-1]))


class StepSums:
    """A learner step's diagnostics, summed over its micro-batches, then over the ranks: entropy,
    staleness, the loss's own stats, the sampled-token reverse KL and the student's log-prob on
    the head and tail of each response (`response_tail`), and the reverse KL by turn index (the
    seeds' evidence that errors compound over turns)."""

    LOSS_STATS = ("clip_frac", "mismatch_kl", "ratio_mean", "masked_frac", "truncated_frac", "reverse_kl", "topk_kl")
    """The loss's own sums over trained tokens (`LossOutput.stats`), reported as per-token means."""
    KEYS = ("loss_sum", "loss_tokens", "entropy", "staleness", *LOSS_STATS,
            "tokens", "sequences", "kl_head", "kl_tail", "scored_head_tokens", "scored_tail_tokens",
            "logp_head", "logp_tail", "head_tokens", "tail_tokens")

    def __init__(self, num_turn_slots: int) -> None:
        """`num_turn_slots`: the most turns of any sequence on any rank (the same on every rank)."""
        self.sums = dict.fromkeys(self.KEYS, 0.0)
        self.max_staleness = 0.0
        self.max_ratio = 0.0
        self.kl_by_turn = torch.zeros(num_turn_slots, dtype=torch.float64)
        self.tokens_by_turn = torch.zeros(num_turn_slots, dtype=torch.float64)
        self.kl_by_episode: dict[str, float] = {}
        """Reverse KL summed over each episode's trained tokens in the batch."""

    def add(self, b: TokenBatch, out: LossOutput, entropy: torch.Tensor) -> None:
        sums, mask = self.sums, b.loss_mask
        sums["loss_sum"] += out.loss_sum.item()
        sums["loss_tokens"] += float(mask.sum())
        sums["entropy"] += float((entropy * mask).sum())
        sums["staleness"] += float((b.staleness * mask).sum())
        sums["tokens"] += float(b.attention_mask.sum())
        sums["sequences"] += len(b.input_ids)
        for key in self.LOSS_STATS:
            sums[key] += out.stats.get(key, 0.0)
        self.max_ratio = max(self.max_ratio, out.stats.get("ratio_max", 0.0))
        if not mask.any():
            return
        tail = response_tail(mask, b.turn_index)
        for part, where in (("head", mask & ~tail), ("tail", tail)):
            sums[f"logp_{part}"] += float(b.behaviour_logprobs[where].sum())
            sums[f"{part}_tokens"] += float(where.sum())
            if b.teacher_logprobs is not None:
                sums[f"kl_{part}"] += float((b.behaviour_logprobs - b.teacher_logprobs)[where].sum())
                sums[f"scored_{part}_tokens"] += float(where.sum())
        self.max_staleness = max(self.max_staleness, float(b.staleness[mask].max()))
        turns = b.turn_index[mask]
        self.tokens_by_turn += torch.bincount(turns, minlength=len(self.tokens_by_turn)).double()
        if b.teacher_logprobs is not None:
            gap = (b.behaviour_logprobs - b.teacher_logprobs)[mask].double()
            self.kl_by_turn += torch.bincount(turns, weights=gap, minlength=len(self.kl_by_turn))
            rows = ((b.behaviour_logprobs - b.teacher_logprobs) * mask).double().sum(-1).tolist()
            for episode, kl, trained in zip(b.episode_ids, rows, mask.any(-1).tolist()):
                if trained:
                    self.kl_by_episode[episode] = self.kl_by_episode.get(episode, 0.0) + kl

    def reduce(self, all_sum, all_max) -> dict[str, Any]:
        """Global stats (every rank calls it, in the same order): `loss_sum` and the per-token means."""
        totals = dict(zip(self.KEYS, all_sum(list(self.sums.values()))))
        if len(self.kl_by_turn):
            dist.all_reduce(self.kl_by_turn)
            dist.all_reduce(self.tokens_by_turn)
        tokens = max(totals["loss_tokens"], 1.0)
        per_turn = zip(self.kl_by_turn.tolist(), self.tokens_by_turn.tolist())
        # An episode's turns may sit on several ranks (expanded samples): merge by trajectory id.
        gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, self.kl_by_episode)
        by_episode: dict[str, float] = {}
        for part in gathered:
            for episode, kl in part.items():
                by_episode[episode] = by_episode.get(episode, 0.0) + kl
        return {
            "loss_sum": totals["loss_sum"],
            **{key: totals[key] / tokens for key in ("entropy", *self.LOSS_STATS)},
            "mean_staleness": totals["staleness"] / tokens,
            "max_staleness": all_max(self.max_staleness),
            "ratio_max": all_max(self.max_ratio),
            "reverse_kl_by_turn": [kl / n if n else None for kl, n in per_turn],
            "reverse_kl_episode": sum(by_episode.values()) / len(by_episode) if by_episode else None,
            # None where no token (or none scored).
            **{f"reverse_kl_{part}": totals[f"kl_{part}"] / n if (n := totals[f"scored_{part}_tokens"]) else None
               for part in ("head", "tail")},
            **{f"student_logprob_{part}": totals[f"logp_{part}"] / n if (n := totals[f"{part}_tokens"]) else None
               for part in ("head", "tail")},
            "num_loss_tokens": totals["loss_tokens"],
            "num_tokens": totals["tokens"],
            "num_sequences": totals["sequences"],
        }


class Trainer:
    """The model, optimizer and schedule of one rank."""

    def __init__(self, config: LearnerConfig, model: ModelConfig, device: str = "cpu",
                 module: torch.nn.Module | None = None) -> None:
        """`module`: an already-built causal LM to train instead of loading `model.path` (the GPU
        benchmarks train randomly initialised models of real shape that exist in no directory)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

        if not dist.is_initialized():
            raise RuntimeError("Trainer needs an initialised torch.distributed process group (any size)")
        self.config = config
        self.model_config = model
        self.device = torch.device(device)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(config.seed)
        if config.num_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        self.compute_dtype = getattr(torch, model.dtype)
        """Dtype of forward/backward, of published weights and of the HF export."""
        master = model.model_copy(update={"dtype": "float32"})
        self.model = (load_model(master, device=str(self.device)) if module is None
                      else module.to(self.device, torch.float32)).train()
        if config.activation_checkpointing:
            # Non-reentrant checkpointing composes with FSDP2's per-block all-gathers.
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.pad_token_id = self.model.config.pad_token_id or 0
        # One fp32 rank has nothing to shard, reduce or cast, and FSDP2's hooks would split a
        # compiled graph at every block (docs/architecture.md, "Precision"). Mixed precision is
        # FSDP2's policy, so a bf16 rank shards even alone.
        self.sharded = self.world_size > 1 or self.compute_dtype != torch.float32
        if self.sharded:
            mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32) \
                if self.compute_dtype != torch.float32 else MixedPrecisionPolicy()
            for layer in self.model.model.layers:
                if config.compile:
                    layer.compile()  # per block, inside FSDP2's hooks (as torchtitan does)
                fully_shard(layer, mp_policy=mp)
            fully_shard(self.model, mp_policy=mp)
            # The loss reads log-probs through `logprobs_at`, not `forward`: FSDP2 gathers the
            # root's parameters around it as around a forward.
            self.model.logprobs_at = types.MethodType(logprobs_at, self.model)
            register_fsdp_forward_method(self.model, "logprobs_at")
        elif config.compile:
            # The decoder: the head runs eagerly on the trained positions alone (`logprobs_at`).
            self.model.get_decoder().compile(dynamic=True)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=config.betas,
                                           weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: lr_factor(step, config))
        self.version = 0

    def _all_sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def _all_max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def train_step(self, sequences: list[TrainSequence], algorithm: AlgorithmConfig | None = None,
                   lr: float | None = None, num_minibatches: int | None = None,
                   clock: float = 0.0) -> dict[str, float]:
        """One learner step on this rank's shard of the global batch; returns global stats.

        `algorithm` and `lr` override the configured loss and the schedule's rate for this step
        (a step at its own rate leaves the schedule where it was); `num_minibatches` the config's
        optimizer steps per learner step; `clock` the share of the loop's wall clock spent
        (`lr_factor`). The step moves the version by one, however many
        optimizer steps it takes: a version is what the buffer's staleness and the published
        weights count.
        """
        start = time.perf_counter()
        cfg = algorithm or self.config.algorithm
        # The rate from this run's config at the schedule's position: the base rate a checkpoint's
        # scheduler state carries would override a resume's changed learner.lr (--allow-change).
        scheduled = lr is None
        lr = self.config.lr * lr_factor(self.scheduler.last_epoch, self.config, clock) if scheduled else lr
        sums = StepSums(int(self._all_max(max((max(s.turn_index) + 1 for s in sequences), default=0))))
        num_units, grad_norms, applied = 0.0, [], 0
        for part in minibatches(sequences, num_minibatches or self.config.num_minibatches,
                                seed=self.config.seed * 1_000_003 + self.version):
            units, grad_norm = self._optimizer_step(part, cfg, lr, sums)
            num_units += units
            if units:
                grad_norms.append(grad_norm)
                applied += math.isfinite(grad_norm)
        stats = sums.reduce(self._all_sum, self._all_max)
        loss_sum = stats.pop("loss_sum")
        step_s = time.perf_counter() - start
        if num_units == 0:  # every turn replayed, unselected or untrainable: nothing to learn from
            return {"version": self.version, "skipped": "no_trainable_token", "loss": 0.0, "grad_norm": 0.0,
                    "step_s": step_s}
        # A non-finite minibatch's update is skipped; the step is skipped (no new version, no
        # publish) only when every one was.
        if applied:
            if scheduled:
                self.scheduler.step()
            self.version += 1
        return {"version": self.version, "skipped": None if applied else "nonfinite", "loss": loss_sum / num_units,
                "grad_norm": sum(grad_norms) / len(grad_norms), "lr": lr, **stats, "step_s": step_s}

    def _optimizer_step(self, sequences: list[TrainSequence], cfg: AlgorithmConfig, lr: float,
                        sums: StepSums) -> tuple[float, float]:
        """One optimizer step on these sequences (this rank's part of a minibatch), adding its stats
        to `sums`; returns (the minibatch's global loss units, its gradient norm). Units 0:
        nothing trainable on any rank, no update; a non-finite loss or gradient norm: no update."""
        batches = [collate(mb, self.version, self.pad_token_id)
                   for mb in micro_batches(sequences, self.config.micro_batch_tokens)]
        num_passes = int(self._all_max(len(batches)))
        local_units = sum(float(b.loss_mask.sum()) if cfg.aggregation == "token_mean"
                          else float((b.loss_mask.sum(-1) > 0).sum()) for b in batches)
        global_units, = self._all_sum([local_units])
        if global_units == 0:
            return 0.0, 0.0
        local_loss = 0.0
        for i in range(num_passes):
            if i < len(batches):
                b = batches[i]
                logp, entropy, *topk = token_logprobs(self.model, b, with_topk=bool(cfg.topk_kl_coef))
                out = ALGORITHMS[cfg.name].step_loss(logp, topk[0] if topk else None, b, cfg)
                # FSDP averages gradients over ranks; the loss is already a global mean, so undo that.
                (out.loss_sum * (self.world_size / global_units)).backward()
                sums.add(b, out, entropy)
                local_loss += out.loss_sum.item()
            else:
                # An empty pass keeps FSDP's collectives paired with the ranks that have more work.
                dummy = torch.full((1, 2), self.pad_token_id, dtype=torch.long, device=self.device)
                (self.model(input_ids=dummy).logits.sum() * 0.0).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        loss, = self._all_sum([local_loss])
        # Both are global (all-reduced), so every rank takes the same branch.
        if math.isfinite(loss) and math.isfinite(grad_norm):
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
        else:
            grad_norm = math.inf
        self.optimizer.zero_grad(set_to_none=True)
        return global_units, grad_norm

    @torch.no_grad()
    def evaluate_logprobs(self, sequences: list[TrainSequence]) -> list[torch.Tensor]:
        """Current log-prob of each sequence's tokens (for agreement checks), shape [num_tokens] each."""
        out = []
        for s in sequences:
            logp, _ = token_logprobs(self.model, collate([s], self.version, self.pad_token_id), everywhere=True)
            out.append(logp[0])
        return out

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded weights with HF names, on CPU, in `model.dtype` (the masters cast once, on the
        gathering rank: what an engine loads, at the engines' size); complete on rank 0, empty
        elsewhere (a collective)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {name: tensor.to(self.compute_dtype) if tensor.is_floating_point() else tensor
                for name, tensor in state.items()}

    def save_checkpoint(self, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Distributed checkpoint written to `<dir>.tmp`, fsynced, and renamed into place once every
        rank is done. A re-save of an existing `<dir>` (a resume at the same version, the save when
        the buffer dies) first renames the old one to `<dir>.previous` and deletes it only once the
        new one is in place: at any moment a complete copy exists (jobs.training.latest_checkpoint
        looks at both)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        final = Path(directory)
        tmp = final.with_name(final.name + ".tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "dcp"))
        torch.save({"torch": torch.get_rng_state()}, tmp / f"rng_rank{self.rank}.pt")
        if self.rank == 0:
            state = {"version": self.version, "scheduler": self.scheduler.state_dict(), "extra": extra or {},
                     "world_size": self.world_size}
            (tmp / "trainer_state.json").write_text(json.dumps(state))
        dist.barrier()
        if self.rank == 0:
            fsync_tree(tmp)
            previous = final.with_name(final.name + PREVIOUS)
            shutil.rmtree(previous, ignore_errors=True)
            if final.exists():
                os.rename(final, previous)
            os.rename(tmp, final)
            fsync_path(final.parent)
            shutil.rmtree(previous, ignore_errors=True)
        dist.barrier()
        return final

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any]:
        """Restore weights, optimizer, schedule, version and RNG; returns the saved `extra` state."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        directory = Path(directory)
        state = check_checkpoint(directory)
        if state["world_size"] != self.world_size:
            # DCP reshards; the per-rank RNG streams simply restart from rank 0's.
            rng_file = directory / "rng_rank0.pt"
        else:
            rng_file = directory / f"rng_rank{self.rank}.pt"
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        target = {"model": model_sd, "optim": optim_sd}
        dcp.load(target, checkpoint_id=str(directory / "dcp"))
        set_state_dict(self.model, self.optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = state["version"]
        torch.set_rng_state(torch.load(rng_file, weights_only=True)["torch"])
        return state["extra"]

    def export_hf(self, directory: str | Path, tokenizer=None) -> Path | None:
        """A HF directory (safetensors + config [+ tokenizer]) the engines load; written by rank 0."""
        state = self.full_state_dict()
        if self.rank != 0:
            return None
        directory = Path(directory)
        fresh = load_model(self.model_config)
        fresh.load_state_dict(state)
        fresh.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
        return directory
