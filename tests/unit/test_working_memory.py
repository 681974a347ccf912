"""Two-stage working memory: stages, rendering, masks, rewards, and the pieces that read stages (no Ray)."""

import asyncio
import dataclasses
import json

import pytest

from actors.agent_loop import EpisodeTask, LoopConfig, ModelPolicy, Response, memory_well_formed, run_episodes
from actors.engine import SamplingConfig
from actors.expert import DemonstrationPolicy, ExpertPolicy, expert_memory
from actors.hf_engine import HFEngine
from buffer.contracts import Trajectory, Turn, table_to_trajectories, trajectories_to_table
from buffer.expansion import can_pack, expand
from envs.babyai_text import BabyAITextEnv
from envs.prompt import MEMORY_REQUEST, PromptConfig
from envs.protocol import ToolCall
from envs.rewards import RewardConfig
from judge.service import JudgeConfig, JudgeService
from learner.algorithms import select_turns
from models.loading import ModelConfig, load_model, load_tokenizer

MEMORY = LoopConfig(max_turns=64, working_memory=True, prompt=PromptConfig(history_window=2, tools="compact"))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ModelConfig(path="tiny:nano"))


def tasks(seeds, **kw):
    return [EpisodeTask("train", s, **kw) for s in seeds]


class ByStage:
    """Answers the memory stage with `memory` and the action stage with `action`."""

    def __init__(self, memory, action='<tool_call>\n{"name": "turn_left", "arguments": {}}\n</tool_call>'):
        self.memory, self.action = memory, action

    def respond(self, episodes):
        return [Response(self.memory if ep.stage == "memory" else self.action) for ep in episodes]


def test_the_expert_with_working_memory_plays_as_without_it():
    plain = run_episodes(BabyAITextEnv, tasks(range(8)), ExpertPolicy(), LoopConfig(max_turns=64), batch_size=4)
    memory = run_episodes(BabyAITextEnv, tasks(range(8)), ExpertPolicy(), MEMORY, batch_size=4)
    assert [(r.success, r.num_turns) for r in memory] == [(r.success, r.num_turns) for r in plain]
    assert all(r.success and r.num_format_errors == 0 and r.reward.total == 1.5 for r in memory)


