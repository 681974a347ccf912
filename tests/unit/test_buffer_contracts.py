"""Data contracts round-trip; prefix expansion; packing equals separate samples on a tiny model."""

import dataclasses

import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from buffer.contracts import (
    SAMPLE_SCHEMA,
    TRAJECTORY_SCHEMA,
    Sample,
    Trajectory,
    Turn,
    samples_to_table,
    table_to_samples,
    table_to_trajectories,
    trajectories_to_table,
)
from buffer.expansion import can_pack, expand, pack, sample_sequence, to_sequences
from envs.babyai_text import BabyAITextEnv
from envs.parser import format_tool_call
from envs.prompt import HistoryTurn, PromptConfig, render_messages
from models.loading import ModelConfig, load_model, load_tokenizer

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-50, max_value=0)
tokens = st.lists(st.integers(0, 2**31 - 1), max_size=6).map(tuple)


@st.composite
def turns(draw, index):
    response = draw(tokens)
    n = len(response)
    logps = st.lists(f32, min_size=n, max_size=n).map(tuple)
    k = draw(st.integers(1, 3))
    topk_ids = draw(st.none() | st.lists(st.tuples(*[st.integers(-1, 2**31 - 1)] * k), min_size=n, max_size=n))
    topk_lps = None if topk_ids is None else draw(st.lists(st.tuples(*[f32] * k), min_size=n, max_size=n))
    return Turn(turn_index=index, prompt_ids=draw(tokens), response_ids=response,
                teacher_topk_ids=None if topk_ids is None else tuple(topk_ids),
                teacher_topk_logprobs=None if topk_lps is None else tuple(topk_lps),
                behaviour_logprobs=draw(logps), policy_version=draw(st.integers(0, 10**6)),
                teacher_logprobs=draw(st.none() | logps), trainable=draw(st.booleans()),
                well_formed=draw(st.booleans()), turn_reward=draw(st.floats(-1, 1)),
                finish_reason=draw(st.sampled_from(["stop", "length", "context"])),
                executed_call=draw(st.none() | st.just('{"name": "drop", "arguments": {}}')))


@st.composite
def trajectories(draw):
    num_turns = draw(st.integers(0, 4))
    return Trajectory(trajectory_id=draw(st.text(max_size=8)), group_id=draw(st.text(max_size=8)),
                      split=draw(st.sampled_from(["train", "eval"])), task_seed=draw(st.integers(0, 10**9)),
                      task_type=draw(st.sampled_from(["go_to", "open"])),
                      turns=tuple(draw(turns(i)) for i in range(num_turns)), success=draw(st.booleans()),
                      outcome_reward=draw(st.floats(-1, 1)), format_reward=draw(st.floats(-1, 1)),
                      horizon_k=draw(st.none() | st.integers(1, 30)), advantage=draw(st.none() | st.floats(-5, 5)),
                      task=draw(st.text(max_size=10)))


@settings(max_examples=100, deadline=None)
@given(st.lists(trajectories(), max_size=4))
def test_round_trips_dataclass_arrow_parquet(tmp_path_factory, trajs):
    directory = tmp_path_factory.mktemp("rt")
    table = trajectories_to_table(trajs)
    assert table.schema == TRAJECTORY_SCHEMA
    assert table_to_trajectories(table) == trajs
    pq.write_table(table, directory / "t.parquet")
    assert table_to_trajectories(pq.read_table(directory / "t.parquet")) == trajs
    samples = [s for t in trajs for s in expand(t)]
    stable = samples_to_table(samples)
    assert stable.schema == SAMPLE_SCHEMA and stable.num_rows == len(samples)
    assert table_to_samples(stable) == samples
    pq.write_table(stable, directory / "s.parquet")
    assert table_to_samples(pq.read_table(directory / "s.parquet")) == samples


def test_schemas_document_every_dataclass_field():
    for cls in (Turn, Trajectory, Sample):
        source = __import__("inspect").getsource(cls)
        for f in dataclasses.fields(cls):
            assert f'{f.name}:' in source and source.split(f"{f.name}:", 1)[1].split("\n", 2)[1].strip().startswith('"""'), \
                f"{cls.__name__}.{f.name} has no docstring"


