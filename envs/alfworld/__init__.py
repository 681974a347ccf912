"""ALFWorld (alfworld 0.4.2, TextWorld) as a registered text environment; needs the `alfworld` extra."""

from envs.alfworld.env import SPLITS, TASK_TYPES, AlfWorldConfig, AlfWorldEnv, AlfWorldExpert
from envs.registry import register_env

register_env("alfworld", AlfWorldConfig, AlfWorldEnv)

__all__ = ["AlfWorldConfig", "AlfWorldEnv", "AlfWorldExpert", "SPLITS", "TASK_TYPES"]
