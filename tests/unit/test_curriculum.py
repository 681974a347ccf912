"""TCOD's horizon curriculum: the k schedule, episode plans, and B2F replay in the agent loop."""

import json

import pytest
from pydantic import ValidationError

from actors.agent_loop import EpisodeTask, LoopConfig, ModelPolicy, run_episodes
from actors.engine import SamplingConfig
from actors.expert import DemonstrationPolicy
from actors.hf_engine import HFEngine
from buffer.expansion import expand, to_sequences
from envs.babyai_text import BabyAITextConfig, BabyAITextEnv
from envs.prompt import PromptConfig
from envs.protocol import ToolCall
from jobs.collect_expert import CollectExpertConfig, collect, write
from learner.curriculum import TCODConfig, TCODCurriculum, horizon, plan_episode
from models.loading import ModelConfig, load_model, load_tokenizer

NANO = ModelConfig(path="tiny:nano")
STARTER = BabyAITextConfig(room_size=6, num_distractors=0, task_types=("go_to", "pick_up"))


def test_the_horizon_grows_with_the_main_loop_version():
    cfg = TCODConfig(k_start=1, eta=2)
    assert [horizon(cfg, n) for n in range(7)] == [1, 1, 2, 2, 3, 3, 4]
    assert [horizon(TCODConfig(k_start=3, eta=1), n) for n in range(3)] == [3, 4, 5]
    with pytest.raises(ValueError):
        horizon(cfg, -1)
    with pytest.raises(ValidationError, match="needs expert_path"):
        TCODConfig(mode="b2f")


def test_episode_plans():
    calls = tuple(ToolCall(name) for name in ("turn_left", "go_forward", "go_forward", "pick_up"))
    f2b = TCODConfig(mode="f2b")
    assert plan_episode(f2b, 2, 10, calls).max_turns == 2 and plan_episode(f2b, 30, 10, None).max_turns == 10
    b2f = TCODConfig(mode="b2f", expert_path="x")
    plan = plan_episode(b2f, 1, 10, calls)
    assert plan.replay == calls[:3] and plan.max_turns == 10 and plan.horizon_k == 1
    assert plan_episode(b2f, 3, 10, calls).replay == calls[:1]
    assert plan_episode(b2f, 4, 10, calls).replay == () and plan_episode(b2f, 2, 10, None).replay == ()


def test_b2f_replays_the_expert_untrainable_with_live_prompts(tmp_path):
    out = write(CollectExpertConfig(env=STARTER, num_tasks=6, max_turns=10, output_dir=str(tmp_path)),
                collect(CollectExpertConfig(env=STARTER, num_tasks=6, max_turns=10)), 1.0)
    assert json.loads((out / "manifest.json").read_text())["num_solved"] == 6
    curriculum = TCODCurriculum(TCODConfig(mode="b2f", expert_path=str(tmp_path)))
    tok = load_tokenizer(NANO)
    loop = LoopConfig(max_turns=10, prompt=PromptConfig(history_window="all"))
    policy = ModelPolicy(HFEngine(load_model(NANO), tok.pad_token_id, [tok.convert_tokens_to_ids("<|im_end|>")]),
                         tok, SamplingConfig(max_new_tokens=8, seed=0), loop)
    # A task whose τ* has at least 3 calls; k = 1 replays all but the last one.
    seed = next(s for s in range(6) if len(curriculum.experts[("train", s)]) >= 3)
    expert = curriculum.experts[("train", seed)]
    plan, missing = curriculum.plan("train", seed, step=0, turn_limit=10)
    assert not missing and plan.replay == expert[:-1]
    task = EpisodeTask("train", seed, max_turns=plan.max_turns, replay=plan.replay, horizon_k=plan.horizon_k)
    traj = run_episodes(lambda: BabyAITextEnv(STARTER), [task], policy, loop)[0].trajectory
    replayed = len(plan.replay)
    assert traj.horizon_k == 1 and traj.num_turns > replayed
    assert [t.trainable for t in traj.turns[:replayed + 1]] == [False] * replayed + [True]
    assert [json.loads(t.executed_call)["name"] for t in traj.turns[:replayed]] == [c.name for c in plan.replay]
    # The student's first prompt is byte-identical to the one it would see had it played the
    # expert's calls itself: the demonstration of the same task, turn for turn.
    demo = run_episodes(lambda: BabyAITextEnv(STARTER), [EpisodeTask("train", seed)], DemonstrationPolicy(tok, loop),
                        loop)[0].trajectory
    assert traj.turns[replayed].prompt_ids == demo.turns[replayed].prompt_ids
    assert [t.response_ids for t in traj.turns[:replayed]] == [t.response_ids for t in demo.turns[:replayed]]
    # Replayed turns carry no loss: the packed sequence masks them.
    sequence, = to_sequences(expand(traj))
    trained_turns = {i for i, m in zip(sequence.turn_index, sequence.loss_mask) if m}
    assert trained_turns and min(trained_turns) == replayed
    # A task with no expert success falls back to student play, and says so.
    plan, missing = curriculum.plan("train", 10_000, step=0, turn_limit=10)
    assert missing and plan.replay == ()


