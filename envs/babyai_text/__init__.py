"""BabyAI-Text MixedTrainLocal on minigrid: level, text observations, tools, expert bot."""

from envs.babyai_text.env import BabyAITextConfig, BabyAITextEnv
from envs.babyai_text.expert import BabyAIExpert
from envs.babyai_text.tasks import EVAL50_COUNTS, SPLITS, TASK_TYPES

__all__ = ["BabyAITextConfig", "BabyAITextEnv", "BabyAIExpert", "EVAL50_COUNTS", "SPLITS", "TASK_TYPES"]
