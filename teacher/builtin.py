"""The teacher backends the project ships, registered with teacher.registry:

- `oracle`: the environment's expert, replayed on each task (teacher/oracle.py);
- `hf`: teacher.model as a transformers model in the service's process (teacher/backends.py);
- `vllm`: teacher.model in an in-process vLLM engine, prompt log-probs (teacher/backends.py);
- `remote`: an OpenAI-compatible server with vLLM's prompt log-probs (teacher/remote.py).

Model backends (hf, vllm) score in the teacher's own, possibly privileged, context
(`ModelTeacher`); their tokenizer is the student's, or with `teacher.cross_tokenizer` another one
(teacher/cross_tokenizer.py; for `remote`, teacher.model names the served model's tokenizer).
"""

from __future__ import annotations

from teacher.registry import BuildContext, TeacherBackendEntry, register_teacher_backend


def _oracle(config, ctx: BuildContext):
    from teacher.oracle import ExpertOracleTeacher

    return ExpertOracleTeacher(ctx.student_tokenizer, config.oracle, ctx.env)


def _model_teacher(config, ctx: BuildContext, backend, teacher_tokenizer):
    from envs.privileged import PrivilegedContext
    from teacher.privileged import TeacherPromptBuilder
    from teacher.service import ModelTeacher

    prompts = None
    if config.privileged.enabled:
        # Across tokenizers c+ goes into the student's ids, which the cross-tokenizer backend reads
        # back as turns and renders in the teacher's template, c+ with the system turn.
        tokenizer = ctx.student_tokenizer if config.cross_tokenizer else teacher_tokenizer
        prompts = TeacherPromptBuilder(tokenizer, ctx.env, PrivilegedContext(config.privileged), ctx.prompt)
    return ModelTeacher(backend, prompts)


def _teacher_tokenizer(config, ctx: BuildContext):
    from models.loading import load_tokenizer
    from teacher.service import check_same_tokenizer

    tokenizer = load_tokenizer(config.model)
    if not config.cross_tokenizer:
        check_same_tokenizer(ctx.student_tokenizer, tokenizer)
    return tokenizer


def _in_student_tokens(config, ctx: BuildContext, backend, tokenizer):
    """`backend` scores the teacher's tokens: across tokenizers, wrapped to score the student's."""
    if not config.cross_tokenizer:
        return backend
    from teacher.cross_tokenizer import CrossTokenizerBackend

    return CrossTokenizerBackend(backend, ctx.student_tokenizer, tokenizer)


def _hf(config, ctx: BuildContext):
    from models.loading import load_model
    from teacher.backends import HFTeacherBackend

    tokenizer = _teacher_tokenizer(config, ctx)
    backend = HFTeacherBackend(load_model(config.model), tokenizer.pad_token_id, config.max_batch_tokens)
    return _model_teacher(config, ctx, _in_student_tokens(config, ctx, backend, tokenizer), tokenizer)


def _vllm(config, ctx: BuildContext):
    from actors.vllm_engine import VLLMEngine
    from models.loading import resolve_model_dir
    from teacher.backends import VLLMTeacherBackend

    tokenizer = _teacher_tokenizer(config, ctx)
    engine = VLLMEngine(resolve_model_dir(config.model), config.vllm, [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    return _model_teacher(config, ctx, _in_student_tokens(config, ctx, VLLMTeacherBackend(engine), tokenizer),
                          tokenizer)


def _served_tokenizer(config, student_tokenizer):
    """The tokenizer the remote server must tokenise like: the student's, or across tokenizers
    the teacher's own (teacher.model names it)."""
    from models.loading import load_tokenizer

    return (load_tokenizer(config.model), "teacher.model tokenizer") if config.cross_tokenizer \
        else (student_tokenizer, "student")


def _remote(config, ctx: BuildContext):
    from teacher.remote import RemoteTeacherBackend

    tokenizer, whose = _served_tokenizer(config, ctx.student_tokenizer)  # checked against the server's
    backend = RemoteTeacherBackend(config.remote, tokenizer, whose)
    return _model_teacher(config, ctx, _in_student_tokens(config, ctx, backend, tokenizer), tokenizer)


def _check_remote(config, student_tokenizer) -> int | None:
    from teacher.remote import check_server

    return check_server(config.remote, *_served_tokenizer(config, student_tokenizer))[1] or None


register_teacher_backend("oracle", TeacherBackendEntry(_oracle, scores_text=False))
register_teacher_backend("hf", TeacherBackendEntry(_hf, loads_model=True, cross_tokenizer=True))
register_teacher_backend("vllm", TeacherBackendEntry(
    _vllm, loads_model=True, context_limit=lambda config: ("vllm.max_model_len", config.vllm.max_model_len),
    cross_tokenizer=True))
register_teacher_backend("remote", TeacherBackendEntry(_remote, check=_check_remote, cross_tokenizer=True))
