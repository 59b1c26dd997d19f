"""Training and evaluation: `trainer` (the deterministic loop) and `run` (the commands' files)."""
