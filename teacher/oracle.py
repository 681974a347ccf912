"""The BabyAI bot as an oracle teacher: a token-level distribution over canonical tool calls.

For turn k the environment is replayed from (split, seed) through the tool calls executed
in turns < k, and the BabyAI bot, advised of each executed action as it goes, names the
action a* it would take. Let R_a be the token ids of the canonical response for tool a
(`<tool_call>\n{"name": a, "arguments": {}}\n</tool_call>` then the end-of-turn token).
The teacher is a mixture over those six responses, prior p(a*) = 1 - δ and δ/5 for the
others (uniform when the bot has no action), smoothed with ε over a vocabulary of size V:

    p_T(y_t | y_<t) = (1 - ε) * Σ_{a ∈ C_t, R_a[t] = y_t} p(a) / Σ_{a ∈ C_t} p(a)  +  ε / V,

where C_t = {a : R_a starts with y_<t and is longer than t} are the responses the student's
prefix still follows. So tokens that choose the bot's action get log-prob near 0, tokens that
choose another valid action about log(δ/5), formatting tokens of any valid call near 0, and
the token that leaves every valid call (free text, a <think> block, another spelling)
log(ε/V). After that token the bot has no model of the text: with `after_divergence:
no_opinion` (default) its log-prob is the behaviour log-prob, so the OPD advantage of those
tokens is 0 and only the divergent token is penalised; with `uniform` it is log(1/V), which
pushes down every later sampled token and so raises the student's entropy in exactly the
states it should learn to avoid.
"""

from __future__ import annotations

import json
import math
from typing import Literal

from minigrid.utils.baby_ai_bot import DisappearedBoxError
from pydantic import BaseModel, ConfigDict, Field

from buffer.contracts import Trajectory
from envs.babyai_text import BabyAIExpert, BabyAITextConfig, BabyAITextEnv
from envs.babyai_text.env import ACTION_TOOLS
from envs.parser import format_tool_call
from envs.protocol import ToolCall
from teacher.backends import TokenScores


class OracleConfig(BaseModel):
    """Smoothing of the oracle teacher's distribution."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action_smoothing: float = Field(default=0.02, gt=0, lt=1)
    """δ: prior mass spread over the actions the bot did not choose."""
    token_smoothing: float = Field(default=1e-3, gt=0, lt=1)
    """ε: mass spread uniformly over the vocabulary at every position."""
    after_divergence: Literal["no_opinion", "uniform"] = "no_opinion"
    """Log-prob of tokens after the response left every valid call: the behaviour's, or 1/V."""


class BabyAIOracleTeacher:
    """Scores BabyAI-Text trajectories with the bot; needs the student's tokenizer."""

    def __init__(self, tokenizer, config: OracleConfig, env_config: BabyAITextConfig | None = None,
                 stop_token: str = "<|im_end|>") -> None:
        self.config = config
        self.env = BabyAITextEnv(env_config)
        self.vocab_size = len(tokenizer)
        stop = tokenizer.convert_tokens_to_ids(stop_token)
        self.responses = {name: tuple(tokenizer.encode(format_tool_call(ToolCall(name)), add_special_tokens=False))
                          + (stop,) for name, _ in ACTION_TOOLS}

    def bot_actions(self, trajectory: Trajectory) -> list[str | None]:
        """The bot's action at the start of each turn, replaying the executed calls."""
        self.env.reset(trajectory.task_seed, trajectory.split)
        expert = BabyAIExpert(self.env)
        suggestion: str | None = None
        pending: str | None = None
        first = True
        actions = []
        for turn in trajectory.turns:
            if expert is not None and (first or pending is not None):
                try:
                    suggestion = expert.act(pending)
                except DisappearedBoxError:
                    # The student opened a box the bot needed: it has no plan any more.
                    expert, suggestion = None, None
            first = False
            actions.append(suggestion)
            pending = None
            if turn.executed_call is not None:
                call = json.loads(turn.executed_call)
                step = self.env.step(ToolCall(call["name"], call["arguments"]))
                pending = call["name"]
                if step.done:
                    expert = None
        return actions

    def token_logprobs(self, response_ids: tuple[int, ...], bot_action: str | None,
                       behaviour_logprobs: tuple[float, ...] | None = None) -> tuple[float, ...]:
        """log p_T of each response token given the bot's action (see the module docstring);
        `behaviour_logprobs` are needed with `after_divergence: no_opinion`."""
        return self.token_scores(response_ids, bot_action, behaviour_logprobs).logprobs

    def token_scores(self, response_ids: tuple[int, ...], bot_action: str | None,
                     behaviour_logprobs: tuple[float, ...] | None = None, top_k: int = 0) -> TokenScores:
        """`token_logprobs`, and with top_k > 0 the k most likely next tokens at each position: the
        tokens the still-followed canonical responses continue with, by mass (-1 pads; a position
        after the response left every valid call has no candidates)."""
        n = len(self.responses)
        delta = self.config.action_smoothing
        prior = {a: (1 - delta if a == bot_action else delta / (n - 1)) if bot_action else 1 / n
                 for a in self.responses}
        eps, uniform = self.config.token_smoothing, 1.0 / self.vocab_size
        alive = set(self.responses)
        out, topk_ids, topk_lps = [], [], []
        for t, y in enumerate(response_ids):
            alive = {a for a in alive if len(self.responses[a]) > t}
            if top_k:
                total = sum(prior[a] for a in alive)
                mass: dict[int, float] = {}
                for a in alive:
                    mass[self.responses[a][t]] = mass.get(self.responses[a][t], 0.0) + prior[a] / total
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
            match = sum(prior[a] for a in alive if self.responses[a][t] == y)
            out.append(math.log((1 - eps) * match / total + eps * uniform))
            alive = {a for a in alive if self.responses[a][t] == y}
        if not top_k:
            return TokenScores(tuple(out))
        return TokenScores(tuple(out), tuple(topk_ids), tuple(topk_lps))

    def score_trajectories(self, trajectories: list[Trajectory], top_k: int = 0) -> list[list[TokenScores]]:
        """Teacher scores per turn of each trajectory."""
        return [[self.token_scores(turn.response_ids, action, turn.behaviour_logprobs, top_k)
                 for turn, action in zip(t.turns, self.bot_actions(t))] for t in trajectories]
