"""Scoring the student's tokens with a teacher whose tokenizer differs (docs/algorithms.md §9).

The student's request (ids of its prompt and response, in its own tokenizer) is read back as a
conversation, the teacher scores it in its own terms, and the teacher's per-token log-probs are
mapped back onto the student's tokens:

    student ids --(student's ChatML)--> messages --(teacher's chat template)--> teacher prompt ids
    student response bytes --(teacher's tokenizer)--> teacher response ids --(teacher)--> log-probs
    teacher log-probs --(byte spans, last-byte rule)--> one log-prob per student token

The last-byte rule: each teacher token's log-prob goes to the student token that holds the
teacher token's last byte. Every teacher token lands on exactly one student token, so the sum
over a response (or over any stretch whose ends are boundaries of both tokenizations) is the
teacher's log-prob of that text; a student token where no teacher token ends gets 0, and the
log-prob of a teacher token that spans several student tokens lands on the last of them. A
student turn closed by its end-of-turn token gets the teacher's log-prob of its own end of turn
(`eos_token`) there.

Each assistant turn is scored after the conversation before it rendered by the teacher's template
with the generation prompt, so the teacher sees what it would see acting itself; turns whose
teacher prompt extends the previous turn's are one forward pass (`_runs`). Top-k is refused: the
teacher's k best tokens are ids of another vocabulary.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from teacher.backends import ScoreRequest, TeacherBackend, TokenScores


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, printable character -> byte (the inverse of bytes_to_unicode)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenBytes:
    """The bytes of each token id of one byte-level BPE tokenizer (Qwen, Llama 3, GPT-2, the tiny one)."""

    def __init__(self, tokenizer) -> None:
        decoder = getattr(tokenizer, "backend_tokenizer", None)
        decoder = None if decoder is None else decoder.decoder
        if type(decoder).__name__ != "ByteLevel":
            raise ValueError(f"cross-tokenizer scoring reads byte-level BPE tokenizers (Qwen, Llama 3, GPT-2); "
                             f"{type(tokenizer).__name__} decodes with {type(decoder).__name__}")
        self.tokenizer = tokenizer
        self._added = {i: t.content.encode() for i, t in tokenizer.added_tokens_decoder.items()}
        self._bytes = _byte_decoder()

    def __call__(self, ids) -> list[bytes]:
        pieces = self.tokenizer.convert_ids_to_tokens(list(ids))
        # An id past the tokenizer (a model's embedding rows are padded, and an untrained one
        # samples them) has no text: no bytes, and the mapping gives it 0.
        return [self._added[i] if i in self._added else b"" if piece is None else bytes(self._bytes[c] for c in piece)
                for i, piece in zip(ids, pieces)]


def spans(pieces: list[bytes]) -> list[tuple[int, int]]:
    """[start, end) byte offsets of consecutive pieces."""
    out, at = [], 0
    for piece in pieces:
        out.append((at, at + len(piece)))
        at += len(piece)
    return out


def map_logprobs(student: list[tuple[int, int]], teacher: list[tuple[int, int]],
                 teacher_logprobs: list[float]) -> list[float]:
    """One log-prob per student token (byte spans `student`) from the teacher's tokens (byte spans
    `teacher` over the same bytes) by the last-byte rule (module docstring)."""
    if (student[-1][1] if student else 0) != (teacher[-1][1] if teacher else 0):
        raise ValueError(f"student and teacher tokens cover {student[-1][1] if student else 0} and "
                         f"{teacher[-1][1] if teacher else 0} bytes: not the same text")
    out = [0.0] * len(student)
    s = 0
    for (_, end), logprob in zip(teacher, teacher_logprobs):
        if end == 0:
            continue
        while student[s][1] < end:  # both cover the same bytes in order: s only moves forward
            s += 1
        out[s] += logprob
    return out


def _text_prefix(data: bytes) -> bytes:
    """`data` up to its first byte that is not UTF-8 text: a response cut at max_new_tokens inside a
    character, or an untrained student's stray byte tokens. The teacher reads text, so the student
    tokens of the rest get 0 (which reverse KL reads as the teacher agreeing: a stated limit)."""
    try:
        data.decode()
        return data
    except UnicodeDecodeError as exc:
        return data[:exc.start]


@dataclass(frozen=True)
class _Message:
    role: str
    content: bytes
    start: int
    """Index of the first student token of the content (in the request's prompt + response)."""
    stop: int
    """One past the last content token (the end-of-turn token, when there is one, is at `stop`)."""
    closed: bool


class CrossTokenizerBackend:
    """A TeacherBackend in the student's tokens over `inner`, which scores the teacher's tokens."""

    def __init__(self, inner: TeacherBackend, student_tokenizer, teacher_tokenizer) -> None:
        self.inner = inner
        self.student, self.teacher = student_tokenizer, teacher_tokenizer
        self.student_bytes, self.teacher_bytes = TokenBytes(student_tokenizer), TokenBytes(teacher_tokenizer)
        self.im_start = student_tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.im_end = student_tokenizer.convert_tokens_to_ids("<|im_end|>")
        if self.im_start is None or self.im_start == student_tokenizer.unk_token_id or self.im_end is None:
            raise ValueError("cross-tokenizer scoring reads the student's turns in ChatML (<|im_start|>role ... "
                             "<|im_end|>, the Qwen format); the student's tokenizer has no <|im_start|> token")
        if teacher_tokenizer.eos_token_id is None or teacher_tokenizer.chat_template is None:
            raise ValueError("cross-tokenizer scoring renders the conversation with the teacher's chat template and "
                             "scores its end of turn (eos_token): the teacher's tokenizer lacks one of them")

    def _role_at(self, ids: list[int], i: int, first: bool) -> tuple[str, int] | None:
        """(role, index of the content's first token) when ids[i] opens a turn: <|im_start|>, a role
        the template renders there, a newline. None: an <|im_start|> an untrained student sampled
        inside its response, which is content."""
        j, head = i + 1, b""
        while j < len(ids) and b"\n" not in head and len(head) < 16:
            head += self.student_bytes([ids[j]])[0]
            j += 1
        role = head[:-1].decode(errors="replace")
        if head.endswith(b"\n") and (role in ("user", "assistant") or (role == "system" and first)):
            return role, j
        return None

    def messages(self, ids: list[int]) -> list[_Message]:
        """The ChatML turns of the student's ids, each with its content's token range. A turn ends at
        <|im_end|> or where the next turn opens; tokens between turns belong to none."""
        out, i = [], 0
        while i < len(ids):
            opened = self._role_at(ids, i, not out) if ids[i] == self.im_start else None
            if opened is None:
                i += 1
                continue
            role, start = opened
            stop = start
            while stop < len(ids) and ids[stop] != self.im_end and \
                    not (ids[stop] == self.im_start and self._role_at(ids, stop, False)):
                stop += 1
            closed = stop < len(ids) and ids[stop] == self.im_end
            out.append(_Message(role, b"".join(self.student_bytes(ids[start:stop])), start, stop, closed))
            i = stop + closed
        return out

    def _teacher_ids(self, text: str) -> list[int]:
        return self.teacher.encode(text, add_special_tokens=False)

    def _turn(self, ids: list[int], m: _Message, num_prompt: int, history: list[dict[str, str]]):
        """The teacher's request for the scored part of assistant turn `m` (None when it holds no
        text), and where its log-probs go: (first student index, end-of-turn index or None, student
        byte spans, teacher byte spans)."""
        first = max(m.start, num_prompt)  # a generation prefix in the student's prompt stays context
        before = b"".join(self.student_bytes(ids[m.start:first])).decode(errors="replace")
        scored = self.student_bytes(ids[first:m.stop])
        whole = b"".join(scored)
        text = _text_prefix(whole)
        student_spans = [(a, min(b, len(text))) for a, b in spans(scored) if a < len(text)]
        response = self._teacher_ids(text.decode())
        teacher_pieces = self.teacher_bytes(response)
        if b"".join(teacher_pieces) != text:
            raise ValueError("the teacher's tokenizer changes the text it encodes (a normalizer): its log-probs "
                             "cannot be mapped onto the student's bytes")
        end = m.stop if m.closed and text == whole else None  # an end of turn after unread bytes gets 0
        if end is not None:
            response.append(self.teacher.eos_token_id)
        if not response:
            return None, None
        prompt = self._teacher_ids(self.teacher.apply_chat_template(history, add_generation_prompt=True,
                                                                    tokenize=False) + before)
        return ScoreRequest(tuple(prompt), tuple(response)), (first, end, student_spans, spans(teacher_pieces))

    def score(self, requests: list[ScoreRequest], top_k: int = 0) -> list[TokenScores]:
        if top_k:
            raise ValueError("teacher.top_k > 0 across tokenizers: the teacher's top-k tokens are ids of another "
                             "vocabulary; set teacher.top_k=0 and learner.algorithm.topk_kl_coef=0")
        asks, plans = [], []
        for request in requests:
            ids, turns, history = list(request.prompt_ids) + list(request.response_ids), [], []
            for m in self.messages(ids):
                if m.role == "assistant" and m.stop + m.closed > len(request.prompt_ids):
                    ask, where = self._turn(ids, m, len(request.prompt_ids), history)
                    if ask is not None:
                        turns.append((ask, where))
                history.append({"role": m.role, "content": m.content.decode(errors="replace")})
            merged, placed = _nest(turns)
            plans.append([(len(asks) + index, offset, where) for index, offset, where in placed])
            asks.extend(merged)
        scores = self.inner.score(asks, 0) if asks else []
        out = []
        for request, plan in zip(requests, plans):
            logprobs = [0.0] * (len(request.prompt_ids) + len(request.response_ids))
            for index, offset, (first, end, student_spans, teacher_spans) in plan:
                got = scores[index].logprobs[offset:offset + len(teacher_spans) + (end is not None)]
                mapped = map_logprobs(student_spans, teacher_spans, list(got[:len(teacher_spans)]))
                logprobs[first:first + len(mapped)] = mapped
                if end is not None:
                    logprobs[end] = got[-1]
            out.append(TokenScores(tuple(logprobs[len(request.prompt_ids):])))
        return out


def _runs(turns: list) -> list[list[int]]:
    """Consecutive turns whose teacher prompt extends the previous turn's prompt + response: one
    forward pass scores a run (as ModelTeacher nests the student's turns), O(n) teacher tokens per
    episode instead of O(n^2). The teacher's template renders history as a prefix for ChatML-like
    templates; where it does not (a template that rewrites earlier turns), turns stay apart."""
    runs: list[list[int]] = []
    for k, (ask, _) in enumerate(turns):
        if runs:
            last = turns[runs[-1][-1]][0]
            full = last.prompt_ids + last.response_ids
            if ask.prompt_ids[:len(full)] == full:
                runs[-1].append(k)
                continue
        runs.append([k])
    return runs


def _nest(turns: list) -> tuple[list[ScoreRequest], list[tuple[int, int, tuple]]]:
    """One request per run of nesting turns (the first turn's prompt, then everything to the last's
    end), and for each turn: (index of its run's request, offset of its response in that request's
    response, where its log-probs go)."""
    merged, placed = [], []
    for r, run in enumerate(_runs(turns)):
        first, last = turns[run[0]][0], turns[run[-1]][0]
        full = last.prompt_ids + last.response_ids
        merged.append(ScoreRequest(first.prompt_ids, full[len(first.prompt_ids):]))
        placed += [(r, len(turns[k][0].prompt_ids) - len(first.prompt_ids), turns[k][1]) for k in run]
    return merged, placed
