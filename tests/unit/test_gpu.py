"""The GPU path against the CPU path: the HF engine (with KV reuse) and one bf16 FSDP2 learner
step on CUDA. Needs nothing the GPU machine lacks (no Ray, no minigrid): models are randomly
initialised `learner.shapes` models, so `benchmarks/gpu_check.sh` runs this module there."""

from __future__ import annotations

import copy
import socket

import pytest

from actors.engine import SamplingConfig
from actors.hf_engine import HFEngine
from buffer.expansion import TrainSequence
from learner.algorithms import AlgorithmConfig
from models.loading import ModelConfig
from learner.shapes import random_model
from learner.trainer import LearnerConfig, Trainer

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cpu_model():
    return random_model("tiny", seed=1)


def test_hf_engine_on_cuda_matches_cpu(cpu_model):
    cuda = copy.deepcopy(cpu_model).to("cuda")
    prompts = [[7, 100, 200, 300, 400], [9, 8, 7]]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    on_cpu = HFEngine(cpu_model, 0, [1023]).generate(prompts, greedy)
    engine = HFEngine(cuda, 0, [1023])
    on_gpu = engine.generate(prompts, greedy)
    for g, c in zip(on_gpu, on_cpu):
        assert g.token_ids == c.token_ids
        assert max(abs(a - b) for a, b in zip(g.logprobs, c.logprobs)) < 1e-3
    # The next turn reuses the kept CUDA cache and still agrees with a fresh CPU prefill.
    follow = [p + list(g.token_ids) + [11, 12] for p, g in zip(prompts, on_gpu)]
    before = engine.num_prefill_tokens
    reused, fresh = engine.generate(follow, greedy), HFEngine(cpu_model, 0, [1023]).generate(follow, greedy)
    assert engine.num_prefill_tokens - before < sum(map(len, follow)) / 2
    for g, c in zip(reused, fresh):
        assert g.token_ids == c.token_ids


def _sequence(n: int, offset: int) -> TrainSequence:
    mask = tuple(i >= n // 2 for i in range(n))
    return TrainSequence(
        token_ids=tuple((offset + 7 * i) % 1000 + 1 for i in range(n)), loss_mask=mask,
        turn_index=tuple(0 if m else -1 for m in mask),
        behaviour_logprobs=tuple(-1.0 if m else 0.0 for m in mask),
        teacher_logprobs=tuple(-0.5 if m else 0.0 for m in mask),
        policy_version=tuple(0 if m else -1 for m in mask), advantage=tuple(0.0 for _ in mask),
        turn_reward=tuple(0.0 for _ in mask))


def test_bf16_fsdp2_step_on_cuda_tracks_fp32_cpu(cpu_model):
    """One OPD step in bf16 on CUDA (NCCL group of one) moves the loss like the fp32 CPU step."""
    import torch.distributed as dist

    batch = [_sequence(64, 0), _sequence(40, 3)]
    config = LearnerConfig(algorithm=AlgorithmConfig(name="opd"), lr=1e-3)
    losses = {}
    for device, backend in (("cpu", "gloo"), ("cuda", "nccl")):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        try:
            dtype = "bfloat16" if device == "cuda" else "float32"  # fp32 masters, bf16 compute on CUDA
            trainer = Trainer(config, ModelConfig(dtype=dtype), device=device, module=copy.deepcopy(cpu_model))
            first = trainer.train_step(batch)
            second = trainer.train_step(batch)
            losses[device] = (first["loss"], second["loss"])
        finally:
            dist.destroy_process_group()
    (cpu1, cpu2), (gpu1, gpu2) = losses["cpu"], losses["cuda"]
    assert abs(gpu1 - cpu1) < 0.05 * abs(cpu1) + 1e-3
    assert (gpu2 - gpu1) * (cpu2 - cpu1) > 0  # the step moved the loss the same way
