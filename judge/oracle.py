"""The environment's expert as a turn judge: did the action keep the agent on the expert's plan?

Turn k scores 1 when the call it executed is the call the expert (the BabyAI bot) would make
from the state the episode reached, replayed from (split, seed) through the executed calls;
0 for any other call, a turn that executed nothing, or a state where the expert has no plan.
For BabyAI the bot plans a shortest path, so 1 means "still on a shortest plan".
"""

from __future__ import annotations


from buffer.contracts import Trajectory
from envs.protocol import TextEnv, ToolCall
from teacher.oracle import expert_calls


class OracleJudge:
    def __init__(self, env: TextEnv) -> None:
        self.env = env
        self._cache: tuple[str, list[ToolCall | None]] | None = None

    async def check(self) -> None:
        """Nothing to reach: an environment without an expert fails on its first episode."""

    async def score(self, trajectory: Trajectory, turn: int) -> float | None:
        if self._cache is None or self._cache[0] != trajectory.trajectory_id:  # turns of one episode come together
            self._cache = (trajectory.trajectory_id, expert_calls(self.env, trajectory))
        advice = self._cache[1][turn]
        executed = trajectory.turns[turn].executed_call
        if advice is None or executed is None:
            return 0.0
        return float(ToolCall.from_json(executed) == advice)

    async def close(self) -> None:
        pass