def test_f2b_cuts_the_episode_at_k_turns():
    tok = load_tokenizer(NANO)
    loop = LoopConfig(max_turns=10)
    policy = DemonstrationPolicy(tok, loop)
    plan = plan_episode(TCODConfig(), horizon(TCODConfig(), 2), 10, None)
    result = run_episodes(lambda: BabyAITextEnv(STARTER), [EpisodeTask("train", 0, max_turns=plan.max_turns,
                                                                       horizon_k=plan.horizon_k)], policy, loop)[0]
    assert plan.max_turns == 2 and result.num_turns == 2 and result.truncated == "max_turns"
    assert result.trajectory.horizon_k == 2


def test_an_lm_expert_keeps_the_first_replayable_success_of_its_n_attempts():
    import dataclasses

    from jobs.collect_expert import pass_at_n_row

    tok = load_tokenizer(NANO)
    loop = LoopConfig(max_turns=10, prompt=PromptConfig(history_window="all"))
    demo, = run_episodes(lambda: BabyAITextEnv(STARTER), [EpisodeTask("train", 1)], DemonstrationPolicy(tok, loop),
                         loop)
    failed = dataclasses.replace(demo, success=False)
    idle = demo.trajectory.turns[0]
    did_nothing = dataclasses.replace(demo, trajectory=dataclasses.replace(
        demo.trajectory, turns=(dataclasses.replace(idle, executed_call=None),) + demo.trajectory.turns[1:]))
    row = pass_at_n_row([failed, did_nothing, demo])
    assert row["success"] and row["calls"] == [t.executed_call for t in demo.trajectory.turns]
    assert (row["split"], row["seed"], row["num_turns"]) == ("train", 1, demo.num_turns)
    assert pass_at_n_row([failed, did_nothing]) == {**row, "success": False, "num_turns": 0, "calls": []}
    # The real path: N sampled episodes per task through an engine, one row per task.
    config = CollectExpertConfig(env=STARTER, num_tasks=2, max_turns=2, policy="model", model=NANO, engine="hf",
                                 num_samples=3, sampling=SamplingConfig(temperature=1.0, max_new_tokens=8, seed=0))
    ticks = []
    rows = collect(config, on_task=lambda: ticks.append(1))
    assert [r["seed"] for r in rows] == [0, 1] and len(ticks) == 2
    with pytest.raises(ValidationError, match="set max_turns only"):
        CollectExpertConfig(max_turns=5, loop=LoopConfig(max_turns=10))


def test_tau_star_defaults_to_the_jobs_model_teacher_pass_at_10():
    """Document 003 replays the teacher's own pass@10 successes: given the B2F job's config,
    jobs.collect_expert samples that job's model teacher (with its privileged context) in the
    job's environment and turn limit; with the oracle teacher, the environment's expert."""
    gpu = CollectExpertConfig(job="jobs/configs/babyai_tcod_qwen3_gpu8.yaml")
    assert (gpu.policy, gpu.model.path, gpu.num_samples, gpu.max_turns) == ("model", "/models/Qwen3-14B", 10, 20)
    built = CollectExpertConfig(job="jobs/configs/babyai_retire_qwen3_gpu8.yaml")
    assert built.policy == "model" and built.loop.privileged.map and built.loop.privileged.skill_bank
    tiny = CollectExpertConfig(job="jobs/configs/babyai_tcod_tiny.yaml", num_tasks=3)
    assert tiny.policy == "expert" and tiny.env.room_size == 6 and tiny.max_turns == 10
    assert CollectExpertConfig(job="jobs/configs/babyai_tcod_qwen3_gpu8.yaml", policy="expert").policy == "expert"
