"""An environment's expert as an oracle teacher: a token-level distribution over canonical tool calls.

For turn k the environment is replayed from (split, seed) through the tool calls executed
in turns < k, and the expert (`TextEnv.expert()`, the BabyAI bot for BabyAI-Text), told of
each executed call as it goes, names the call a* it would make. The candidates are the
canonical responses R_a (`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` then the
end-of-turn token) of every argument-free tool, and of a* if it takes arguments. The teacher
is a mixture over those n responses, prior p(a*) = 1 - δ and δ/(n-1) for the others (uniform
when the expert has no plan), smoothed with ε over a vocabulary of size V:

    p_T(y_t | y_<t) = (1 - ε) * Σ_{a ∈ C_t, R_a[t] = y_t} p(a) / Σ_{a ∈ C_t} p(a)  +  ε / V,

where C_t = {a : R_a starts with y_<t and is longer than t} are the responses the student's
prefix still follows. So tokens that choose the expert's call get log-prob near 0, tokens that
choose another valid call about log(δ/(n-1)), formatting tokens of any valid call near 0, and
the token that leaves every valid call (free text, a <think> block, another spelling)
log(ε/V). After that token the expert has no model of the text: with `after_divergence:
no_opinion` (default) its log-prob is the behaviour log-prob, so the OPD advantage of those
tokens is 0 and only the divergent token is penalised; with `uniform` it is log(1/V), which
pushes down every later sampled token and so raises the student's entropy in exactly the
states it should learn to avoid.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from buffer.contracts import Trajectory
from envs.parser import format_tool_call
from envs.protocol import TextEnv, ToolCall
from teacher.backends import TokenScores


class OracleConfig(BaseModel):
    """Smoothing of the oracle teacher's distribution."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action_smoothing: float = Field(default=0.02, gt=0, lt=1)
    """δ: prior mass spread over the calls the expert did not choose."""
    token_smoothing: float = Field(default=1e-3, gt=0, lt=1)
    """ε: mass spread uniformly over the vocabulary at every position."""
    after_divergence: Literal["no_opinion", "uniform"] = "no_opinion"
    """Log-prob of tokens after the response left every valid call: the behaviour's, or 1/V."""


class ExpertOracleTeacher:
    """Scores trajectories with an environment's expert; needs the student's tokenizer and an
    environment built from the rollout's env config (so each replay is the task the student played)."""

    def __init__(self, tokenizer, config: OracleConfig, env: TextEnv, stop_token: str = "<|im_end|>") -> None:
        self.config = config
        self.env = env
        self.vocab_size = len(tokenizer)
        self.tokenizer = tokenizer
        self.stop_id = tokenizer.convert_tokens_to_ids(stop_token)
        argument_free = [tool["function"]["name"] for tool in env.tools
                         if not tool["function"].get("parameters", {}).get("properties")]
        self.responses = {name: self._response(ToolCall(name)) for name in argument_free}
        """Canonical response token ids of every argument-free tool, by tool name."""

    def _response(self, call: ToolCall) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(format_tool_call(call), add_special_tokens=False)) + (self.stop_id,)

    def expert_calls(self, trajectory: Trajectory) -> list[ToolCall | None]:
        return expert_calls(self.env, trajectory)

    def token_logprobs(self, response_ids: tuple[int, ...], expert_call: ToolCall | None,
                       behaviour_logprobs: tuple[float, ...] | None = None) -> tuple[float, ...]:
        """log p_T of each response token given the expert's call (see the module docstring);
        `behaviour_logprobs` are needed with `after_divergence: no_opinion`."""
        return self.token_scores(response_ids, expert_call, behaviour_logprobs).logprobs

    def token_scores(self, response_ids: tuple[int, ...], expert_call: ToolCall | None,
                     behaviour_logprobs: tuple[float, ...] | None = None, top_k: int = 0) -> TokenScores:
        """`token_logprobs`, and with top_k > 0 the k most likely next tokens at each position: the
        tokens the still-followed canonical responses continue with, by mass (-1 pads; a position
        after the response left every valid call has no candidates)."""
        responses = dict(self.responses)
        best_key = None
        if expert_call is not None:
            best_key = expert_call.name if not expert_call.arguments else format_tool_call(expert_call)
            if best_key not in responses:
                responses[best_key] = self._response(expert_call)
        n = len(responses)
        delta = self.config.action_smoothing
        prior = {a: (1 - delta if a == best_key else delta / (n - 1)) if best_key else 1 / n for a in responses}
        eps, uniform = self.config.token_smoothing, 1.0 / self.vocab_size
        alive = set(responses)
        out, topk_ids, topk_lps = [], [], []
        for t, y in enumerate(response_ids):
            alive = {a for a in alive if len(responses[a]) > t}
            if top_k:
                total = sum(prior[a] for a in alive)
                mass: dict[int, float] = {}
                for a in alive:
                    mass[responses[a][t]] = mass.get(responses[a][t], 0.0) + prior[a] / total
                best = sorted(mass.items(), key=lambda item: (-item[1], item[0]))[:top_k]
                pad = top_k - len(best)
                topk_ids.append(tuple(token for token, _ in best) + (-1,) * pad)
                topk_lps.append(tuple(math.log((1 - eps) * m + eps * uniform) for _, m in best) + (0.0,) * pad)
            if not alive:
                if self.config.after_divergence == "uniform":
                    out.append(math.log(uniform))
                elif behaviour_logprobs is None:
                    raise ValueError("after_divergence=no_opinion needs the behaviour log-probs of the response")
                else:
                    out.append(behaviour_logprobs[t])
                continue
            total = sum(prior[a] for a in alive)
            match = sum(prior[a] for a in alive if responses[a][t] == y)
            out.append(math.log((1 - eps) * match / total + eps * uniform))
            alive = {a for a in alive if responses[a][t] == y}
        if not top_k:
            return TokenScores(tuple(out))
        return TokenScores(tuple(out), tuple(topk_ids), tuple(topk_lps))

    def score_trajectories(self, trajectories: list[Trajectory], top_k: int = 0) -> list[list[TokenScores]]:
        """Teacher scores per turn of each trajectory."""
        return [[self.token_scores(turn.response_ids, call, turn.behaviour_logprobs, top_k) if turn.trainable
                 else TokenScores.unscored(len(turn.response_ids), top_k)  # replayed (TCOD-B2F): never trained
                 for turn, call in zip(t.turns, self.expert_calls(t))] for t in trajectories]


def expert_calls(env: TextEnv, trajectory: Trajectory) -> list[ToolCall | None]:
    """The expert's call at the start of each turn of `trajectory`, replaying its executed calls
    in `env` (built from the rollout's env config); None where the expert has no plan."""
    env.reset(trajectory.task_seed, trajectory.split)
    expert = env.expert()
    if expert is None:
        raise ValueError(f"an oracle needs an environment with an expert; {type(env).__name__} has none")
    suggestion: ToolCall | None = None
    executed: ToolCall | None = None
    first = True
    calls = []
    for turn in trajectory.turns:
        if expert is not None and (first or executed is not None):
            suggestion = expert.act(executed)
        first = False
        calls.append(suggestion)
        executed = None
        if turn.executed_call is not None:
            executed = ToolCall.from_json(turn.executed_call)
            if env.step(executed).done:
                expert = None
    return calls
