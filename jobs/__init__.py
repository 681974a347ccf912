"""Entry points (train, evaluate, ...) and their YAML configs."""
