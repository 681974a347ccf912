"""The batched agent loop, token-in/token-out prompts and the HF engine on the tiny model (no Ray)."""

import json
import math

import pytest
import torch

from actors.agent_loop import EpisodeRunner, EpisodeTask, LoopConfig, ModelPolicy, Response, run_episodes
from actors.engine import Generation, SamplingConfig
from actors.expert import DemonstrationPolicy, ExpertPolicy
from actors.hf_engine import HFEngine
from buffer.expansion import can_pack, expand, to_sequences
from envs.babyai_text import BabyAITextConfig, BabyAITextEnv
from envs.parser import format_tool_call
from envs.protocol import ToolCall
from envs.prompt import PromptConfig
from envs.rewards import RewardConfig
from models.loading import ModelConfig, load_model, load_tokenizer


class Scripted:
    """Answers every episode with the same text."""

    def __init__(self, text):
        self.text = text

    def respond(self, episodes):
        return [Response(self.text) for _ in episodes]


class ScriptedTokens:
    """A fixed tool call as tokens, so trajectories are recorded without sampling noise."""

    def __init__(self, policy: ModelPolicy, text: str, finish_reason="stop"):
        self.policy, self.text, self.finish_reason = policy, text, finish_reason
        tok = policy.tokenizer
        self.ids = tuple(tok.encode(text, add_special_tokens=False)) + \
            ((policy.prompter.stop_id,) if finish_reason == "stop" else ())

    def respond(self, episodes):
        out = []
        for ep in episodes:
            prompt = self.policy.prompter.prompt_ids(ep, ep.policy_state)
            r = Response(self.text, tuple(prompt), self.ids, tuple(-0.1 for _ in self.ids), self.finish_reason, 7)
            ep.policy_state = r
            out.append(r)
        return out


@pytest.fixture(scope="module")
def engine_and_tokenizer():
    cfg = ModelConfig(path="tiny:nano")
    tok = load_tokenizer(cfg)
    engine = HFEngine(load_model(cfg), tok.pad_token_id, [tok.convert_tokens_to_ids("<|im_end|>")])
    return engine, tok


def tasks(split, seeds):
    return [EpisodeTask(split, s) for s in seeds]


def test_expert_policy_solves_tasks_batched():
    results = run_episodes(BabyAITextEnv, tasks("eval50", range(12)), ExpertPolicy(), LoopConfig(max_turns=128),
                           batch_size=5)
    assert [(r.task.split, r.task.seed) for r in results] == [("eval50", s) for s in range(12)]
    assert all(r.success and r.num_format_errors == 0 and r.truncated is None for r in results)
    assert all(r.reward.total == 1.5 and r.trajectory is None for r in results)


def test_demonstrations_are_the_bots_calls_in_the_students_token_format(engine_and_tokenizer):
    _, tok = engine_and_tokenizer
    loop = LoopConfig(max_turns=64, prompt=PromptConfig(history_window="all"))
    demos = run_episodes(BabyAITextEnv, tasks("train", range(4)), DemonstrationPolicy(tok, loop), loop, batch_size=4)
    bot = run_episodes(BabyAITextEnv, tasks("train", range(4)), ExpertPolicy(), loop, batch_size=4)
    assert [(d.success, d.num_turns) for d in demos] == [(b.success, b.num_turns) for b in bot]
    assert all(d.success and d.num_format_errors == 0 for d in demos)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for d in demos:
        traj = d.trajectory
        assert can_pack(expand(traj))
        for turn in traj.turns:
            assert turn.response_ids[-1] == end and set(turn.behaviour_logprobs) == {0.0}
            call = json.loads(turn.executed_call)
            assert tok.decode(turn.response_ids[:-1]) == format_tool_call(ToolCall(call["name"], call["arguments"]))


