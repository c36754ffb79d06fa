"""sarjax.models.

The narrative page (docs/models.md) follows.

.. include:: ../../docs/models.md
"""

# the type every command and attack takes: `from sarjax.models import Pool` (no __all__, so the
# API reference keeps a page per submodule)
from sarjax.models.pool import Pool  # noqa: E402, F401
