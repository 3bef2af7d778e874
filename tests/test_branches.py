"""The branch-share helper fails a property whose guarded assertion barely runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from branches import branch, branches_taken


@branches_taken(big=0.5)
@settings(max_examples=50, database=None)
@given(st.integers(0, 100))
def rarely_big(n):
    if branch("big", n > 98):
        assert n > 98


@branches_taken(even=0.2)
@settings(max_examples=50, database=None)
@given(st.integers(0, 100))
def often_even(n):
    if branch("even", n % 2 == 0):
        assert n % 2 == 0


def test_a_rare_branch_fails_the_property():
    with pytest.raises(AssertionError, match=r"branch 'big' ran in \d+ of \d+ examples, fewer than 50%"):
        rarely_big()


def test_a_common_branch_passes():
    often_even()


def test_a_share_asserting_property_draws_the_same_examples_on_every_run():
    """Derandomized whatever the profile: the share cannot be met one run and missed the next."""
    drawn = []

    @branches_taken(any=0.0)
    @settings(max_examples=20)
    @given(st.integers())
    def record(n):
        branch("any", True)
        drawn.append(n)

    record()
    first = list(drawn)
    del drawn[:]
    record()
    assert drawn == first and len(first) == 20
