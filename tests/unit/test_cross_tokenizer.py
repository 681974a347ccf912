"""Cross-tokenizer scoring (teacher/cross_tokenizer.py): a teacher whose tokenizer differs from the student's.

Fixture: the tiny factory's nano (vocabulary 1024) and nano384 (384: fewer merges, so the same
text splits into other tokens) tokenizers and models, each direction tried."""

from __future__ import annotations

import math

import pytest

from models.loading import ModelConfig, load_model, load_tokenizer
from teacher.backends import HFTeacherBackend, ScoreRequest
from teacher.cross_tokenizer import CrossTokenizerBackend, TokenBytes, map_logprobs, spans
from teacher.service import TeacherConfig

NANO, NANO384 = ModelConfig(path="tiny:nano"), ModelConfig(path="tiny:nano384")
TEXTS = {
    "ascii": "go to the red ball",
    "multi-byte": "café → 東京, naïve ✓",
    "tool call": '<think>\nI should go forward.\n</think>\n\n<tool_call>\n{"name": "go_forward", "arguments": {}}\n</tool_call>',
}


@pytest.fixture(scope="module")
def tokenizers():
    return {"nano": load_tokenizer(NANO), "nano384": load_tokenizer(NANO384)}


@pytest.fixture(scope="module")
def teachers(tokenizers):
    return {name: HFTeacherBackend(load_model(model), tokenizers[name].pad_token_id)
            for name, model in [("nano", NANO), ("nano384", NANO384)]}


def test_the_last_byte_rule_on_hand_made_spans():
    # student: "abc" "de" "fghi"; teacher: "ab" "cd" "efghi"
    student, teacher = [(0, 3), (3, 5), (5, 9)], [(0, 2), (2, 4), (4, 9)]
    assert map_logprobs(student, teacher, [-1.0, -2.0, -3.0]) == [-1.0, -2.0, -3.0]
    # teacher "abcdefghi" spans all three: it lands on the token holding its last byte
    assert map_logprobs(student, [(0, 9)], [-4.0]) == [0.0, 0.0, -4.0]
    # several teacher tokens inside one student token add up
    assert map_logprobs([(0, 9)], [(0, 2), (2, 4), (4, 9)], [-1.0, -2.0, -3.0]) == [-6.0]
    # a student id with no text (past its tokenizer's vocabulary) covers no byte and gets 0
    assert map_logprobs([(0, 3), (3, 3), (3, 9)], teacher, [-1.0, -2.0, -3.0]) == [-1.0, 0.0, -5.0]
    with pytest.raises(ValueError, match="not the same text"):
        map_logprobs(student, [(0, 8)], [-1.0])


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_token_bytes_rebuild_the_text_and_the_tokenizations_differ(tokenizers, text):
    ids = {name: tok.encode(text, add_special_tokens=False) for name, tok in tokenizers.items()}
    for name, tok in tokenizers.items():
        assert b"".join(TokenBytes(tok)(ids[name])) == text.encode()
    if text != TEXTS["multi-byte"]:  # byte-level pieces there in both vocabularies
        assert spans(TokenBytes(tokenizers["nano"])(ids["nano"])) != \
            spans(TokenBytes(tokenizers["nano384"])(ids["nano384"]))


def conversation(tokenizer, responses: list[str], closed: bool = True) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a ChatML episode whose assistant turns are `responses`, as the
    student's ModelTeacher request nests them: the first turn's prompt, then everything after it."""
    messages = [{"role": "system", "content": "You are an agent in a grid world."},
                {"role": "user", "content": "Your task: go to the red ball."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    full = prompt
    for i, response in enumerate(responses):
        last = i == len(responses) - 1
        full += response + ("<|im_end|>" if closed or not last else "")
        if not last:
            full += f"\n<|im_start|>user\n<tool_response>\nYou moved {i + 1} step.\n</tool_response><|im_end|>\n" \
                    "<|im_start|>assistant\n"
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    full_ids = tokenizer.encode(full, add_special_tokens=False)
    assert full_ids[:len(prompt_ids)] == prompt_ids
    return prompt_ids, full_ids[len(prompt_ids):]


def teacher_logprob(tokenizer, teacher, history_text: str, response: str, closed: bool) -> float:
    """The teacher's own log-prob of `response` (and its end of turn) after `history_text`, in its tokens."""
    ids = tokenizer.encode(response, add_special_tokens=False) + ([tokenizer.eos_token_id] if closed else [])
    prompt = tokenizer.encode(history_text, add_special_tokens=False)
    return sum(teacher.score([ScoreRequest(tuple(prompt), tuple(ids))])[0].logprobs)


