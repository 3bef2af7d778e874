"""The Debian package: its files checked against the tree, and the installed-package tier.

The fast tests read debian/ and need no tool. test_package_builds_installs_and_purges runs
tools/test-deb (build, lintian, apt-get install, installed --version, shell completion and render compared
with a render from this tree, systemd-analyze verify, remove, purge, leftovers); it needs
root and Debian's packaging tools, and skips saying which is missing (fails under CI=true).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import warnings
from pathlib import Path

import pytest
import yaml

from conftest import require, require_tool
from maas_kubevirt import __version__, cli
from maas_kubevirt.values import load_values

ROOT = Path(__file__).resolve().parents[1]
DEBIAN = ROOT / "debian"
UNIT = DEBIAN / "maas-kubevirt.service"
SKIPPED = 77  # tools/test-deb: a prerequisite is missing


def unit_directives() -> list[tuple[str, str]]:
    pairs = []
    for line in UNIT.read_text().splitlines():
        if line.strip() and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            pairs.append((key.strip(), value.strip()))
    return pairs


def example_config(tmp_path: Path) -> Path:
    """/etc/maas-kubevirt/values.yaml exactly as debian/rules makes it."""
    out = tmp_path / "etc-values.yaml"
    with out.open("w") as handle:
        subprocess.run(
            ["sed", "-f", str(DEBIAN / "example-values.sed"), str(ROOT / "values.yaml")],
            stdout=handle, check=True,
        )
    return out


def test_changelog_version_is_the_package_version():
    first = (DEBIAN / "changelog").read_text().splitlines()[0]
    match = re.fullmatch(r"maas-kubevirt \(([^)]+)\) \S+; urgency=\w+", first)
    assert match, first
    assert match.group(1) == __version__, "debian/changelog and maas_kubevirt.__version__ disagree"
    assert "-" not in match.group(1), "a 3.0 (native) package has no Debian revision"
    assert (DEBIAN / "source" / "format").read_text().strip() == "3.0 (native)"


def test_example_config_changes_nothing_until_uncommented(tmp_path):
    config = example_config(tmp_path)
    assert load_values(config) == load_values(None)
    text = config.read_text()
    header, _, body = text.partition("\n\n")
    assert "/etc/maas-kubevirt/api-key" in header
    assert all(line.startswith("#") for line in text.splitlines() if line)
    # removing the one leading '#' gives back the defaults, comments included
    uncommented = "\n".join(line[1:] for line in body.splitlines())
    assert yaml.safe_load(uncommented) == yaml.safe_load((ROOT / "values.yaml").read_text())
    assert uncommented.strip() in (ROOT / "values.yaml").read_text()


def test_unit_is_hardened_conditional_and_runs_a_valid_command():
    directives = unit_directives()
    settings = dict(directives)
    for key, value in {
        "Documentation": "man:maas-kubevirt(1)",
        "Restart": "on-failure",
        "Type": "notify",
        "NotifyAccess": "main",
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
        "WantedBy": "multi-user.target",
    }.items():
        assert settings.get(key) == value, f"{key}={value} expected in {UNIT.name}"
    exec_start = shlex.split(settings["ExecStart"])
    assert exec_start[:3] == ["/usr/bin/maas-kubevirt", "--values", "/etc/maas-kubevirt/values.yaml"]
    args = cli.build_parser().parse_args(exec_start[1:])  # the CLI accepts what the unit runs
    assert args.command == "reconcile" and not args.once and not args.dry_run
    # Not root: the secrets arrive as credentials, read by systemd from root-only files.
    assert not any(key in ("User", "Group") for key, _ in directives)
    assert [v for k, v in directives if k == "LoadCredential"] == [
        "api-key:/etc/maas-kubevirt/api-key", "seed:/etc/maas-kubevirt/seed"]
    assert [v for k, v in directives if k == "ConditionPathExists"] == [
        "/etc/maas-kubevirt/api-key", "/etc/maas-kubevirt/seed"]


# Exposure of the unit as `systemd-analyze security` scored it before it ran as a dynamic user.
MAX_EXPOSURE = 1.8


def test_unit_exposure_is_no_worse_than_before():
    tool = require_tool("systemd-analyze", "systemd-analyze is not installed (apt-get install systemd)")
    result = subprocess.run([tool, "security", "--offline=yes", "--no-pager", str(UNIT)],
                            capture_output=True, text=True, timeout=120)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_purge_removes_the_secrets_and_the_dynamic_users_logs():
    postrm = (DEBIAN / "maas-kubevirt.postrm").read_text()
    purge = postrm[postrm.index('if [ "$1" = purge ]'):postrm.index("fi\n")]
    for path in ("/etc/maas-kubevirt/api-key", "/etc/maas-kubevirt/seed", "/var/log/maas-kubevirt",
                 "/var/log/private/maas-kubevirt"):
        assert path in purge, f"purge does not remove {path}"
    install = (DEBIAN / "maas-kubevirt.install").read_text()
    assert "seed" not in install and "api-key" not in install  # neither is shipped


# Where each shell's completion loader looks for the completion of a command (bash-completion
# loads completions/<command> on demand; Debian's zsh has vendor-completions on its fpath).
COMPLETIONS = {
    "completion/maas-kubevirt": "usr/share/bash-completion/completions/",
    "completion/_maas-kubevirt": "usr/share/zsh/vendor-completions/",
}


def install_lines() -> dict[str, str]:
    return dict(line.split() for line in (DEBIAN / "maas-kubevirt.install").read_text().splitlines())


def test_install_sources_exist_and_the_script_is_executable():
    for source, destination in install_lines().items():
        assert (ROOT / source).exists(), f"debian/maas-kubevirt.install: {source} is not in the tree"
        assert destination.startswith("usr/share/maas-kubevirt/") or COMPLETIONS.get(source) == destination
    script = ROOT / "commissioning" / "31-kubevirt-bmc-config"
    assert script.stat().st_mode & 0o777 == 0o755, "the commissioning script ships with mode 0755"


def test_the_shell_completions_are_installed_where_their_loaders_look():
    lines = install_lines()
    for source, destination in COMPLETIONS.items():
        assert lines.get(source) == destination, f"debian/maas-kubevirt.install: {source} -> {destination} expected"
    shipped = {f"completion/{path.name}" for path in (ROOT / "completion").iterdir()}
    assert shipped == set(COMPLETIONS), "every file in completion/ is installed, and nothing else from there"
    # lintian: a completion is sourced, not run (no #! line), and ships as a plain 0644 file
    for source in COMPLETIONS:
        assert not (ROOT / source).read_text().startswith("#!") and (ROOT / source).stat().st_mode & 0o111 == 0


def test_build_time_tests_exist_and_need_no_tool():
    rules = (DEBIAN / "rules").read_text()
    names = re.search(r"^BUILD_TESTS = (.+)$", rules, re.M).group(1).split()
    assert names
    for name in names:
        text = (ROOT / name).read_text()  # a renamed test file would break `make deb`
        assert "require_tool" not in text and "require(" not in text, f"{name} needs a tool"
    assert set((DEBIAN / "pybuild.testfiles").read_text().split()) >= {"pyproject.toml", "tests"}


def test_runtime_dependencies_are_build_dependencies():
    """help2man runs the CLI during the build, so its imports must be installed then."""
    import tomllib

    debian_name = {"pyyaml": "python3-yaml"}
    control = (DEBIAN / "control").read_text()
    build_depends = re.search(r"^Build-Depends:(.*?)^\S", control, re.M | re.S).group(1)
    for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        package = debian_name.get(name, f"python3-{name}")
        assert re.search(rf"\b{re.escape(package)}\b", build_depends), f"Build-Depends lacks {package}"


def test_every_lintian_override_is_justified():
    lines = (DEBIAN / "maas-kubevirt.lintian-overrides").read_text().splitlines()
    for number, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert number > 0 and lines[number - 1].startswith("#"), f"override without a comment: {line}"


def test_package_builds_installs_and_purges():
    for tool in ("dpkg-buildpackage", "lintian", "apt-get", "systemd-analyze"):
        require_tool(tool, f"{tool} is not installed: the Debian package tier needs it (make deps)")
    require(os.geteuid() == 0, "the Debian package tier installs the package: it needs root")
    env = dict(os.environ)
    # The build-time tests stay on (no nocheck): this is the one run that proves the test
    # list in debian/rules and debian/pybuild.testfiles still work, and they take seconds.
    env.pop("DEB_BUILD_OPTIONS", None)
    result = subprocess.run(
        [str(ROOT / "tools" / "test-deb")], env=env, capture_output=True, text=True, timeout=1800,
    )
    log = result.stderr.strip()
    if result.returncode == SKIPPED:
        require(False, log.splitlines()[-1].removeprefix("test-deb: SKIP: "))
    assert result.returncode == 0, "tools/test-deb failed:\n" + "\n".join(log.splitlines()[-60:])
    reported = [
        line for line in (ROOT / "build" / "deb" / "lintian.log").read_text().splitlines()
        if re.match(r"[EWIPX]: ", line)
    ]
    if reported:
        warnings.warn("lintian (informational tags, not failures):\n" + "\n".join(reported), stacklevel=1)