def test_noisy_demonstrations_train_on_the_experts_call_where_another_was_executed(engine_and_tokenizer):
    _, tok = engine_and_tokenizer
    loop = LoopConfig(max_turns=40, prompt=PromptConfig(history_window=0, tools="compact", system_message=False))
    config = BabyAITextConfig(room_size=6, num_distractors=2, task_types=("go_to", "pick_up"), expert_deviation="replan")
    policy = DemonstrationPolicy(tok, loop, noise=0.3, seed=1)
    demos = run_episodes(lambda: BabyAITextEnv(config), tasks("train", range(40)), policy, loop, batch_size=8)
    deviated = labelled = 0
    for d in demos:
        # Replayed from the task's start, a fresh expert advised of every executed call names, at
        # each state, the call the turn trains on.
        env = BabyAITextEnv(config)
        env.reset(d.task.seed, "train")
        expert, last = env.expert(), None
        for turn in d.trajectory.turns:
            executed = ToolCall.from_json(turn.executed_call)
            advice = expert.act(last)
            if (d.task.split, d.task.seed) not in policy.unlabelled:
                assert tok.decode(turn.response_ids[:-1]) == format_tool_call(advice)
                labelled += 1
                deviated += executed != advice
            env.step(executed)
            last = executed
    assert labelled > 200 and 0.2 < deviated / labelled < 0.4
    assert sum(d.success for d in demos) >= 30  # the replanning expert recovers from most deviations


def test_strict_malformed_turns_do_not_act_and_end_at_max_turns():
    results = run_episodes(BabyAITextEnv, tasks("train", [0, 1]), Scripted("turn left please"),
                           LoopConfig(max_turns=4), batch_size=2)
    assert all(r.num_turns == 4 and r.num_format_errors == 4 and not r.success for r in results)
    assert all(r.truncated == "max_turns" and r.reward.total == -1.5 for r in results)


def test_gentle_malformed_turns_act_through_the_fallback():
    env = BabyAITextEnv()
    loop = LoopConfig(max_turns=3, parser_mode="gentle", rewards=RewardConfig.gentle())
    results = run_episodes(lambda: env, tasks("train", [0]), Scripted("hmm... go forward"), loop, batch_size=1)
    assert results[0].num_format_errors == 3
    assert env.level.step_count == 3  # every malformed turn still stepped the environment
    assert results[0].reward.per_turn == (-0.1, -0.1, -0.1)


