"""The batched agent loop and the HF engine on the tiny model (no Ray)."""

import math

import pytest
import torch

from actors.agent_loop import LoopConfig, ModelPolicy, run_episodes
from actors.engine import SamplingConfig
from actors.hf_engine import HFEngine
from envs.babyai_text import BabyAITextEnv
from envs.babyai_text.expert import ExpertPolicy
from learner.models import ModelConfig, load_model, load_tokenizer


class Scripted:
    """Answers every episode with the same text."""

    def __init__(self, text):
        self.text = text

    def respond(self, episodes, config):
        return [self.text] * len(episodes)


@pytest.fixture(scope="module")
def engine_and_tokenizer():
    cfg = ModelConfig(path="tiny:nano")
    tok = load_tokenizer(cfg)
    engine = HFEngine(load_model(cfg), tok.pad_token_id, [tok.convert_tokens_to_ids("<|im_end|>")])
    return engine, tok


def test_expert_policy_solves_tasks_batched():
    tasks = [("eval50", s) for s in range(12)]
    results = run_episodes(BabyAITextEnv, tasks, ExpertPolicy(), LoopConfig(max_turns=128), batch_size=5)
    assert [(r.info.split, r.info.seed) for r in results] == tasks
    assert all(r.success and r.num_format_errors == 0 for r in results)


def test_strict_malformed_turns_do_not_act_and_end_at_max_turns():
    results = run_episodes(BabyAITextEnv, [("train", 0), ("train", 1)], Scripted("turn left please"),
                           LoopConfig(max_turns=4), batch_size=2)
    assert all(r.num_turns == 4 and r.num_format_errors == 4 and not r.success for r in results)


def test_gentle_malformed_turns_act_through_the_fallback():
    env = BabyAITextEnv()
    seen = []

    def make_env():
        seen.append(env)
        return env

    results = run_episodes(make_env, [("train", 0)], Scripted("hmm... go forward"),
                           LoopConfig(max_turns=3, parser_mode="gentle"), batch_size=1)
    assert results[0].num_format_errors == 3
    assert env.level.step_count == 3  # every malformed turn still stepped the environment


def test_hf_engine_generates_until_stop_with_logprobs(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    prompts = [tok.encode("You see a wall", add_special_tokens=False), tok.encode("go", add_special_tokens=False)]
    gens = engine.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=12, seed=0))
    for g in gens:
        assert len(g.token_ids) == len(g.logprobs) and 1 <= len(g.token_ids) <= 12
        assert all(lp <= 0 and math.isfinite(lp) for lp in g.logprobs)
        stop = tok.convert_tokens_to_ids("<|im_end|>")
        assert (g.finish_reason == "stop") == (g.token_ids[-1] == stop)
        assert stop not in g.token_ids[:-1]


def test_hf_engine_left_padding_matches_single_prompts(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    prompts = [tok.encode(t, add_special_tokens=False) for t in
               ("You see a red ball 2 steps forward", "go", "<|im_start|>user\nYour task: open the door")]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    batched = engine.generate(prompts, greedy)
    for prompt, b in zip(prompts, batched):
        single = engine.generate([prompt], greedy)[0]
        assert single.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(single.logprobs, b.logprobs)) < 1e-4


def test_hf_engine_logprobs_match_a_forward_pass(engine_and_tokenizer):
    """Greedy log-probs are the model's own distribution: recompute them with one forward pass."""
    engine, tok = engine_and_tokenizer
    prompt = tok.encode("You see a wall 1 step left", add_special_tokens=False)
    g = engine.generate([prompt], SamplingConfig(temperature=0.0, max_new_tokens=6))[0]
    ids = torch.tensor([prompt + list(g.token_ids)])
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(prompt) - 1:-1]
    ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4)


def test_model_policy_runs_episodes(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    policy = ModelPolicy(engine, tok, SamplingConfig(temperature=1.0, max_new_tokens=16, seed=1))
    results = run_episodes(BabyAITextEnv, [("eval50", 0), ("eval50", 1)], policy, LoopConfig(max_turns=2),
                           batch_size=2)
    assert len(results) == 2 and all(1 <= r.num_turns <= 2 for r in results)


def test_engine_rejects_bad_input(engine_and_tokenizer):
    engine, _ = engine_and_tokenizer
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingConfig())
    with pytest.raises(ValueError, match="stop_token_ids"):
        HFEngine(engine.model, 0, [])
    assert engine.generate([], SamplingConfig()) == []


@pytest.mark.gpu
def test_hf_engine_on_cuda_matches_cpu(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    cuda = HFEngine(load_model(ModelConfig(path="tiny:nano"), device="cuda"), tok.pad_token_id,
                    engine.stop_token_ids)
    prompts = [tok.encode("You see a red key 1 step left", add_special_tokens=False)]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    on_gpu, on_cpu = cuda.generate(prompts, greedy)[0], engine.generate(prompts, greedy)[0]
    assert on_gpu.token_ids == on_cpu.token_ids
    assert max(abs(a - b) for a, b in zip(on_gpu.logprobs, on_cpu.logprobs)) < 1e-3
