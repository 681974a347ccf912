"""Offline factory for tiny CPU models (the embedded default and the tests).

A byte-level BPE tokenizer is trained with `tokenizers` on the environment's own text:
BabyAI-Text missions and observations, the tool schemas and tool-call JSON, and whole
conversations rendered through the ChatML/Qwen3-style chat template shipped beside this
file. The model is a randomly initialised Qwen3-architecture causal LM (not qwen2: with a
custom tokenizer AutoTokenizer would swap in Qwen2Tokenizer and change the ids).

Everything is deterministic for (preset, seed) and saved with `save_pretrained` into
`<cache_dir>/tiny/<preset>-s<seed>-<fingerprint>`, built once (under a file lock, then
renamed into place, so concurrent processes never see a partial model) and loadable with AutoTokenizer/AutoModelForCausalLM offline.
Nothing is built at import time.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from cluster.files import default_cache_dir

FACTORY_VERSION = 2
"""Bump when the corpus or the saved layout changes: it is part of the cache key."""

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Control tokens: never produced by decoding with skip_special_tokens."""
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>")
"""Single tokens that stay in decoded text, as in Qwen3's vocabulary."""
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")


@dataclass(frozen=True)
class TinyPreset:
    """Shape of a tiny Qwen3 model."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 4096


PRESETS: dict[str, TinyPreset] = {
    # ~0.2M parameters: unit tests.
    "nano": TinyPreset(vocab_size=1024, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32),
    # nano with another tokenizer (a smaller vocabulary: words split differently): cross-tokenizer tests.
    "nano384": TinyPreset(vocab_size=384, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=32),
    # ~0.9M parameters, tiny's tokenizer: a learner step 1.8x faster than tiny's on 2 cores (docs/babyai_text.md).
    "mini": TinyPreset(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    # ~3.5M parameters: the embedded default.
    "tiny": TinyPreset(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    # tiny with nano384's tokenizer: the same teacher behind another tokenizer (benchmarks/cross_tokenizer.py).
    "tiny384": TinyPreset(vocab_size=384, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    # ~25M parameters: still trains on a CPU, for longer runs.
    "small": TinyPreset(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=64),
}


def tiny_model_dir(preset: str, seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """Directory of the tiny model (preset, seed), building it on first use."""
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny model preset {preset!r}; known: {sorted(PRESETS)}")
    spec = {"version": FACTORY_VERSION, "preset": asdict(PRESETS[preset]), "seed": seed,
            "template": CHAT_TEMPLATE_PATH.read_text()}
    fingerprint = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "tiny" / f"{preset}-s{seed}-{fingerprint}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (Ray actors start together); the others find the finished directory.
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
            try:
                build_tiny_model(PRESETS[preset], seed, staging)
                os.rename(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return target


def build_tiny_model(preset: TinyPreset, seed: int, out_dir: Path) -> None:
    """Train the tokenizer, initialise the model, save both to `out_dir`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    tokenizer = build_tokenizer(preset.vocab_size, seed)
    tokenizer.save_pretrained(out_dir)
    vocab = len(tokenizer)
    config = Qwen3Config(
        vocab_size=(vocab + 63) // 64 * 64,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        head_dim=preset.head_dim,
        max_position_embeddings=preset.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.eos_token_id = [config.eos_token_id, config.pad_token_id]
    model.generation_config.pad_token_id = config.pad_token_id
    # A one-shard progress bar is noise in a job's console (first use of a tiny model).
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out_dir)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def build_tokenizer(vocab_size: int, seed: int):
    """A byte-level BPE trained on rendered BabyAI-Text conversations, as a fast HF tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # GPT-2's split, except that `_` is a word character: identifiers such as tool names
    # (`turn_left`) can merge into one token, so a tiny student's choice of action is one
    # token rather than a sequence of fragments it could recombine into unknown names.
    words = Regex(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[\p{L}_]+| ?\p{N}+| ?[^\s\p{L}\p{N}_]+|\s+(?!\S)|\s+""")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(words, behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS) + list(MARKUP_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    # The markup tokens are single ids but must survive skip_special_tokens decoding.
    fast.add_tokens(list(MARKUP_TOKENS))
    fast.chat_template = CHAT_TEMPLATE_PATH.read_text()
    return fast


def training_corpus(seed: int, num_episodes: int = 400) -> list[str]:
    """Whole conversations from random-action BabyAI-Text episodes, rendered with the template."""
    import jinja2

    from envs.parser import ToolCallParser
    from envs.prompt import HistoryTurn, PromptConfig, render_messages
    from envs.registry import default_env_config, make_env

    env_ = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env_.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    env_.globals["raise_exception"] = _raise
    template = env_.from_string(CHAT_TEMPLATE_PATH.read_text())
    rng = random.Random(seed)
    env = make_env(default_env_config())
    parser = ToolCallParser(env.tools)
    names = [t["function"]["name"] for t in env.tools]
    config = PromptConfig(history_window="all")
    texts = []
    for episode in range(num_episodes):
        reset = env.reset(seed=episode, split="train")
        history: list[HistoryTurn] = []
        for _ in range(rng.randint(1, 8)):
            name = rng.choice(names)
            think = rng.choice([None, f"I should {name.replace('_', ' ')}."])
            text = (f"<think>\n{think}\n</think>\n\n" if think else "") + \
                f'<tool_call>\n{{"name": "{name}", "arguments": {{}}}}\n</tool_call>'
            if rng.random() < 0.1:
                text = rng.choice([name, f"I will {name}", text[:-5]])
            parsed = parser.parse(text)
            if parsed.call is None:
                history.append(HistoryTurn(text, None, parsed.error, None, history[-1].observation if history
                                           else reset.observation))
                continue
            step = env.step(parsed.call)
            history.append(HistoryTurn(text, parsed.call, parsed.error, parsed.think, step.observation))
            if step.done:
                break
        messages = render_messages(config, env.system_prompt, reset.task, reset.observation, history)
        texts.append(template.render(messages=messages, tools=env.tools, add_generation_prompt=False))
    return texts


def _raise(message: str) -> None:
    raise ValueError(message)
