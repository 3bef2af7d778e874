"""Proof that a property's guarded assertion ran: count how often each branch is taken.

A property that asserts only under ``if rare_condition:`` proves nothing when the condition
never holds. Write the guard as ``if branch("name", condition):`` and decorate the test with
``@branches_taken(name=share)`` (outside ``@given``): the test fails unless the branch ran in
at least that share of the examples hypothesis generated.

A share of random examples is itself random: a property that met its share in 11 of 12 random
runs failed the package build (Debian's hypothesis 6.67 never derandomizes by itself). So the
decorated property always draws derandomized examples, from hypothesis's fixed seed, whatever
the profile: the same examples on every run of one hypothesis release, so the odds that a run
fails by chance are zero, and a share too high for the strategy fails every run, not some.
"""

from __future__ import annotations

import functools
from typing import Callable

from hypothesis import event, settings

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
        # On top of the test's own settings (and the profile's), never a stored failing example.
        # A test's @settings may be applied once only, so a decorated one gets its settings
        # replaced where hypothesis reads them at each call (the same attribute in every
        # release from Debian 12's 6.67 on).
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is None:
            test = settings(derandomize=True, database=None)(test)
        else:
            test._hypothesis_internal_use_settings = settings(own, derandomize=True, database=None)

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
