"""sarjax.models."""
