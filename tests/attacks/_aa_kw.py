"""The AutoAttack tests' flat keywords, split into what the pipelines take: the attack's
(:func:`sarjax.attacks.autoattack.autoattack_config`), the settings
(:class:`sarjax.attacks.autoattack.AutoAttackSettings`) and the runner's own (``seed``, ``ids``,
``wrap``, ``stochastic``, ``meta``)."""

from dataclasses import fields

from sarjax.attacks.autoattack import AutoAttackSettings, autoattack_config
from sarjax.experiments.autoattack import run_autoattack

CONFIG = ("norm", "eps", "version", "attacks", "n_iter", "fab_iter", "square_queries", "square_rescale_schedule", "box")
SETTINGS = tuple(f.name for f in fields(AutoAttackSettings))


def split(kw: dict) -> tuple[dict, dict, dict]:
    """``(config keywords, settings keywords, the rest)`` of ``kw``."""
    return (
        {k: v for k, v in kw.items() if k in CONFIG},
        {k: v for k, v in kw.items() if k in SETTINGS},
        {k: v for k, v in kw.items() if k not in CONFIG and k not in SETTINGS},
    )


def run(pool, x, y, **kw):
    """``run_autoattack`` with flat keywords."""
    c, s, rest = split(kw)
    return run_autoattack(pool, x, y, attack=autoattack_config(**c), settings=AutoAttackSettings(**s), **rest)
