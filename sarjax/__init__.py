"""sarjax: systemic adversarial robustness of model pools, in JAX.

.. include:: ../README.md
"""

__version__ = "0.1.0"
