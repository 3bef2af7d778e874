"""The build: `make` renders with the runtime dependencies only, and the package metadata is read
without a warning by Debian 12's setuptools (66) and by current ones alike."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("python", [sys.executable, "/usr/bin/python3"])
def test_the_licence_is_no_toml_table_and_reaches_the_metadata(python):
    """setuptools >= 77 warns on `license = { text = ... }` (some 45 lines per `make`); Debian 12's 66
    refuses the SPDX string form. setup.cfg's `license`, the dynamic field, is read by both."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "license" not in project and "license" in project["dynamic"]
    probe = subprocess.run([python, "-c", "import setuptools"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{python} has no setuptools")
    result = subprocess.run([python, "-c", "import setuptools; setuptools.setup()", "--license"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "Apache-2.0"
    assert "deprecat" not in result.stderr.lower(), result.stderr


def test_make_render_installs_no_test_extras(tmp_path):
    """`make` (render) in a fresh checkout: a virtualenv with the runtime dependencies, no pytest."""
    plan = subprocess.run(["make", "-n", f"VENV={tmp_path / 'venv'}", f"BUILD={tmp_path / 'build'}", "render"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line]
    assert installs and all("[test" not in line for line in installs), plan
    assert "render --output" in plan
    test_plan = subprocess.run(["make", "-n", f"VENV={tmp_path / 'venv'}", "test-venv"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "'.[test]'" in test_plan


def test_make_in_a_fresh_checkout_warns_of_nothing_but_announces_the_seed(tmp_path):
    """The whole of `make`, as a newcomer runs it: pip builds the package with the newest setuptools
    (an isolated build), whose deprecation warnings `make` printed some 45 lines of; the render needs
    no test extra; and the seed it generates is announced, with where it is and to back it up."""
    venv, build = tmp_path / "venv", tmp_path / "build"
    result = subprocess.run(["make", f"VENV={venv}", f"BUILD={build}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert not re.search(r"(?i:deprecat)|\w+Warning\b", output), output
    assert f"Generated a new site seed in {build / 'seed'} (mode 0600)" in output and "Back it up now" in output
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import pytest"], capture_output=True)
    assert probe.returncode != 0, "make installed pytest: the render needs only the runtime dependencies"
