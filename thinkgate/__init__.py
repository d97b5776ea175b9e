"""thinkgate: thinkgate."""
