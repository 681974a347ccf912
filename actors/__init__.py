"""Rollout side: inference engines, the multi-turn agent loop, rollout workers."""
