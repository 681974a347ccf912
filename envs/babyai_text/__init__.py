"""BabyAI-Text MixedTrainLocal on minigrid: level, text observations, tools, expert bot."""

from envs.babyai_text.env import BabyAITextConfig, BabyAITextEnv
from envs.babyai_text.expert import BabyAIExpert
from envs.babyai_text.tasks import EVAL50_COUNTS, SPLITS, TASK_TYPES
from envs.registry import register_env

register_env("babyai_text", BabyAITextConfig, BabyAITextEnv)

__all__ = ["BabyAITextConfig", "BabyAITextEnv", "BabyAIExpert", "EVAL50_COUNTS", "SPLITS", "TASK_TYPES"]
