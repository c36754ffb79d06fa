"""sarjax.data."""
