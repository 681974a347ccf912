"""Ray bootstrap (embedded local or an existing cluster), resource plans, metrics."""
