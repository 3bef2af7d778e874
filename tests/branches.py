"""Proof that a property's guarded assertion ran: count how often each branch is taken.

A property that asserts only under ``if rare_condition:`` proves nothing when the condition
never holds. Write the guard as ``if branch("name", condition):`` and decorate the test with
``@branches_taken(name=share)`` (outside ``@given``): the test fails unless the branch ran in
at least that share of the examples hypothesis generated.
"""

from __future__ import annotations

import functools
from typing import Callable

from hypothesis import event

_tally: dict[str, list[int]] | None = None


def branch(name: str, taken: object) -> bool:
    """Record whether branch ``name`` is taken in this example; returns it, to use as the guard."""
    taken = bool(taken)
    event(f"{name}: {'taken' if taken else 'not taken'}")
    if _tally is not None:
        counts = _tally.setdefault(name, [0, 0])
        counts[0] += 1
        counts[1] += taken
    return taken


def branches_taken(**minimum_share: float) -> Callable:
    """Fail the decorated property unless each named branch ran in at least its share of examples."""

    def decorate(test: Callable) -> Callable:
        @functools.wraps(test)
        def counted(*args, **kwargs):
            global _tally
            _tally = {}
            try:
                test(*args, **kwargs)
                tally = _tally
            finally:
                _tally = None
            for name, share in minimum_share.items():
                examples, taken = tally.get(name, (0, 0))
                assert examples and taken / examples >= share, (
                    f"branch {name!r} ran in {taken} of {examples} examples, fewer than {share:.0%}: "
                    "the property's assertion under it is barely tested; fix the strategy"
                )

        return counted

    return decorate
