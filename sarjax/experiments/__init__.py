"""Experiments: library code the ``sarjax`` commands call (the demo, SAR of a saved pool, the LLM demo, frontier runs)."""