def test_an_id_past_the_vocabulary_has_no_bytes(tokenizers):
    tok = tokenizers["nano"]
    assert TokenBytes(tok)([len(tok) + 5, tok.encode("go", add_special_tokens=False)[0]]) == [b"", b"g"]


@pytest.mark.parametrize("student, teacher", [("nano", "nano384"), ("nano384", "nano")])
@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_a_mapped_response_sums_to_the_teachers_logprob_of_the_same_text(tokenizers, teachers, student, teacher, text):
    s_tok, t_tok = tokenizers[student], tokenizers[teacher]
    prompt_ids, response_ids = conversation(s_tok, [text])
    scored = CrossTokenizerBackend(teachers[teacher], s_tok, t_tok).score([ScoreRequest(tuple(prompt_ids),
                                                                                         tuple(response_ids))])[0]
    assert len(scored.logprobs) == len(response_ids) and scored.valid()
    messages = [{"role": "system", "content": "You are an agent in a grid world."},
                {"role": "user", "content": "Your task: go to the red ball."}]
    expected = teacher_logprob(t_tok, teachers[teacher], t_tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False), text, closed=True)
    assert math.isclose(sum(scored.logprobs), expected, rel_tol=1e-5, abs_tol=1e-4)


def test_each_turn_of_a_nested_episode_gets_its_own_teacher_logprob(tokenizers, teachers):
    s_tok, t_tok = tokenizers["nano"], tokenizers["nano384"]
    responses = [TEXTS["tool call"], TEXTS["ascii"]]
    prompt_ids, response_ids = conversation(s_tok, responses, closed=False)  # the last turn hit max_new_tokens
    asked = []

    class Counting:
        def score(self, requests, top_k=0):
            asked.extend(requests)
            return teachers["nano384"].score(requests, top_k)

    scored = CrossTokenizerBackend(Counting(), s_tok, t_tok).score(
        [ScoreRequest(tuple(prompt_ids), tuple(response_ids))])[0].logprobs
    assert len(asked) == 1  # the second turn's teacher prompt extends the first turn: one forward pass
    first = s_tok.encode(responses[0], add_special_tokens=False) + [s_tok.eos_token_id]
    second = len(s_tok.encode(responses[1], add_special_tokens=False))
    messages = [{"role": "system", "content": "You are an agent in a grid world."},
                {"role": "user", "content": "Your task: go to the red ball."}]
    turn1 = teacher_logprob(t_tok, teachers["nano384"], t_tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False), responses[0], closed=True)
    messages += [{"role": "assistant", "content": responses[0]},
                 {"role": "user", "content": "<tool_response>\nYou moved 1 step.\n</tool_response>"}]
    turn2 = teacher_logprob(t_tok, teachers["nano384"], t_tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False), responses[1], closed=False)
    assert math.isclose(sum(scored[:len(first)]), turn1, rel_tol=1e-5, abs_tol=1e-4)
    assert math.isclose(sum(scored[-second:]), turn2, rel_tol=1e-5, abs_tol=1e-4)
    # the observation between the turns is context, not scored
    assert all(lp == 0.0 for lp in scored[len(first):-second])


def test_top_k_across_vocabularies_is_refused(tokenizers, teachers):
    backend = CrossTokenizerBackend(teachers["nano384"], tokenizers["nano"], tokenizers["nano384"])
    with pytest.raises(ValueError, match="another vocabulary"):
        backend.score([ScoreRequest((1, 2), (3,))], top_k=2)


@pytest.mark.parametrize("overrides, problem", [
    ({"backend": "oracle"}, "scores in the student's tokens only"),
    ({"backend": "hf", "top_k": 2}, "teacher.top_k > 0"),
])
def test_a_cross_tokenizer_teacher_config_says_what_it_cannot_do(overrides, problem):
    with pytest.raises(ValueError, match=problem):
        TeacherConfig(cross_tokenizer=True, **overrides)


