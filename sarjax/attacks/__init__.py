"""sarjax.attacks."""
