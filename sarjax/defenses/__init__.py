"""sarjax.defenses: adversarial training objectives built from attacks (docs/defenses.md).

``pgd_at`` (Madry et al. 2018) and ``trades`` (Zhang et al. 2019) are objectives for
``sarjax.models.train.train_stack`` / ``train_pool`` (``objective=``) and for a user's own
``jax.jit`` train step; their inner maximisations run through the attacks' jit-safe entries.
"""

from sarjax.defenses.kl_attack import KLResult, make_kl_attack
from sarjax.defenses.objectives import OBJECTIVES, PGDAT, TRADES, make_objective, objective_spec, pgd_at, trades

__all__ = [
    "KLResult",
    "OBJECTIVES",
    "PGDAT",
    "TRADES",
    "make_kl_attack",
    "make_objective",
    "objective_spec",
    "pgd_at",
    "trades",
]
