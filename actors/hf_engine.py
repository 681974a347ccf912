"""HF transformers inference engine (CPU or CUDA): left-padded batched generation that keeps
the KV cache of its last batch, so a multi-turn episode's next turn prefills only what the
turn added (the tool response and the next header), not its whole history.

KV reuse. After a call the engine keeps the model's KV cache [rows, columns], the attention
mask over its columns and, per row, the tokens whose keys it holds (prompt + response; the
last sampled token is never in the cache). A new prompt is matched to the cached row with the
longest common token prefix; that row's columns past the match are masked out (a finished
row's padding, or a diverging tail), and only the rest of the prompt is fed, left-padded into
one new segment. Positions follow the mask (cumulative count of attended columns), so a
reused row sees exactly the positions and keys a fresh prefill of the same tokens would.
Reuse is taken when it feeds at most half the tokens a fresh prefill would and the cache
(live columns plus masked ones) stays under twice the fresh width; otherwise, and after every
weight update (the old keys belong to the old policy), the batch is prefilled afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from actors.engine import Generation, SamplingConfig


@dataclass
class _KVState:
    cache: Any
    """The model's KV cache after the last call (a transformers Cache), one row per `tokens` entry."""
    mask: torch.Tensor
    """1 on the cache columns that hold a row's valid tokens, shape [num_rows, num_columns]."""
    tokens: list[np.ndarray]
    """Per row, the tokens whose keys the cache holds, in order (prompt + response so far)."""


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class HFEngine:
    """Generates with a `transformers` causal LM; all prompts of a call share one batch.

    Seeded sampling draws from the engine's own random stream, seeded once from
    (`SamplingConfig.seed`, `seed_offset`) at the first seeded call and continued by every later
    one: two rounds differ, two engines built alike give the same rounds, and the process's global
    RNG is left as it was. (Re-seeding the global RNG on every call would reuse the same noise.)
    """

    def __init__(self, model, pad_token_id: int, stop_token_ids: list[int], version: int = 0,
                 seed_offset: int = 0, reuse_kv: bool = True) -> None:
        if not stop_token_ids:
            raise ValueError("stop_token_ids must name at least one end-of-turn token")
        self.model = model
        self.pad_token_id = pad_token_id
        self.stop_token_ids = list(stop_token_ids)
        self._version = version
        self.seed_offset = seed_offset
        self._rng_state: torch.Tensor | None = None
        """State of the engine's random stream (the device's generator), None before the first seeded call."""
        self.reuse_kv = reuse_kv
        self._kv: _KVState | None = None
        self.num_prefill_tokens = 0
        """Prompt tokens fed through the model so far (reused ones excluded): the cost KV reuse saves."""

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load full weights in place (HF names); later generations are tagged `version`."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        # Tied embeddings may arrive under either name; anything else missing is an error.
        missing = [k for k in missing if k != "lm_head.weight" or not self.model.config.tie_word_embeddings]
        if missing or unexpected:
            raise ValueError(f"weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self._version = version
        self._kv = None

    def close(self) -> None:
        self._kv = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache, sampling: SamplingConfig):
        greedy = sampling.temperature == 0.0
        return self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            past_key_values=cache,
            use_cache=True,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.pad_token_id,
            output_scores=True,
            return_dict_in_generate=True,
        )

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        input_ids, attention_mask, cache = self._inputs([np.asarray(p, dtype=np.int64) for p in prompts])
        width = input_ids.shape[1]
        if sampling.seed is None:
            out = self._generate(input_ids, attention_mask, cache, sampling)
        else:
            cuda = self.device.type == "cuda"
            with torch.random.fork_rng(devices=[self.device] if cuda else []):
                if self._rng_state is None:
                    torch.manual_seed(sampling.seed * 1_000_003 + self.seed_offset)
                else:
                    (torch.cuda.set_rng_state if cuda else torch.set_rng_state)(self._rng_state)
                out = self._generate(input_ids, attention_mask, cache, sampling)
                self._rng_state = torch.cuda.get_rng_state(self.device) if cuda else torch.get_rng_state()
        new_tokens = out.sequences[:, width:].cpu()
        # Scores are the logits after temperature/top-p: their log-softmax is the sampling distribution.
        logprobs = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1).cpu()
        token_logprobs = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        stops = set(self.stop_token_ids)
        results = []
        for row in range(len(prompts)):
            ids = new_tokens[row].tolist()
            end = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
            finish = "stop" if end is not None else "length"
            end = end if end is not None else len(ids)
            results.append(Generation(token_ids=tuple(ids[:end]),
                                      logprobs=tuple(token_logprobs[row, :end].tolist()),
                                      finish_reason=finish))
        if self.reuse_kv:
            self._keep(prompts, attention_mask, new_tokens, results, out.past_key_values)
        return results

    def _inputs(self, prompts: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """(input ids, attention mask, cache or None): a reuse of the kept cache where it pays, else a
        fresh left-padded batch."""
        fresh_width = max(len(p) for p in prompts)
        kv = self._kv
        if kv is not None:
            rows, kept = [], []
            for prompt in prompts:
                matches = [_common_prefix(t, prompt) for t in kv.tokens]
                best = int(np.argmax(matches))
                rows.append(best)
                kept.append(min(matches[best], len(prompt) - 1))  # at least one token is fed
            segment = max(len(p) - k for p, k in zip(prompts, kept))
            columns = kv.mask.shape[1]
            if segment <= fresh_width // 2 and columns + segment <= 2 * fresh_width:
                index = torch.tensor(rows)
                mask = kv.mask[index]
                mask = mask * (mask.cumsum(-1) <= torch.tensor(kept)[:, None])
                ids = torch.full((len(prompts), columns + segment), self.pad_token_id, dtype=torch.long)
                mask = torch.cat([mask, torch.zeros((len(prompts), segment), dtype=torch.long)], dim=1)
                for row, (prompt, k) in enumerate(zip(prompts, kept)):
                    ids[row, columns + segment - (len(prompt) - k):] = torch.from_numpy(prompt[k:])
                    mask[row, columns + segment - (len(prompt) - k):] = 1
                kv.cache.batch_select_indices(index.to(self.device))
                self._kv = None
                self.num_prefill_tokens += sum(len(p) - k for p, k in zip(prompts, kept))
                return ids, mask, kv.cache
        self._kv = None
        ids = torch.full((len(prompts), fresh_width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), fresh_width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, fresh_width - len(prompt):] = torch.from_numpy(prompt)
            mask[row, fresh_width - len(prompt):] = 1
        self.num_prefill_tokens += sum(len(p) for p in prompts)
        return ids, mask, None

    def _keep(self, prompts, attention_mask: torch.Tensor, new_tokens: torch.Tensor,
              results: list[Generation], cache) -> None:
        """Remember the cache of this call: every generated column but the last is in it; a row's
        columns past its own stop token hold padding and are masked."""
        num_cached = new_tokens.shape[1] - 1
        generated = torch.zeros((len(prompts), num_cached), dtype=torch.long)
        tokens = []
        for row, (prompt, g) in enumerate(zip(prompts, results)):
            n = min(len(g.token_ids), num_cached)
            generated[row, :n] = 1
            tokens.append(np.asarray(list(prompt) + list(g.token_ids[:n]), dtype=np.int64))
        mask = torch.cat([attention_mask, generated], dim=1)
        assert cache.get_seq_length() == mask.shape[1], (cache.get_seq_length(), mask.shape)
        self._kv = _KVState(cache, mask, tokens)
