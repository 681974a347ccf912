"""Turn prompt rendering: window, malformed turns, prefix property."""

import pytest
from pydantic import ValidationError

from envs.babyai_text import BabyAITextEnv
from envs.parser import ToolCallParser, format_tool_call
from envs.prompt import HistoryTurn, PromptConfig, render_messages, template_tools
from envs.protocol import ToolCall
from models.loading import ModelConfig, load_tokenizer


def expert_history(env, seed, num_turns, bad_turns=()):
    reset = env.reset(seed, "train")
    parser = ToolCallParser(env.tools)
    expert, last, history = env.expert(), None, []
    for k in range(num_turns):
        if k in bad_turns:
            text = "I am not sure what to do"
            parsed = parser.parse(text)
            history.append(HistoryTurn(text, None, parsed.error, None, history[-1].observation if history
                                       else reset.observation))
            continue
        last = expert.act(last)
        text = format_tool_call(last)
        parsed = parser.parse(text)
        step = env.step(parsed.call)
        history.append(HistoryTurn(text, parsed.call, None, None, step.observation))
        if step.done:
            break
    return reset, history


def test_first_turn_is_system_and_task():
    env = BabyAITextEnv()
    reset = env.reset(3, "train")
    msgs = render_messages(PromptConfig(), env.system_prompt, reset.task, reset.observation, [])
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[1]["content"] == f"Your task: {reset.task}\n\nWhat you see:\n{reset.observation}"


def test_window_keeps_the_last_turns_and_says_how_many_are_hidden():
    env = BabyAITextEnv()
    reset, history = expert_history(env, 0, 6)  # an open task: long enough
    assert len(history) == 6
    msgs = render_messages(PromptConfig(history_window=2), env.system_prompt, reset.task, reset.observation, history)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert "(4 earlier turns not shown.)" in msgs[1]["content"]
    # The window starts from the observation the first shown action answered.
    assert msgs[1]["content"].endswith(history[3].observation)
    assert msgs[-1]["content"] == history[-1].observation
    assert msgs[2]["tool_calls"][0]["function"]["name"] == history[4].call.name
    zero = render_messages(PromptConfig(history_window=0), env.system_prompt, reset.task, reset.observation, history)
    assert len(zero) == 2 and zero[1]["content"] == f"Your task: {reset.task}\n\nWhat you see:\n{history[-1].observation}"


def test_the_last_action_is_named_when_no_past_turn_is_shown():
    env = BabyAITextEnv()
    reset, history = expert_history(env, 11, 3, bad_turns=(1,))
    cfg = PromptConfig(history_window=0, last_action=True)

    def user(turns):
        return render_messages(cfg, env.system_prompt, reset.task, reset.observation, turns)[-1]["content"]

    assert user([]) == f"Your task: {reset.task}\n\nWhat you see:\n{reset.observation}"
    assert user(history[:1]) == (f"Your task: {reset.task}\nYour last action: {history[0].call.name}\n\n"
                                 f"What you see:\n{history[0].observation}")
    assert "Your last action: none\n" in user(history[:2])  # the malformed turn did not act
    with pytest.raises(ValueError, match="last_action .* history_window=2 .* set history_window: 0"):
        PromptConfig(history_window=2, last_action=True)


def _episode_of(calls, **cues):
    """BabyAI task 3 played with `calls`; its turns, and the window-0 user message after the first k."""
    env = BabyAITextEnv()
    reset = env.reset(3, "train")
    history = [HistoryTurn(response_text="", call=ToolCall(name=name, arguments={}), error=None, think=None,
                           observation=env.step(ToolCall(name=name, arguments={})).observation) for name in calls]
    cfg = PromptConfig(history_window=0, last_action=True, **cues)

    def user(k):
        return render_messages(cfg, env.system_prompt, reset.task, reset.observation, history[:k])[-1]["content"]

    return reset, history, user


def test_revisits_count_the_earlier_showings_of_the_current_view():
    # Four left turns bring the first view back, eight bring it back twice.
    reset, history, user = _episode_of(["turn_left"] * 8, revisits=True)
    assert history[3].observation == reset.observation and history[7].observation == reset.observation
    assert "seen" not in user(0) and "seen" not in user(3)
    assert user(4) == (f"Your task: {reset.task}\nYour last action: turn_left\n"
                       f"You have seen this view 1 time before\n\nWhat you see:\n{reset.observation}")
    assert "You have seen this view 2 times before\n" in user(8)
    assert "You have seen this view 1 time before\n" in user(5)  # the first turn's view
    with pytest.raises(ValueError, match="revisits .* history_window=all .* set history_window: 0"):
        PromptConfig(history_window="all", revisits=True)


