"""thinkgate: ipc."""
