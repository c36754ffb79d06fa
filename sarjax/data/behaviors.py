"""HarmBench behaviors in its CSV format.

Columns: Behavior, FunctionalCategory, SemanticCategory, Tags, ContextString,
BehaviorID (HarmBench ``data/behavior_datasets/*.csv``). The file is supplied
by the user; sarjax ships no behaviors.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from collections.abc import Iterable

COLUMNS = ("Behavior", "FunctionalCategory", "SemanticCategory", "Tags", "ContextString", "BehaviorID")


@dataclasses.dataclass(frozen=True)
class Behavior:
    """One HarmBench behavior.

    Attributes:
      behavior: the request text.
      functional_category: e.g. "standard", "contextual", "copyright".
      semantic_category: e.g. "chemical_biological".
      tags: tuple of tags (the CSV's comma-separated Tags).
      context: ContextString ("" when absent).
      behavior_id: unique id.
    """

    behavior: str
    functional_category: str
    semantic_category: str
    tags: tuple[str, ...]
    context: str
    behavior_id: str

    @property
    def is_contextual(self) -> bool:
        """True when the behavior carries a context string (HarmBench's contextual prompt)."""
        return bool(self.context)


def load_behaviors(
    path: str,
    functional_categories: Iterable[str] | None = None,
    semantic_categories: Iterable[str] | None = None,
) -> list[Behavior]:
    """Reads a HarmBench behaviors CSV.

    Args:
      path: the CSV file.
      functional_categories: keep only these FunctionalCategory values (None: all).
      semantic_categories: keep only these SemanticCategory values (None: all).

    Returns:
      Behaviors in file order.

    Raises:
      FileNotFoundError: no file at ``path``.
      ValueError: a missing column (named), an empty Behavior or BehaviorID, or a duplicate BehaviorID.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"expected a HarmBench behaviors CSV at {path}")
    fc = None if functional_categories is None else set(functional_categories)
    sc = None if semantic_categories is None else set(semantic_categories)
    out: list[Behavior] = []
    seen: set[str] = set()
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing columns {missing}; expected {list(COLUMNS)}, got {reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            b = Behavior(
                behavior=row["Behavior"],
                functional_category=row["FunctionalCategory"],
                semantic_category=row["SemanticCategory"],
                tags=tuple(t.strip() for t in (row["Tags"] or "").split(",") if t.strip()),
                context=row["ContextString"] or "",
                behavior_id=row["BehaviorID"],
            )
            if not b.behavior or not b.behavior_id:
                raise ValueError(f"{path}:{line}: empty Behavior or BehaviorID")
            if b.behavior_id in seen:
                raise ValueError(f"{path}:{line}: duplicate BehaviorID {b.behavior_id!r}")
            seen.add(b.behavior_id)
            if (fc is None or b.functional_category in fc) and (sc is None or b.semantic_category in sc):
                out.append(b)
    return out