def test_token_in_token_out_prompts_extend_each_other(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    loop = LoopConfig(max_turns=5, prompt=PromptConfig(history_window="all"))
    policy = ModelPolicy(engine, tok, SamplingConfig(), loop)
    # The model writes the call without Qwen3's newlines: the next prompt keeps those exact tokens.
    scripted = ScriptedTokens(policy, '<tool_call>{"name":"turn_left","arguments":{}}</tool_call>')
    result = run_episodes(BabyAITextEnv, tasks("train", [3]), scripted, loop)[0]
    traj = result.trajectory
    assert traj.num_turns == 5 and result.truncated == "max_turns"
    for prev, nxt in zip(traj.turns, traj.turns[1:]):
        assert nxt.prompt_ids[:len(prev.prompt_ids) + len(prev.response_ids)] == prev.prompt_ids + prev.response_ids
        assert all(t.policy_version == 7 and t.well_formed for t in traj.turns)
    assert can_pack(expand(traj))
    # What follows the response is exactly what the chat template adds: decode and compare.
    text = tok.decode(traj.turns[1].prompt_ids[len(traj.turns[0].prompt_ids) + len(traj.turns[0].response_ids):])
    assert text.startswith("\n<|im_start|>user\n<tool_response>\n") and text.endswith("<|im_start|>assistant\n")
    assert (traj.trajectory_id, traj.group_id, traj.task_type) == ("train:3/0", "train:3", result.info.task_type)


def test_truncated_responses_are_closed_and_windowed_prompts_re_rendered(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    loop = LoopConfig(max_turns=4, prompt=PromptConfig(history_window=1))
    policy = ModelPolicy(engine, tok, SamplingConfig(), loop)
    scripted = ScriptedTokens(policy, '<tool_call>{"name": "turn_left", "arguments": {}}</tool_call>',
                              finish_reason="length")
    traj = run_episodes(BabyAITextEnv, tasks("train", [3]), scripted, loop)[0].trajectory
    first, second, third = traj.turns[:3]
    assert second.prompt_ids[:len(first.prompt_ids) + len(first.response_ids) + 1] == \
        first.prompt_ids + first.response_ids + (policy.prompter.stop_id,)
    assert all(t.finish_reason == "length" for t in traj.turns)
    # Turn 3 shows only 1 of 2 past turns: re-rendered, so it no longer extends turn 2.
    assert third.prompt_ids[:len(second.prompt_ids)] != second.prompt_ids
    assert "(1 earlier turn not shown.)" in tok.decode(third.prompt_ids)


def test_context_limit_ends_the_episode_as_truncated(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    loop = LoopConfig(max_turns=10, max_context_tokens=700)
    policy = ModelPolicy(engine, tok, SamplingConfig(max_new_tokens=40, seed=0), loop)
    result = run_episodes(BabyAITextEnv, tasks("train", [0]), policy, loop)[0]
    assert result.truncated == "context"
    assert all(len(t.prompt_ids) + len(t.response_ids) <= 700 for t in result.trajectory.turns)


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
    """Sampling log-probs at T=0.7 are the tempered distribution: recompute them with one forward pass."""
    engine, tok = engine_and_tokenizer
    prompt = tok.encode("You see a wall 1 step left", add_special_tokens=False)
    g = engine.generate([prompt], SamplingConfig(temperature=0.7, max_new_tokens=6, seed=3))[0]
    ids = torch.tensor([prompt + list(g.token_ids)])
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(prompt) - 1:-1]
    ref = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4)


def test_hf_engine_weight_update_changes_outputs_and_version(engine_and_tokenizer):
    _, tok = engine_and_tokenizer
    engine = HFEngine(load_model(ModelConfig(path="tiny:nano")), tok.pad_token_id,
                      [tok.convert_tokens_to_ids("<|im_end|>")])
    other = load_model(ModelConfig(path="tiny:nano", seed=5))
    prompt = [tok.encode("You see a grey key 1 step left", add_special_tokens=False)]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    before = engine.generate(prompt, greedy)[0]
    engine.update_weights(other.state_dict(), version=3)
    after = engine.generate(prompt, greedy)[0]
    reference = HFEngine(other, tok.pad_token_id, engine.stop_token_ids).generate(prompt, greedy)[0]
    assert engine.version == 3 and after == reference and after.logprobs != before.logprobs
    with pytest.raises(ValueError, match="do not match"):
        engine.update_weights({"nope": torch.zeros(1)}, version=4)


def test_model_policy_runs_episodes(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    loop = LoopConfig(max_turns=2)
    policy = ModelPolicy(engine, tok, SamplingConfig(temperature=1.0, max_new_tokens=16, seed=1), loop)
    results = run_episodes(BabyAITextEnv, tasks("eval50", [0, 1]), policy, loop, batch_size=2)
    assert len(results) == 2 and all(1 <= r.num_turns <= 2 for r in results)
    for r in results:
        assert r.trajectory.num_turns == r.num_turns
        assert all(len(t.response_ids) == len(t.behaviour_logprobs) for t in r.trajectory.turns)
    with pytest.raises(ValueError, match="end-of-turn token"):
        ModelPolicy(engine, tok, SamplingConfig(), loop, stop_token="<|nope|>")


def test_engine_rejects_bad_input(engine_and_tokenizer):
    engine, _ = engine_and_tokenizer
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingConfig())
    with pytest.raises(ValueError, match="stop_token_ids"):
        HFEngine(engine.model, 0, [])
    assert engine.generate([], SamplingConfig()) == []


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hf_engine_kv_reuse_matches_fresh_prefill(temperature):
    """Multi-turn growth, rows that stop early (padding inside the cache), an episode that
    leaves and a reordered batch: reusing the kept cache gives the tokens and log-probs a fresh
    prefill gives, while feeding far fewer prompt tokens; a weight update drops the cache."""
    import random

    model = load_model(ModelConfig(path="tiny:nano"))
    rng = random.Random(0)
    prompts = [[rng.randrange(60, 700) for _ in range(rng.randint(20, 60))] for _ in range(4)]
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=10, seed=None if temperature == 0 else 3)
    # Stop ids the model does produce early on, so rows end at different lengths.
    probe = HFEngine(model, 0, [0], reuse_kv=False).generate(prompts, sampling)
    stops = sorted({g.token_ids[i] for i, g in zip((2, 5, 7), probe)} | set(range(5, 60)))
    reuse, fresh = (HFEngine(model, 0, stops, reuse_kv=flag) for flag in (True, False))
    lengths = set()
    for turn in range(5):
        a, b = reuse.generate(prompts, sampling), fresh.generate(prompts, sampling)
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4
        lengths |= {len(x.token_ids) for x in a}
        prompts = [p + list(g.token_ids) + [rng.randrange(60, 700) for _ in range(rng.randint(3, 15))]
                   for p, g in zip(prompts, a)]
        if turn == 2:
            prompts = prompts[1:][::-1]
    assert len(lengths) >= 2  # rows stopped at different lengths: padding inside the kept cache
    assert reuse.num_prefill_tokens < fresh.num_prefill_tokens / 3
    before = reuse.num_prefill_tokens
    reuse.update_weights(model.state_dict(), version=1)
    reuse.generate(prompts, sampling)
    assert reuse.num_prefill_tokens - before == sum(map(len, prompts))


