"""Text environments as tools: the TextEnv seam, tool schemas, prompt rendering, parser, rewards."""
