"""Turn-level judges: a score per selected turn of an episode (docs/algorithms.md §3)."""
