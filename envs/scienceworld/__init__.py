"""ScienceWorld (scienceworld 1.2.3, a JVM simulator) as a registered text environment; needs the
`scienceworld` extra and a Java runtime (>= 8)."""

from envs.registry import register_env
from envs.scienceworld.env import (SPLITS, TASK_TYPES, VARIATIONS, GoldPathExpert, ScienceWorldConfig,
                                   ScienceWorldEnv, split_tasks, variations)

register_env("scienceworld", ScienceWorldConfig, ScienceWorldEnv)

__all__ = ["GoldPathExpert", "ScienceWorldConfig", "ScienceWorldEnv", "SPLITS", "TASK_TYPES", "VARIATIONS",
           "split_tasks", "variations"]
