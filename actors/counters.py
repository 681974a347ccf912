"""The counter names a rollout worker reports in `stats` (deltas since its previous answer) that
the driver's step record is built from (jobs.records)."""

TURNS_AT, FORMAT_ERRORS_AT = "num_turns@", "num_format_errors@"
"""Worker counter prefixes of the per-turn-index counts (`num_turns@3`: the student's turns at index 3)."""
WORKER_COUNTERS = ("num_episodes", "num_successes", "num_turns", "num_format_errors", "num_response_tokens",
                   "num_prompt_tokens", "num_success_turns", "num_memory_turns", "num_memory_format_errors",
                   "num_env_restarts", "num_agent_failures")
"""The rollout-worker counters the record is built from (every worker reports them as deltas)."""