def test_hf_engine_owns_its_seeded_random_stream(engine_and_tokenizer):
    _, tok = engine_and_tokenizer
    stops = [tok.convert_tokens_to_ids("<|im_end|>")]
    prompts = [tok.encode("You see a wall", add_special_tokens=False)] * 4
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=7)

    def rounds(engine, n=2):
        return [[g.token_ids for g in engine.generate(prompts, sampling)] for _ in range(n)]

    model = load_model(ModelConfig(path="tiny:nano"))
    torch.manual_seed(123)
    outside = torch.rand(3)
    torch.manual_seed(123)
    first = rounds(HFEngine(model, tok.pad_token_id, stops))
    assert torch.equal(torch.rand(3), outside)  # the global RNG is untouched
    assert first[0] != first[1]  # the second round continues the stream: new noise
    assert rounds(HFEngine(model, tok.pad_token_id, stops)) == first  # same seed, same rounds
    assert rounds(HFEngine(model, tok.pad_token_id, stops, seed_offset=1), 1)[0] != first[0]  # another worker


def test_a_response_with_non_finite_engine_logprobs_acts_but_is_never_trained(engine_and_tokenizer):
    engine, tok = engine_and_tokenizer
    loop = LoopConfig(max_turns=2, prompt=PromptConfig(history_window="all"))
    policy = ModelPolicy(engine, tok, SamplingConfig(), loop)
    scripted = ScriptedTokens(policy, '<tool_call>{"name":"turn_left","arguments":{}}</tool_call>')
    poisoned = type("Poisoned", (), {"respond": lambda self, episodes: [
        Response(r.text, r.prompt_ids, r.response_ids, (float("nan"),) + r.logprobs[1:], r.finish_reason, 7)
        for r in scripted.respond(episodes)]})()
    traj = run_episodes(BabyAITextEnv, tasks("train", [3]), poisoned, loop)[0].trajectory
    assert traj.num_turns == 2 and all(t.well_formed and not t.trainable for t in traj.turns)
    # Kept as context for later turns, with no token to train and no NaN (masked NaN x 0 is NaN).
    sequences = to_sequences(expand(traj), packing=True)
    assert all(not any(s.loss_mask) and all(math.isfinite(lp) for lp in s.behaviour_logprobs) for s in sequences)
    clean = run_episodes(BabyAITextEnv, tasks("train", [3]), scripted, loop)[0].trajectory
    assert all(t.trainable for t in clean.turns)


class StreamingEngine:
    """Continuous batching in steps: a request finishes `steps[slot]` engine steps after it is
    admitted, answering a fixed tool call; each step records which slots were in flight."""

    def __init__(self, ids: tuple[int, ...], steps: dict[int, int]) -> None:
        self.ids, self.steps, self.version, self.trace = ids, steps, 0, []

    def update_weights(self, state_dict, version: int) -> None:
        self.version = version

    def stream(self, admit):
        in_flight: list[list] = []  # [key, steps left]
        while True:
            in_flight += [[key, self.steps[key[0]]] for key, _, _ in admit()]
            if not in_flight:
                return
            self.trace.append(sorted(key[0] for key, _ in in_flight))
            for request in in_flight:
                request[1] -= 1
            done, in_flight = [r for r in in_flight if not r[1]], [r for r in in_flight if r[1]]
            for key, _ in done:
                yield key, Generation(self.ids, tuple(-0.1 for _ in self.ids), "stop")


