"""The counter names a rollout worker reports in `stats` (deltas since its previous answer) that
the driver's step record is built from (jobs.records)."""

TURNS_AT, FORMAT_ERRORS_AT = "num_turns@", "num_format_errors@"
"""Worker counter prefixes of the per-turn-index counts (`num_turns@3`: the student's turns at index 3)."""
WORKER_COUNTERS = ("num_episodes", "num_successes", "num_turns", "num_format_errors", "num_response_tokens",
                   "num_prompt_tokens", "num_success_turns", "num_memory_turns", "num_memory_format_errors",
                   "num_env_restarts", "num_agent_failures")
"""The rollout-worker counters the record is built from (every worker reports them as deltas)."""
GROUP_TOTALS = ("num_groups_delivered", "num_groups_without_signal", "num_episodes_without_signal",
                "num_successes_without_signal", "num_turns_without_signal", "num_format_errors_without_signal")
"""A rollout worker's running totals since it started (not deltas; `group_totals`): the groups it
delivered, those the group-end stages dropped for carrying no signal (every episode the same
reward, under GRPO), and those dropped groups' episodes, successes, turns and format errors."""
