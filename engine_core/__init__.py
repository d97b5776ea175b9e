"""thinkgate: engine_core."""
