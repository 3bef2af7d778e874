"""Kubernetes resource quantities as the pools key writes them: memory and disk sizes in bytes.

Only the forms an operator writes for a size are taken: a whole number with an optional binary
(Ki, Mi, Gi, Ti, Pi, Ei) or decimal (k, M, G, T, P, E) suffix, as in
k8s.io/apimachinery/pkg/api/resource/quantity.go. Fractions, exponents and milli-units are
refused: a VM of 1.5Gi or 4e9 is a typo more often than a wish."""

from __future__ import annotations

import re

SUFFIXES = {
    "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_QUANTITY = re.compile(r"([1-9][0-9]{0,18})(|[kMGTPE]|[KMGTPE]i)\Z")


class QuantityError(ValueError):
    """Text that is not a whole Kubernetes quantity; the message says what is expected."""


def parse(text: object) -> int:
    """The number of bytes a quantity such as ``4Gi`` or ``20G`` means."""
    match = _QUANTITY.match(text) if isinstance(text, str) else None
    if not match:
        raise QuantityError("a Kubernetes quantity: a whole number with an optional suffix Ki, Mi, Gi, Ti, "
                            "Pi, Ei, k, M, G, T, P or E, such as 4Gi")
    return int(match.group(1)) * SUFFIXES[match.group(2)]

