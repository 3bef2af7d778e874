"""Shared test settings: hypothesis profiles and the rule for tests that need a missing tool."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=100, deadline=None)
# CI's runs: three times the default's examples, within CI's time budget (docs/development.md).
settings.register_profile(
    "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# `make mutate` runs the fast tests once per mutant: fewer examples, the same ones every run.
settings.register_profile("mutate", max_examples=30, deadline=None, derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

IN_CI = os.environ.get("CI", "").lower() == "true"
# The first MAAS release (major, minor) the pool_releases cases run on besides the pinned one.
POOL_RELEASES_FROM = (3, 8)


def require_tool(name: str, reason: str | None = None) -> str:
    """The path of an executable, or skip (fail under CI=true) with the reason printed."""
    path = shutil.which(name) if os.sep not in name else (name if os.access(name, os.X_OK) else None)
    if path:
        return path
    require(False, reason or f"{name} is not installed")
    return ""


def require(condition: bool, reason: str) -> None:
    """Skip when condition is false, saying why; under CI=true a missing prerequisite fails."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true and a prerequisite is missing: {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pinned_maas: runs on the pinned MAAS release only, not on every release of the "
                            "matrix (docs/development.md says which cases, and why)")
    config.addinivalue_line("markers", "pool_releases: runs on the pinned MAAS release and on every release from "
                            f"{'.'.join(map(str, POOL_RELEASES_FROM))} on (the warm pools' cases; earlier releases "
                            "are proven by the machine cases alone)")
    config.addinivalue_line("markers", "on_master: runs on MAAS master too (a pre-release upstream.lock.yaml pins by "
                            "commit): enlistment, the password, the power-type switch and the security cases; the "
                            "others run on the released series alone, to keep `make test` within its budget")
    config.addinivalue_line("markers", "timing: bounds wall-clock time, so `make test` runs it after the parallel "
                            "workers, with the machine to itself")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cases marked pinned_maas run on the pinned MAAS release alone, pool_releases ones also on
    the releases from POOL_RELEASES_FROM (``runs_on``; deselected on the others).
    Tests on the live control plane run last: its processes stay up until the session ends, and
    must not load the machine under the tests that measure how fast a stop is honoured.
    Under pytest-xdist's loadgroup, one worker runs all the cases of one MAAS release (one region
    per release, not one per worker), and one worker the cases that install the package or overlay
    /etc (test_deb, test_docs), which must not meet."""
    from realmaas import maas_version

    pinned = maas_version()
    elsewhere = [item for item in items if getattr(item, "callspec", None)
                 and not runs_on(item, item.callspec.params.get("real_maas", pinned), pinned)]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item not in elsewhere]
    items.sort(key=lambda item: "control_plane" in getattr(item, "fixturenames", ()))
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        release = getattr(item, "callspec", None) and item.callspec.params.get("real_maas")
        if release:
            item.add_marker(pytest.mark.xdist_group(f"maas-{release}"))
        elif item.module.__name__ in ("test_deb", "test_docs"):
            item.add_marker(pytest.mark.xdist_group("host"))


def runs_on(item: pytest.Item, release: str, pinned: str) -> bool:
    """Whether a case runs on this MAAS release: pinned_maas ones on the pinned release alone,
    pool_releases ones on it and on POOL_RELEASES_FROM on (a pre-release such as 3.8.0a1 included);
    on MAAS master (master_releases) only on_master and pool_releases ones."""
    from realmaas import master_releases

    if release == pinned:
        return True
    if item.get_closest_marker("pinned_maas"):
        return False
    if release in master_releases() and not (item.get_closest_marker("on_master")
                                             or item.get_closest_marker("pool_releases")):
        return False
    if item.get_closest_marker("pool_releases"):
        from packaging.version import InvalidVersion, Version

        try:
            return Version(release).release[:2] >= POOL_RELEASES_FROM
        except InvalidVersion:
            return False
    return True


@pytest.fixture(autouse=True)
def no_ambient_kubeconfig(monkeypatch, tmp_path_factory):
    """No test reads the kubeconfig of whoever runs the suite: $KUBECONFIG and ~/.kube/config
    (which doctor and rotate read when given none) point at nothing unless a test sets them; nor
    its terminal's width."""
    from maas_kubevirt import kubeconfigs

    monkeypatch.delenv("KUBECONFIG", raising=False)
    # pytest-xdist's workers set COLUMNS=80 and LINES=24, which would wrap doctor's tables.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    monkeypatch.setattr(kubeconfigs, "HOME_CONFIG", str(tmp_path_factory.getbasetemp() / "no-home" / "config"))


# Offered here, not imported by each test file: a fixture imported into two modules is two
# fixtures, and each would start a control plane (or MAAS region) of its own. (Imported last:
# controlplane and realmaas import `require` from this module.)
from controlplane import control_plane  # noqa: E402,F401
from realmaas import real_maas  # noqa: E402,F401