def test_turn_checks_lengths():
    with pytest.raises(ValueError, match="behaviour log-probs"):
        Turn(0, (1,), (2, 3), (-0.1,), 0)
    with pytest.raises(ValueError, match="teacher log-probs"):
        Turn(0, (1,), (2,), (-0.1,), 0, teacher_logprobs=(-1.0, -2.0))
    with pytest.raises(ValueError, match="both be set"):
        Turn(0, (1,), (2,), (-0.1,), 0, teacher_topk_ids=((2, 3),))
    with pytest.raises(ValueError, match="top-k rows"):
        Turn(0, (1,), (2, 3), (-0.1, -0.2), 0, teacher_topk_ids=((2, 3),), teacher_topk_logprobs=((-1.0, -2.0),))
    with pytest.raises(ValueError, match="different widths"):
        Turn(0, (1,), (2,), (-0.1,), 0, teacher_topk_ids=((2, 3),), teacher_topk_logprobs=((-1.0,),))
    with pytest.raises(ValueError, match="not a sample table"):
        table_to_samples(trajectories_to_table([]))


def _expert_trajectory(tok, env, seed, window, num_turns=6, teacher=True):
    """A real episode with prompts rendered by the chat template and canonical responses."""
    reset = env.reset(seed, "train")
    expert, last, history, out = env.expert(), None, [], []
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for k in range(num_turns):
        messages = render_messages(PromptConfig(history_window=window), env.system_prompt, reset.task,
                                   reset.observation, history)
        prompt = tok.apply_chat_template(messages, tools=env.tools, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
        last = expert.act(last)
        text = format_tool_call(last)
        response = tuple(tok.encode(text, add_special_tokens=False)) + (end,)
        logps = tuple(-0.5 - 0.01 * j for j in range(len(response)))
        out.append(Turn(turn_index=k, prompt_ids=tuple(prompt), response_ids=response, behaviour_logprobs=logps,
                        policy_version=k // 2, teacher_logprobs=logps if teacher else None,
                        trainable=k != 1))
        step = env.step(last)
        history.append(HistoryTurn(text, last, None, None, step.observation))
        if step.done:
            break
    return Trajectory(f"t-{window}", "g0", "train", seed, reset.info.task_type, tuple(out), step.success, 1.0, 0.5)


@pytest.fixture(scope="module")
def tiny():
    cfg = ModelConfig(path="tiny:nano")
    return load_tokenizer(cfg), load_model(cfg)


def _token_logprobs(model, seq):
    ids = torch.tensor([seq.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    mask = torch.tensor(seq.loss_mask[1:])
    turn = torch.tensor(seq.turn_index[1:])
    return logp, mask, turn


def test_expansion_gives_one_sample_per_turn_with_masks(tiny):
    tok, _ = tiny
    traj = _expert_trajectory(tok, BabyAITextEnv(), seed=0, window="all")
    samples = expand(traj)
    assert [s.turn_index for s in samples] == list(range(traj.num_turns)) and traj.num_turns == 6
    for s, turn in zip(samples, traj.turns):
        seq = sample_sequence(s)
        assert seq.token_ids == turn.prompt_ids + turn.response_ids
        assert seq.loss_mask == (False,) * len(turn.prompt_ids) + (turn.trainable,) * len(turn.response_ids)
        assert s.num_turns == 6 and s.outcome_reward == 1.0


def test_packed_and_separate_give_the_same_logprobs_and_loss(tiny):
    tok, model = tiny
    traj = _expert_trajectory(tok, BabyAITextEnv(), seed=0, window="all")
    samples = expand(traj)
    assert can_pack(samples)
    packed = pack(samples)
    separate = [sample_sequence(s) for s in samples]
    assert packed.num_tokens == len(samples[-1].prompt_ids) + len(samples[-1].response_ids)
    assert packed.num_tokens < sum(s.num_tokens for s in separate) / 2
    assert packed.num_loss_tokens == sum(s.num_loss_tokens for s in separate)
    assert packed.teacher_logprobs is not None and packed.policy_version.count(-1) < packed.num_tokens
    p_logp, p_mask, p_turn = _token_logprobs(model, packed)
    for k, seq in enumerate(separate):
        s_logp, s_mask, s_turn = _token_logprobs(model, seq)
        in_turn = p_turn == k
        assert torch.allclose(p_logp[in_turn], s_logp[s_turn == k], atol=1e-5, rtol=0)
        assert torch.equal(p_mask[in_turn], s_mask[s_turn == k])
    loss_packed = -(p_logp * p_mask).sum() / p_mask.sum()
    parts = [_token_logprobs(model, seq) for seq in separate]
    loss_separate = -sum((lp * m).sum() for lp, m, _ in parts) / sum(m.sum() for _, m, _ in parts)
    assert abs(loss_packed.item() - loss_separate.item()) < 1e-5


def test_windowed_history_is_detected_and_falls_back(tiny):
    tok, _ = tiny
    traj = _expert_trajectory(tok, BabyAITextEnv(), seed=0, window=2, teacher=False)
    samples = expand(traj)
    assert not can_pack(samples) and pack(samples) is None
    assert can_pack(samples[:3])  # nests until turns fall out of the window
    seqs = to_sequences(samples)
    assert len(seqs) == len(samples) and all(s.teacher_logprobs is None for s in seqs)
    full = _expert_trajectory(tok, BabyAITextEnv(), seed=0, window="all")
    assert len(to_sequences(expand(full))) == 1
    assert len(to_sequences(expand(full), packing=False)) == full.num_turns
    # Samples from different episodes, or out of order, never merge.
    mixed = expand(full)[:2] + expand(traj)[:2]
    assert len(to_sequences(mixed)) == 2
    assert not can_pack([expand(full)[1], expand(full)[0]])


def test_ipc_encoding_round_trips_without_copies():
    from buffer.actor import decode_table, encode_table

    turns = (Turn(0, (1, 2), (3,), (-0.5,), 0), Turn(1, (1, 2, 3, 4), (5, 6), (-0.25, -1.0), 1, (-2.0, -3.0)))
    table = samples_to_table(expand(Trajectory("a", "g", "train", 3, "open", turns, False, -1.0, 0.5)))
    data = encode_table(table)
    decoded = decode_table(data)
    assert decoded.equals(table)
    column = decoded.column("prompt_ids").chunk(0).values.buffers()[1]
    assert data.ctypes.data <= column.address < data.ctypes.data + data.nbytes  # a view into data


def test_packing_places_each_turns_teacher_top_k_on_its_response_tokens(tiny):
    tok, _ = tiny
    traj = _expert_trajectory(tok, BabyAITextEnv(), seed=0, window="all")
    traj = dataclasses.replace(traj, turns=tuple(
        dataclasses.replace(turn, teacher_topk_ids=tuple((k, j) for j in range(len(turn.response_ids))),
                            teacher_topk_logprobs=tuple((-1.0, -float(j)) for j in range(len(turn.response_ids))))
        for k, turn in enumerate(traj.turns)))
    packed = pack(expand(traj))
    assert len(packed.teacher_topk_ids) == packed.num_tokens
    for p, (ids, turn_index) in enumerate(zip(packed.teacher_topk_ids, packed.turn_index)):
        if turn_index < 0:
            assert ids == (-1, -1) and packed.teacher_topk_logprobs[p] == (0.0, 0.0)
        else:
            assert ids[0] == turn_index
    # A turn without top-k: the sequence has none (the loss then refuses the batch, naming teacher.top_k).
    partial = dataclasses.replace(traj, turns=(dataclasses.replace(traj.turns[0], teacher_topk_ids=None,
                                                                   teacher_topk_logprobs=None),) + traj.turns[1:])
    assert pack(expand(partial)).teacher_topk_ids is None
