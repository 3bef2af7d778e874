"""Which MAAS versions maas-kubevirt works with, read from MAAS's version string."""

from __future__ import annotations

import re

from maas_kubevirt.maas.errors import MAASVersionError, _one_line

# The oldest MAAS that runs the commissioning script's BMC_CONFIG_PATH upload (2.9.0).
MIN_MAAS_VERSION = (2, 9, 0)
# MAAS releases that reject a DNS name in a redfish power_address (LP:2150892).
DNS_NAME_REJECTED = (((3, 6, 0), (3, 6, 4)), ((3, 7, 0), (3, 7, 2)))


def parse_version(text: str) -> tuple[int, int, int] | None:
    """(major, minor, point) from MAAS's version string, e.g. "3.5.0~beta1-14800-g1234"."""
    match = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not match:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def check_version(text: str) -> list[str]:
    """Warnings for MAAS's version; raises MAASVersionError below MIN_MAAS_VERSION."""
    version = parse_version(text)
    minimum = ".".join(map(str, MIN_MAAS_VERSION))
    if version is None:
        return [f"cannot read the MAAS version {_one_line(text, 40)!r}; assuming at least {minimum}"]
    if version < MIN_MAAS_VERSION:
        raise MAASVersionError(
            f"MAAS {text} is too old: maas-kubevirt needs MAAS {minimum} or later "
            "(the commissioning script hands MAAS the power parameters through BMC_CONFIG_PATH)"
        )
    for low, high in DNS_NAME_REJECTED:
        if low <= version <= high:
            return [
                f"MAAS {text} rejects DNS names in a redfish power address (LP:2150892; affects "
                "3.6.0-3.6.4 and 3.7.0-3.7.2): enlistment of KubeVirt VMs fails; upgrade MAAS"
            ]
    return []


Version = tuple[int, ...]

# MAAS's pre-release qualifiers, ordered as its own MAASVersion orders them (src/provisioningserver/
# utils/version.py: alpha, beta, rc, then the release), with the one-letter forms of a pyproject
# version (master's "3.8.0a1", which it serves as "3.8.0~a1"; MAASVersion leaves "a" unordered).
_QUALIFIERS = {"alpha": -3, "a": -3, "beta": -2, "b": -2, "rc": -1}
_RELEASE = re.compile(r"\s*(\d+)\.(\d+)(?:\.(\d+))?(?:~?(alpha|beta|rc|a|b)(\d*))?")


def release_key(text: str) -> tuple[int, int, int, int, int] | None:
    """parse_version's (major, minor, point) then the pre-release's order and number, (0, 0) for
    a release: 3.8.0a1 and 3.8.0~alpha1 are one key, below 3.8.0~beta1, below 3.8.0."""
    match = _RELEASE.match(str(text))
    if not match:
        return None
    qualifier = _QUALIFIERS[match[4]] if match[4] else 0
    return int(match[1]), int(match[2]), int(match[3] or 0), qualifier, int(match[5] or 0)


def nearest_proven(version: Version, proven: "list[Version] | tuple[Version, ...]") -> Version | None:
    """The proven release nearest ``version``: the one of its series (major.minor), the newest
    when several; else the newest proven release older than it; else the oldest. None when
    nothing is proven. A release of a proven series is nearest its own series' proven release,
    whether older or newer (3.5.4 and 3.5.20: 3.5.13), so that the advice stays in the series."""
    if not proven:
        return None
    ordered = sorted(set(proven))
    same = [release for release in ordered if release[:2] == version[:2]]
    if same:
        return same[-1]
    older = [release for release in ordered if release < version]
    return older[-1] if older else ordered[0]