def test_demonstrations_alternate_memory_and_action_turns_rendered_from_messages(tok):
    result = run_episodes(BabyAITextEnv, tasks([0]), DemonstrationPolicy(tok, MEMORY), MEMORY)[0]
    traj = result.trajectory
    assert [t.stage for t in traj.turns] == ["memory", "action"] * result.num_turns
    assert traj.env_steps() == [k // 2 for k in range(2 * result.num_turns)]
    assert [t.turn_index for t in traj.turns] == list(range(traj.num_turns))
    assert all(t.trainable and t.well_formed for t in traj.turns)
    for k in range(2, traj.num_turns, 2):
        memory, action = traj.turns[k], traj.turns[k + 1]
        memory_prompt, action_prompt = tok.decode(memory.prompt_ids), tok.decode(action.prompt_ids)
        written = tok.decode(memory.response_ids, skip_special_tokens=True)
        call = ToolCall(json.loads(action.executed_call)["name"])
        assert written == expert_memory(call)  # the bot's memory is the plan it then executes
        # The memory stage asks for notes after the window; the action stage shows the notes just written.
        assert memory_prompt.endswith(f"{MEMORY_REQUEST}<|im_end|>\n<|im_start|>assistant\n")
        assert f"Your working memory:\n{written}\n" in action_prompt and MEMORY_REQUEST not in action_prompt
        previous = tok.decode(traj.turns[k - 2].response_ids, skip_special_tokens=True)
        assert f"Your working memory:\n{previous}\n" in memory_prompt  # the last memory, not the new one
        assert action_prompt.count("<|im_start|>assistant") <= 2 + 1  # the window (2 turns) + the generation prompt
    # The memory changes every step: prompts do not nest, so the episode trains as expanded samples.
    samples = expand(traj)
    assert not can_pack(samples) and len(samples) == traj.num_turns
    assert table_to_trajectories(trajectories_to_table([traj])) == [traj]  # the stage round-trips through Arrow


def test_a_memory_is_notes_a_tool_call_or_nothing_there_is_a_format_error():
    assert memory_well_formed("the key is left; plan: turn left")
    assert not memory_well_formed("  \n") and not memory_well_formed('<tool_call>{"name": "drop"}</tool_call>')
    loop = MEMORY.model_copy(update={"max_turns": 3})
    good = run_episodes(BabyAITextEnv, tasks([1]), ByStage("plan: look around"), loop)[0]
    acting = run_episodes(BabyAITextEnv, tasks([1]), ByStage('<tool_call>{"name": "go_forward", "arguments": {}}'
                                                             '</tool_call>'), loop)[0]
    assert good.num_format_errors == 0 and good.reward.format == 0.5
    assert acting.num_turns == 3 and acting.num_format_errors == 3 and acting.reward.format == -0.5
    gentle = loop.model_copy(update={"rewards": RewardConfig.gentle(), "parser_mode": "gentle"})
    empty = run_episodes(BabyAITextEnv, tasks([1]), ByStage(""), gentle)[0]
    assert empty.reward.per_turn == (-0.1, 0.0) * 3  # per response, memory stages included


def test_the_model_writes_memory_within_its_own_budget(tok):
    engine = HFEngine(load_model(ModelConfig(path="tiny:nano")), tok.pad_token_id, [tok.convert_tokens_to_ids("<|im_end|>")])
    loop = MEMORY.model_copy(update={"max_turns": 3, "memory_max_new_tokens": 5})
    policy = ModelPolicy(engine, tok, SamplingConfig(max_new_tokens=12, seed=0), loop)
    for result in run_episodes(BabyAITextEnv, tasks([0, 1]), policy, loop):
        turns = result.trajectory.turns
        assert [t.stage for t in turns] == ["memory", "action"] * 3
        assert all(len(t.response_ids) <= 5 for t in turns if t.stage == "memory")
        assert any(len(t.response_ids) > 5 for t in turns if t.stage == "action")


def test_replayed_expert_turns_have_no_memory_stage(tok):
    bot = BabyAITextEnv()
    bot.reset(4, "train")
    expert, calls, last = bot.expert(), [], None
    for _ in range(2):
        last = expert.act(last)
        calls.append(last)
    engine = HFEngine(load_model(ModelConfig(path="tiny:nano")), tok.pad_token_id, [tok.convert_tokens_to_ids("<|im_end|>")])
    loop = MEMORY.model_copy(update={"max_turns": 4})
    policy = ModelPolicy(engine, tok, SamplingConfig(max_new_tokens=8, seed=0), loop)
    turns = run_episodes(BabyAITextEnv, tasks([4], replay=tuple(calls)), policy, loop)[0].trajectory.turns
    assert [(t.stage, t.trainable) for t in turns] == [("action", False)] * 2 + [("memory", True), ("action", True)] * 2


def staged(n_steps, tid="m"):
    turns = tuple(Turn(k, (1,), (2,), (-0.1,), 0, stage="memory" if k % 2 == 0 else "action",
                       executed_call=None if k % 2 == 0 else '{"name": "go_forward", "arguments": {}}')
                  for k in range(2 * n_steps))
    return Trajectory(tid, "g", "train", 0, "go_to", turns, False, -1.0, 0.5)


def test_turn_selection_keeps_a_memory_turn_with_its_action():
    for tid in "abcdef":
        chosen = select_turns(staged(9, tid), 4, seed=0)
        kept = [k for k, t in enumerate(chosen.turns) if t.trainable]
        assert len(kept) == 8 and all(k % 2 == 0 and k + 1 in kept for k in kept[::2])


def test_the_judge_scores_a_step_by_its_action_and_gives_the_memory_that_score():
    class ByTurn:
        def __init__(self):
            self.asked = []

        async def check(self):
            pass

        async def score(self, trajectory, turn):
            self.asked.append(turn)
            return 1.0 if turn == 1 else 0.0

        async def close(self):
            pass

    backend = ByTurn()
    t = staged(3)
    t = dataclasses.replace(t, turns=tuple(dataclasses.replace(turn, turn_reward=-0.1 if k == 0 else 0.0)
                                           for k, turn in enumerate(t.turns)))
    judged, = asyncio.run(JudgeService(JudgeConfig(), backend).judge([t]))
    assert sorted(backend.asked) == [1, 3, 5]  # actions only
    rewards = [turn.turn_reward for turn in judged.turns]
    assert rewards == pytest.approx([0.0 - 0.1, 0.0, -1.0, -1.0, -1.0, -1.0])


def test_an_oracle_teacher_cannot_score_memory_turns():
    from pydantic import ValidationError

    from jobs.train import JobConfig

    with pytest.raises(ValidationError, match="oracle teacher .* no answer for a memory turn"):
        JobConfig.model_validate({"teacher": {"backend": "oracle"}, "rollout": {"loop": {"working_memory": True}}})
