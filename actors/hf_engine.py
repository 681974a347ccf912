"""HF transformers inference engine (CPU or CUDA): left-padded batched generation."""

from __future__ import annotations

import torch

from actors.engine import Generation, SamplingConfig


class HFEngine:
    """Generates with a `transformers` causal LM; all prompts of a call share one batch.

    Seeded sampling draws from the engine's own random stream, seeded once from
    (`SamplingConfig.seed`, `seed_offset`) at the first seeded call and continued by every later
    one: two rounds differ, two engines built alike give the same rounds, and the process's global
    RNG is left as it was. (Re-seeding the global RNG on every call would reuse the same noise.)
    """

    def __init__(self, model, pad_token_id: int, stop_token_ids: list[int], version: int = 0,
                 seed_offset: int = 0) -> None:
        if not stop_token_ids:
            raise ValueError("stop_token_ids must name at least one end-of-turn token")
        self.model = model
        self.pad_token_id = pad_token_id
        self.stop_token_ids = list(stop_token_ids)
        self._version = version
        self.seed_offset = seed_offset
        self._rng_state: torch.Tensor | None = None
        """State of the engine's random stream (the device's generator), None before the first seeded call."""

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

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingConfig):
        greedy = sampling.temperature == 0.0
        return self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
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
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        if sampling.seed is None:
            out = self._generate(input_ids, attention_mask, sampling)
        else:
            cuda = self.device.type == "cuda"
            with torch.random.fork_rng(devices=[self.device] if cuda else []):
                if self._rng_state is None:
                    torch.manual_seed(sampling.seed * 1_000_003 + self.seed_offset)
                else:
                    (torch.cuda.set_rng_state if cuda else torch.set_rng_state)(self._rng_state)
                out = self._generate(input_ids, attention_mask, sampling)
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
        return results
