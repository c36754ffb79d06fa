"""sarjax: systemic adversarial robustness of model pools, in JAX."""

__version__ = "0.1.0"
