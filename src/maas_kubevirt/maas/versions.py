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


Version = tuple[int, int, int]


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
