"""The offline tiny-model factory and model loading."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from envs.babyai_text import BabyAITextEnv
from envs.parser import ToolCallParser
from models.loading import ModelConfig, load_model, load_tokenizer, resolve_model_dir
from models.tiny import MARKUP_TOKENS, SPECIAL_TOKENS, tiny_model_dir

MESSAGES = [
    {"role": "system", "content": "Rules."},
    {"role": "user", "content": "Your task: go to the red ball"},
    {"role": "assistant", "content": "", "reasoning_content": "The ball is ahead.",
     "tool_calls": [{"type": "function", "function": {"name": "go_forward", "arguments": {}}}]},
    {"role": "tool", "content": "You see a red ball 1 step forward"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "turn_left",
                                                                                         "arguments": {}}}]},
    {"role": "tool", "content": "You see a wall 1 step forward"},
]


@pytest.fixture(scope="module")
def nano():
    return ModelConfig(path="tiny:nano")


def test_tokenizer_and_model_load(nano):
    tok = load_tokenizer(nano)
    model = load_model(nano)
    assert model.config.model_type == "qwen3"
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    assert model.config.vocab_size >= len(tok)
    for token in SPECIAL_TOKENS + MARKUP_TOKENS:
        assert len(tok.encode(token, add_special_tokens=False)) == 1, token
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # Markup survives decoding with skip_special_tokens; control tokens do not.
    ids = tok.encode('<|im_start|><tool_call>\n{"name": "drop"}\n</tool_call><|im_end|>', add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == '<tool_call>\n{"name": "drop"}\n</tool_call>'


def test_tool_names_are_single_tokens(nano):
    # `_` joins words, so a tool name is one id: the student picks an action with one token.
    tok = load_tokenizer(nano)
    for tool in BabyAITextEnv().tools:
        name = tool["function"]["name"]
        ids = tok.encode(f'{{"name": "{name}", "arguments": {{}}}}', add_special_tokens=False)
        assert name in [tok.decode([i]).strip(' "') for i in ids], [tok.decode([i]) for i in ids]
    text = "You see a red ball 2 steps left and 1 step forward\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_tiny_preset_size():
    model = load_model(ModelConfig(path="tiny:tiny"))
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 5_000_000


def test_chat_template_renders_the_qwen3_structure(nano):
    tok = load_tokenizer(nano)
    env = BabyAITextEnv()
    text = tok.apply_chat_template(MESSAGES, tools=env.tools, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nRules.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(env.tools[0]) + "\n" in text
    assert ('<|im_start|>assistant\n<think>\nThe ball is ahead.\n</think>\n\n<tool_call>\n'
            '{"name": "go_forward", "arguments": {}}\n</tool_call><|im_end|>\n') in text
    assert "<|im_start|>user\n<tool_response>\nYou see a red ball 1 step forward\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    no_think = tok.apply_chat_template(MESSAGES[:2], add_generation_prompt=True, tokenize=False,
                                       enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # What the template writes for a call, the parser accepts.
    block = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert ToolCallParser(env.tools).parse(block).call.name == "go_forward"
    # Text round-trips through the tokenizer exactly.
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_deterministic_for_a_seed(tmp_path):
    a = tiny_model_dir("nano", seed=3, cache_dir=tmp_path / "a")
    b = tiny_model_dir("nano", seed=3, cache_dir=tmp_path / "b")
    c = tiny_model_dir("nano", seed=4, cache_dir=tmp_path / "c")
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    wa, wb, wc = (load_file(d / "model.safetensors") for d in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    # Built once: a second call returns the cached directory untouched.
    mtime = (a / "config.json").stat().st_mtime_ns
    assert tiny_model_dir("nano", seed=3, cache_dir=tmp_path / "a") == a
    assert (a / "config.json").stat().st_mtime_ns == mtime
    assert not [p for p in (tmp_path / "a" / "tiny").iterdir() if p.name.startswith(".") and p.is_dir()]


def test_loads_offline_with_auto_classes_in_a_fresh_process(nano):
    directory = resolve_model_dir(nano)
    code = ("import sys; from transformers import AutoTokenizer, AutoModelForCausalLM;"
            "t = AutoTokenizer.from_pretrained(sys.argv[1]); m = AutoModelForCausalLM.from_pretrained(sys.argv[1]);"
            "print(m.config.model_type, len(t), t.encode('You see a red ball 2 steps forward'))")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code, str(directory)], env=env, capture_output=True, text=True,
                         check=True)
    model_type, size, ids = out.stdout.split(" ", 2)
    tok = load_tokenizer(nano)
    assert model_type == "qwen3" and int(size) == len(tok)
    assert json.loads(ids) == tok.encode("You see a red ball 2 steps forward")


def test_a_real_hf_directory_with_its_own_template(tmp_path, nano):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = load_tokenizer(nano)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok.save_pretrained(tmp_path)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    cfg = ModelConfig(path=str(tmp_path))
    loaded = load_tokenizer(cfg)
    text = loaded.apply_chat_template(MESSAGES[:2], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nRules.<|im_end|>\n<|im_start|>user\nYour task: go to the red ball<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    model = load_model(cfg)
    assert model.config.model_type == "qwen3" and model.config.hidden_size == 32


def test_loading_errors_are_clear(tmp_path, nano):
    with pytest.raises(ValueError, match="unknown tiny preset"):
        resolve_model_dir(ModelConfig(path="tiny:huge"))
    with pytest.raises(ValueError, match="not a local model directory"):
        resolve_model_dir(ModelConfig(path=str(tmp_path / "models" / "Qwen3-14B")))
    tok = load_tokenizer(nano)
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    for name in ("chat_template.jinja",):
        if (tmp_path / name).exists():
            (tmp_path / name).unlink()
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(ModelConfig(path=str(tmp_path)))


def test_a_hub_name_resolves_through_the_hugging_face_cache(tmp_path, nano, monkeypatch):
    """A hub-layout cache built from the tiny model (models--org--name/snapshots/<rev>, refs/main)."""
    import shutil

    import huggingface_hub.constants

    from models.loading import fetch_model

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-Nano" / "snapshots" / "0123abcd"
    shutil.copytree(resolve_model_dir(nano), snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hub = ModelConfig(path="Qwen/Qwen3-Nano", dtype="bfloat16")
    assert resolve_model_dir(hub) == snapshot and fetch_model(hub) == snapshot
    assert load_tokenizer(hub).encode("go to the red ball") == load_tokenizer(nano).encode("go to the red ball")
    assert load_model(hub).dtype == torch.bfloat16
    # Absent and offline: refused before anything loads, naming the cache it looked in.
    for resolve in (resolve_model_dir, fetch_model):
        with pytest.raises(ValueError, match=r"'Qwen/Qwen3-14B': not in the Hugging Face cache .*hub \(offline"):
            resolve(ModelConfig(path="Qwen/Qwen3-14B"))