def test_advance_hands_on_finished_episodes_while_a_long_turn_keeps_generating(engine_and_tokenizer):
    """Continuous batching (`EpisodeRunner.advance`): a slot whose turns are short plays its whole
    episode while another's first turn is still in the engine, is handed back without waiting for
    it, and a new episode joins the running batch; weights loaded in between leave the long turn
    counted from the version that started it."""
    _, tok = engine_and_tokenizer
    call = '<tool_call>{"name": "turn_left", "arguments": {}}</tool_call>'
    engine = StreamingEngine(tuple(tok.encode(call, add_special_tokens=False)) + (tok.convert_tokens_to_ids("<|im_end|>"),),
                             steps={0: 1, 1: 12})
    loop = LoopConfig(max_turns=3)
    policy = ModelPolicy(engine, tok, SamplingConfig(), loop)
    runner = EpisodeRunner(BabyAITextEnv, 2, loop)
    runner.start_many([(EpisodeTask("train", 0), "short"), (EpisodeTask("train", 1), "long")])
    [(tag, result)] = runner.advance(policy, interrupt=lambda: False)
    assert tag == "short" and result.num_turns == 3 and result.truncated == "max_turns"
    assert engine.trace == [[0, 1], [0, 1], [0, 1]]  # three short turns beside the one long turn
    engine.update_weights({}, 1)
    runner.start_many([(EpisodeTask("train", 2), "joins")])
    finished = []
    while runner.num_active:
        finished += runner.advance(policy, interrupt=lambda: False)
    assert [tag for tag, _ in finished] == ["joins", "long"]
    assert engine.trace[3:6] == [[0, 1]] * 3  # the new episode (slot 0 again) joined the long turn's batch
    versions = {tag: [t.policy_version for t in r.trajectory.turns] for tag, r in finished}
    assert versions == {"joins": [1, 1, 1], "long": [0, 1, 1]}
    assert runner.num_free == 2


def test_advance_without_a_streaming_engine_plays_the_rounds_step_plays(engine_and_tokenizer):
    """On an engine without `stream` (HF) `advance` answers in rounds: greedy episodes come out
    exactly as `step`'s, handed back as each ends."""
    engine, tok = engine_and_tokenizer
    loop = LoopConfig(max_turns=3)
    policy = ModelPolicy(engine, tok, SamplingConfig(temperature=0.0, max_new_tokens=12), loop)
    played = {}
    for name in ("step", "advance"):
        runner = EpisodeRunner(BabyAITextEnv, 3, loop)
        runner.start_many([(EpisodeTask("train", seed), seed) for seed in (0, 1, 2)])
        results = []
        while runner.num_active:
            results += runner.step(policy) if name == "step" else runner.advance(policy, interrupt=lambda: True)
        played[name] = {seed: [(t.prompt_ids, t.response_ids) for t in r.trajectory.turns] for seed, r in results}
    assert played["advance"] == played["step"] and len(played["step"]) == 3


def test_closing_a_runner_aborts_the_turns_it_left_generating(engine_and_tokenizer):
    _, tok = engine_and_tokenizer
    engine = StreamingEngine(tuple(tok.encode("go", add_special_tokens=False)), steps={0: 1, 1: 50})
    runner = EpisodeRunner(BabyAITextEnv, 2, LoopConfig(max_turns=1))
    runner.start_many([(EpisodeTask("train", 0), "a"), (EpisodeTask("train", 1), "b")])
    policy = ModelPolicy(engine, tok, SamplingConfig(), LoopConfig(max_turns=1))
    assert [tag for tag, _ in runner.advance(policy, interrupt=lambda: False)] == ["a"]
    stream = runner._stream
    runner.close()
    assert stream.gi_frame is None  # the engine's stream ran its cleanup
