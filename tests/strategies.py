"""Hypothesis strategies for Kubernetes names, shared by the test modules."""

from hypothesis import strategies as st

_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


@st.composite
def dns_labels(draw, max_size: int = 63) -> str:
    """A DNS-1123 label of 1..max_size characters."""
    size = draw(st.integers(1, max_size))
    if size == 1:
        return draw(st.sampled_from(_ALNUM))
    middle = draw(st.text(_ALNUM + "-", min_size=size - 2, max_size=size - 2))
    return draw(st.sampled_from(_ALNUM)) + middle + draw(st.sampled_from(_ALNUM))


namespaces = dns_labels()


def vm_names(max_labels: int = 4) -> st.SearchStrategy[str]:
    """A DNS-1123 subdomain of up to max_labels labels (at most 253 characters)."""
    return st.lists(dns_labels(), min_size=1, max_size=max_labels).map(".".join).filter(lambda n: len(n) <= 253)


def short_vm_names() -> st.SearchStrategy[str]:
    """VM names short enough that <vm>.<ns>.<domain> can fit 253 characters."""
    return st.lists(dns_labels(20), min_size=1, max_size=3).map(".".join)