def test_without_cross_tokenizer_a_different_tokenizer_is_refused_with_the_way_out(tokenizers):
    from teacher.service import check_same_tokenizer

    with pytest.raises(ValueError, match="teacher.cross_tokenizer=true"):
        check_same_tokenizer(tokenizers["nano"], tokenizers["nano384"])


def test_bytes_that_are_no_text_end_what_the_teacher_reads(tokenizers, teachers):
    """An untrained student's stray byte tokens (or a cut inside a character): the teacher scores the
    text before them; their tokens get 0."""
    s_tok, t_tok = tokenizers["nano"], tokenizers["nano384"]
    prompt_ids, _ = conversation(s_tok, ["go"])
    good = s_tok.encode("go to", add_special_tokens=False)
    stray = s_tok.convert_tokens_to_ids(["Ĭ"])  # the lone byte 0x8b: no UTF-8 start
    ask = ScoreRequest(tuple(prompt_ids), tuple(good + stray + good + [s_tok.eos_token_id]))
    scored = CrossTokenizerBackend(teachers["nano384"], s_tok, t_tok).score([ask])[0].logprobs
    assert all(lp < 0 for lp in scored[:len(good)]) and scored[len(good):] == (0.0,) * (len(good) + 2)


def test_control_tokens_an_untrained_student_samples_are_content(tokenizers, teachers):
    """<|im_start|> inside a response (with no role, or `system` after the first turn) opens no turn."""
    s_tok, t_tok = tokenizers["nano"], tokenizers["nano384"]
    prompt_ids, _ = conversation(s_tok, ["go"])
    response = s_tok.encode("go<|im_start|>description& to<|im_start|>system\nthe ball<|im_end|>", add_special_tokens=False)
    backend = CrossTokenizerBackend(teachers["nano384"], s_tok, t_tok)
    assert [m.role for m in backend.messages(list(prompt_ids) + response)] == ["system", "user", "assistant"]
    scored = backend.score([ScoreRequest(tuple(prompt_ids), tuple(response))])[0]
    assert len(scored.logprobs) == len(response) and scored.valid() and scored.logprobs[0] < 0


def test_privileged_context_reaches_a_teacher_with_another_tokenizer(tokenizers, teachers):
    """c+ goes into the student's system turn (TeacherPromptBuilder on the student's tokens); the
    teacher reads it in its own tokens. Both tiny templates render ChatML alike, so the teacher's
    prompt is its tokenization of the student-side privileged prompt's text."""
    from actors.agent_loop import EpisodeTask, LoopConfig, run_episodes
    from actors.expert import DemonstrationPolicy
    from envs.babyai_text import BabyAITextEnv
    from envs.privileged import PrivilegedConfig, PrivilegedContext
    from teacher.privileged import TeacherPromptBuilder
    from teacher.service import ModelTeacher

    s_tok, t_tok = tokenizers["nano"], tokenizers["nano384"]
    loop = LoopConfig(max_turns=3)
    episode = run_episodes(BabyAITextEnv, [EpisodeTask("train", 3)], DemonstrationPolicy(s_tok, loop), loop)[0]
    builder = TeacherPromptBuilder(s_tok, BabyAITextEnv(), PrivilegedContext(PrivilegedConfig(map=True)), loop.prompt)
    backend = CrossTokenizerBackend(teachers["nano384"], s_tok, t_tok)
    scored = ModelTeacher(backend, builder).score_trajectories([episode.trajectory])[0]
    plain = ModelTeacher(backend).score_trajectories([episode.trajectory])[0]
    first = episode.trajectory.turns[0]
    privileged_text = s_tok.decode(builder.teacher_prompt(first.prompt_ids, episode.trajectory))
    assert "Map of the whole level" in privileged_text
    expected = teacher_logprob(t_tok, teachers["nano384"], privileged_text,
                               s_tok.decode(first.response_ids[:-1]), closed=True)
    assert math.isclose(sum(scored[0].logprobs), expected, rel_tol=1e-5, abs_tol=1e-4)
    assert scored != plain
