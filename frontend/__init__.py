"""thinkgate: frontend."""