def test_revisit_action_names_the_call_taken_at_the_last_showing_of_the_current_view():
    # The views: 0 1 2 3 0 | 3 0 1 (turning right at view 0 shows view 3, turning left brings 0 and 1 back).
    reset, history, user = _episode_of(["turn_left"] * 4 + ["turn_right", "turn_left", "turn_left"],
                                       revisit_action=True)
    assert history[3].observation == reset.observation == history[5].observation
    assert "here before" not in user(0) and "here before" not in user(3)
    assert user(4) == (f"Your task: {reset.task}\nYour last action: turn_left\n"
                       f"Your action here before: turn_left\n\nWhat you see:\n{reset.observation}")
    assert "Your action here before: turn_left\n" in user(5)  # view 3, left at turn 3
    assert "Your action here before: turn_right\n" in user(6)  # view 0, right at its last showing
    assert "Your action here before: turn_left\n" in user(7)  # view 1, left at turn 1
    with pytest.raises(ValueError, match="revisit_action .* history_window=2 .* set history_window: 0"):
        PromptConfig(history_window=2, revisit_action=True)


def test_malformed_turns_keep_raw_text_and_name_the_error():
    env = BabyAITextEnv()
    reset, history = expert_history(env, 11, 3, bad_turns=(1,))
    msgs = render_messages(PromptConfig(history_window="all"), env.system_prompt, reset.task, reset.observation,
                           history)
    assert msgs[4] == {"role": "assistant", "content": "I am not sure what to do"}
    assert msgs[5]["role"] == "user" and msgs[5]["content"].startswith("Format error (no_tool_call)")
    assert "No action was taken." in msgs[5]["content"]


def test_working_memory_is_shown():
    msgs = render_messages(PromptConfig(), "sys", "go", "obs", [], working_memory="the key is behind me")
    assert "Your working memory:\nthe key is behind me\n" in msgs[1]["content"]


def test_full_history_prompts_extend_each_other_token_for_token():
    tok = load_tokenizer(ModelConfig(path="tiny:nano"))
    env = BabyAITextEnv()
    reset, history = expert_history(env, 5, 8)
    cfg = PromptConfig(history_window="all")
    prompts = [tok.apply_chat_template(render_messages(cfg, env.system_prompt, reset.task, reset.observation,
                                                       history[:k]),
                                       tools=env.tools, add_generation_prompt=True, tokenize=True, return_dict=False)
               for k in range(len(history) + 1)]
    for k in range(len(history)):
        assert prompts[k + 1][:len(prompts[k])] == prompts[k]
    # A finite window breaks the prefix property once turns fall out of it.
    short = PromptConfig(history_window=2)
    p3, p4 = (tok.apply_chat_template(render_messages(short, env.system_prompt, reset.task, reset.observation,
                                                      history[:k]),
                                      tools=env.tools, add_generation_prompt=True, tokenize=True, return_dict=False)
              for k in (3, 4))
    assert p4[:len(p3)] != p3


def test_compact_tools_are_one_line_each_in_the_system_message():
    tok = load_tokenizer(ModelConfig(path="tiny:nano"))
    env = BabyAITextEnv()
    reset = env.reset(3, "train")
    compact = PromptConfig(tools="compact")
    msgs = render_messages(compact, env.system_prompt, reset.task, reset.observation, [], tools=env.tools)
    system = msgs[0]["content"]
    assert system.startswith(env.system_prompt + "\n\nTools (call one as <tool_call>")
    assert "turn_left: Turn 90 degrees to the left." in system.splitlines()
    assert template_tools(compact, env.tools) is None and template_tools(PromptConfig(), env.tools) == env.tools
    rendered = {cfg.tools: tok.apply_chat_template(
        render_messages(cfg, env.system_prompt, reset.task, reset.observation, [], tools=env.tools),
        tools=template_tools(cfg, env.tools), add_generation_prompt=True, tokenize=True, return_dict=False)
        for cfg in (PromptConfig(), compact)}
    assert "<tools>" not in tok.decode(rendered["compact"]) and "<tools>" in tok.decode(rendered["schema"])
    assert len(rendered["compact"]) < 0.7 * len(rendered["schema"])
    # Without the tools argument the system message is the environment's alone.
    assert render_messages(compact, "sys", "go", "obs", [])[0]["content"] == "sys"


def test_without_the_system_message_the_prompt_opens_with_the_task():
    tok = load_tokenizer(ModelConfig(path="tiny:nano"))
    env = BabyAITextEnv()
    reset = env.reset(3, "train")
    bare = PromptConfig(tools="compact", system_message=False, history_window=0)
    msgs = render_messages(bare, env.system_prompt, reset.task, reset.observation, [], tools=env.tools)
    assert [m["role"] for m in msgs] == ["user"] and msgs[0]["content"].startswith(f"Your task: {reset.task}")
    ids = tok.apply_chat_template(msgs, tools=template_tools(bare, env.tools), add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    text = tok.decode(ids)
    assert "<|im_start|>system" not in text and env.system_prompt not in text and "turn_left:" not in text
    # Privileged context still reaches the model, as the only system text.
    with_map = render_messages(bare, env.system_prompt, reset.task, reset.observation, [], tools=env.tools,
                               system_extra="Map: ...")
    assert with_map[0] == {"role": "system", "content": "Map: ..."}
    with pytest.raises(ValidationError, match="needs tools: compact"):
        PromptConfig(system_message=False)


def test_bad_window():
    with pytest.raises(ValidationError, match="history_window"):
        PromptConfig(history_window=-1)
    with pytest.raises(ValidationError):
        PromptConfig(history_window="some")
