"""Models by import path: ``"PKG.MODULE:ATTR"`` strings that name pools and checkpoint builders.

Two uses:

- ``--model PKG.MODULE:FUNCTION`` on the commands (``sarjax sar``, ``frontier``, ``autoattack``):
  :func:`load_model` imports ``FUNCTION``, calls it with no arguments and checks that it returned
  a :class:`~sarjax.models.Pool`.
- :func:`sarjax.models.checkpoint.save_pool` records, for each stack that is not a zoo stack, how
  to rebuild its architecture (:func:`builder_record`), so that :func:`~sarjax.models.checkpoint.load_pool`
  and every command restore function, linen, nnx and PyTorch pools without code. A record is

  - ``{"path": "PKG.MODULE:FUNCTION", "call": true}``: ``FUNCTION()`` returns what the stack
    kind restores from (given by the user: ``save_pool(..., builders={stack name: path})``);
  - ``{"path": "PKG.MODULE:apply", "call": false}``: a plain-function stack whose apply is a
    module-level function (found by itself);
  - ``{"path": "PKG.MODULE:Class", "call": true, "kwargs": {...}}``: a flax linen module rebuilt
    from its class and its JSON-able dataclass fields (found by itself).

The module must be importable where the pool is loaded (installed, or on ``PYTHONPATH``).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from typing import Any

from sarjax.models.pool import Pool

_SPEC = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def check_path(spec: Any) -> str:
    """``spec`` if it has the form ``PKG.MODULE:ATTR`` (ValueError naming it otherwise)."""
    if not isinstance(spec, str) or not _SPEC.fullmatch(spec):
        raise ValueError(f"expected an import path PKG.MODULE:FUNCTION (e.g. mypkg.models:make_pool), got {spec!r}")
    return spec


def import_path(spec: str) -> Any:
    """The object ``PKG.MODULE:ATTR`` names (``ATTR`` may be dotted: ``Class.method``).

    Raises:
        ValueError: one line naming the path, when it is malformed, its module does not import
            (with the import error) or the module has no such attribute.
    """
    module_name, _, attr = check_path(spec).partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # the user's module may raise anything at import
        raise ValueError(
            f"cannot import {module_name!r} for {spec!r}: {type(e).__name__}: {e} "
            "(is the module installed or on PYTHONPATH?)"
        ) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_model(spec: str) -> Any:
    """The pool that ``PKG.MODULE:FUNCTION`` builds: ``FUNCTION()``, checked to be a Pool.

    Raises:
        ValueError: the path does not import, ``FUNCTION`` is not callable, raises, or returns
            something other than a :class:`~sarjax.models.Pool` (naming the path and the type).
    """
    fn = import_path(spec)
    if not callable(fn):
        raise ValueError(f"--model {spec}: {type(fn).__name__} is not callable (expected a function returning a Pool)")
    try:
        pool = fn()
    except Exception as e:
        raise ValueError(f"--model {spec}: calling it raised {type(e).__name__}: {e}") from e
    if not isinstance(pool, Pool):
        raise ValueError(f"--model {spec}: expected it to return a sarjax.models.Pool, got {type(pool).__name__}")
    return pool


def _importable_as(obj: Any) -> str | None:
    """``"module:qualname"`` when importing that gives back ``obj`` itself, else None."""
    mod = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None)
    if not mod or not qual or mod == "__main__" or "<" in qual:
        return None
    spec = f"{mod}:{qual}"
    if not _SPEC.fullmatch(spec):
        return None
    try:
        return spec if import_path(spec) is obj else None
    except ValueError:
        return None


def builder_record(stack: Any, path: str | None = None) -> dict[str, Any] | None:
    """How to rebuild ``stack``'s architecture at load time, or None when it cannot be found by itself.

    Args:
        stack: a stack of a kind other than the zoo.
        path: the user's ``PKG.MODULE:FUNCTION`` (a zero-argument function returning what the kind
            restores from); checked to import.

    Returns:
        A record for ``pool.json`` (see the module doc) or None.
    """
    if path is not None:
        if not callable(import_path(path)):
            raise ValueError(f"builder {path!r} is not callable (a zero-argument function returning the model)")
        return {"path": path, "call": True}
    kind = getattr(stack, "kind", None)
    if kind == "function":
        spec = _importable_as(getattr(stack, "_apply", None))
        return None if spec is None else {"path": spec, "call": False}
    if kind == "linen":
        module = stack.module
        spec = _importable_as(type(module))
        if spec is None or not dataclasses.is_dataclass(module):
            return None
        kwargs = {
            f.name: getattr(module, f.name)
            for f in dataclasses.fields(module)
            if f.init and f.name not in ("parent", "name")
        }
        try:
            json.dumps(kwargs)
        except TypeError:
            return None
        try:
            rebuilt = type(module)(**kwargs)
        except Exception:
            return None
        if repr(rebuilt) != repr(module):
            return None
        return {"path": spec, "call": True, "kwargs": kwargs}
    return None


def build(record: dict[str, Any]) -> Any:
    """What a builder record rebuilds: ``obj(**kwargs)`` or ``obj()`` when ``call``, else ``obj``.

    Raises:
        ValueError: a malformed record, or a path that does not import (naming it).
    """
    if not isinstance(record, dict) or not isinstance(record.get("path"), str):
        raise ValueError(f"a builder record is {{'path': 'PKG.MODULE:ATTR', 'call': bool}}, got {record!r:.80}")
    obj = import_path(record["path"])
    if not record.get("call", True):
        return obj
    try:
        return obj(**record.get("kwargs", {}))
    except Exception as e:
        raise ValueError(f"builder {record['path']!r} raised {type(e).__name__}: {e}") from e
