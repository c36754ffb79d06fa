"""sarjax.cover."""
