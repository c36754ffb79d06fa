"""sarjax.models.

The narrative page (docs/models.md) follows.

.. include:: ../../docs/models.md
"""
