"""Host-side oracle types for the cover layer.

The cover layer never touches model parameters: it drives attacks through two
host callables with fixed shapes, so the caller's compiled joint attack is
reused every greedy round without recompiling (the uncovered set travels as a
``[B, M]`` bool mask, never as a list of indices).
"""

from typing import NamedTuple, Protocol

import numpy as np


class Candidates(NamedTuple):
    """What one attack call returns, one row per sample.

    Attributes:
        x_adv: ``[B, *S]`` the candidate inputs (images, token ids, ...). Rows of
            samples that were not attacked are ignored.
        covered: ``[B, M]`` bool, ``C(x_adv[b])``: the members whose output left
            the safe region on ``x_adv[b]``. Report every member you evaluated
            (the whole pool if you can): the greedy only credits members that
            were still uncovered, but the full rows feed the exact cover.
        queries: ``[B]`` int, queries spent on each sample by this call
            (one forward or backward pass of one member on one sample = 1).
        objective: ``[B, M]`` float, per-member attack objective at ``x_adv``
            (e.g. each member's loss). The greedy uses it only to pick the
            fallback member: the uncovered member with the highest objective.
            A single-member attack may return zeros here.
    """

    x_adv: np.ndarray
    covered: np.ndarray
    queries: np.ndarray
    objective: np.ndarray


class JointAttack(Protocol):
    """Joint attack oracle: one call attacks all ``B`` samples at once.

    Args:
        uncovered: ``[B, M]`` bool, the members each sample's joint attack must
            target (the still-uncovered set ``I``). Rows of samples that are
            finished are all False; the oracle should spend no queries on them.
        round_index: greedy round (0-based). Fold it into the PRNG key on the
            caller side (pass it into jit as an array, not a static argument).

    Returns:
        Candidates with fixed shapes ``[B, ...]``.

    For the batched greedy to equal per-sample greedy, row ``b`` of the output
    must depend only on row ``b`` of the input (and on ``round_index``):
    derive per-sample keys with ``jax.random.fold_in(key, sample_index)``.
    """

    def __call__(self, uncovered: np.ndarray, round_index: int) -> Candidates: ...


class SingleAttack(Protocol):
    """Single-member fallback oracle (Algorithm 1's single-model attack).

    Args:
        target: ``[B]`` int, the member to attack alone for each sample.
        active: ``[B]`` bool, which samples need the fallback this round;
            inactive rows are ignored (and should cost no queries).
        round_index: greedy round (0-based), as for :class:`JointAttack`.

    Returns:
        Candidates with fixed shapes ``[B, ...]``; ``covered[b]`` is the full
        coverage of ``x_adv[b]``. The fallback succeeds iff
        ``covered[b, target[b]]``.
    """

    def __call__(self, target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates: ...
