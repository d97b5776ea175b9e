"""thinkgate: bench."""
