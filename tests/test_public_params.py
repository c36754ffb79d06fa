"""No public function takes more than ten parameters (the house style; issue 42 item 3).

Walks every module of the ``sarjax`` package, takes the names each one declares public in its
``__all__`` (its own and those it re-exports; a module without one: the names without a leading
underscore that it defines) and counts the parameters of every function and of
every class constructor written by hand. Records (dataclasses and NamedTuples: results, states,
settings) are exempt: their fields are data built by keyword, not a call signature, and grouping
knobs into them is how a function gets under the limit.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import pkgutil

import sarjax

LIMIT = 10

# Public functions other helpers are still bringing under the limit. THIS LIST MUST BE EMPTIED:
# each name leaves it when its fix lands (the test below fails while a listed name is already at or
# under the limit, so the list only shrinks).
STILL_OVER: set[str] = set()


def _is_record(cls: type) -> bool:
    return dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields"))


@functools.cache
def public_param_counts() -> dict[str, int]:
    """``module.qualname -> number of parameters`` of every public function and hand-written
    class constructor reachable from a module's ``__all__`` (``self`` not counted)."""
    out: dict[str, int] = {}
    for info in pkgutil.walk_packages(sarjax.__path__, "sarjax."):
        if info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        names = getattr(mod, "__all__", None)
        if names is None:  # no __all__: the public names the module defines itself
            names = [
                n
                for n, o in vars(mod).items()
                if not n.startswith("_") and getattr(o, "__module__", None) == mod.__name__
            ]
        for name in names:
            obj = getattr(mod, name, None)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if not getattr(obj, "__module__", "").startswith("sarjax"):
                continue
            if inspect.isclass(obj) and _is_record(obj):
                continue
            try:
                sig = inspect.signature(obj)
            except (TypeError, ValueError):  # a builtin-backed constructor: nothing to count
                continue
            out[f"{obj.__module__}.{obj.__qualname__}"] = len(sig.parameters)
    return out


def test_no_public_function_takes_more_than_ten_parameters():
    counts = public_param_counts()
    assert len(counts) > 100, f"the walk found only {len(counts)} public callables"
    assert "sarjax.attacks.pgd.make_pgd" in counts and "sarjax.cover.greedy.greedy_sar" in counts
    over = {k: v for k, v in counts.items() if v > LIMIT and k not in STILL_OVER}
    assert not over, f"public callables over {LIMIT} parameters (group knobs into a settings object): {over}"


def test_allowlist_only_holds_names_still_over_the_limit():
    counts = public_param_counts()
    missing = sorted(STILL_OVER - counts.keys())
    assert not missing, f"allowlisted names no longer public (renamed or moved?): {missing}"
    done = {k: counts[k] for k in sorted(STILL_OVER) if counts[k] <= LIMIT}
    assert not done, f"these take <= {LIMIT} parameters now: remove them from STILL_OVER: {done}"


def test_the_walk_counts_a_known_signature():
    # known answer: make_pgd(apply, *, norm, eps, steps, loss, targeted, box, audit, eot, step)
    counts = public_param_counts()
    assert counts["sarjax.attacks.pgd.make_pgd"] == 10
    assert counts["sarjax.cover.greedy.greedy_sar"] == 6
    assert counts["sarjax.models.train.train_stack"] == 10
