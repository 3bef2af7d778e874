"""Hypothesis strategies for Kubernetes names, shared by the test modules."""

from hypothesis import assume, strategies as st

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


def serials() -> st.SearchStrategy[str]:
    """Serials ``<vm>.<namespace>``: valid ones, near misses (one edit away) and arbitrary text."""
    valid = st.builds("{}.{}".format, vm_names(), namespaces)
    edits = st.sampled_from(["", ".", "-", "A", "_", "é", " ", "\n", "..", "x" * 64, "x" * 200])
    near = st.tuples(valid, st.integers(0, 300), edits, st.integers(0, 2)).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + t[3]:]
    )
    return st.one_of(valid, near, st.text(max_size=80))


@st.composite
def readable_collisions(draw) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two different (vm, namespace) pairs with the same ``<vm>-<namespace>``, like web-1/vms and web/1-vms."""
    first = draw(st.text(_ALNUM, min_size=1, max_size=50))
    chunks = [first] + draw(st.lists(st.text(_ALNUM, min_size=1, max_size=7), min_size=2, max_size=7))
    cuts = draw(st.lists(st.integers(1, len(chunks) - 1), min_size=2, max_size=2, unique=True))
    pairs = []
    for cut in cuts:
        joints = draw(st.lists(st.sampled_from("-."), min_size=cut - 1, max_size=cut - 1))
        vm = chunks[0] + "".join(joint + chunk for joint, chunk in zip(joints, chunks[1:cut]))
        namespace = "-".join(chunks[cut:])
        assume(len(namespace) <= 63 and all(len(label) <= 63 for label in vm.split(".")))
        pairs.append((vm, namespace))
    return pairs[0], pairs[1]
