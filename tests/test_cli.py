"""The command line itself: help, version, module entry point, error format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from maas_kubevirt import __version__, cli

VENV_BIN = Path(sys.executable).parent


@pytest.mark.parametrize("command", [[str(VENV_BIN / "maas-kubevirt")], [sys.executable, "-m", "maas_kubevirt"]])
def test_version_from_console_script_and_module(command):
    result = subprocess.run(command + ["--version"], capture_output=True, text=True, check=True)
    assert result.stdout == f"maas-kubevirt {__version__}\n"


@pytest.mark.parametrize(
    "sub, mentions",
    [
        ([], ["--values FILE", "render", "reconcile", "status", "upload-script", "doctor", "Exit status"]),
        (["render"], ["--output DIR", "kubectl apply -f -", "seed"]),
        (["reconcile"], ["--once", "--interval SECONDS", "--dry-run", "audit record", "Exit status"]),
        (["status"], ["power state"]),
        (["upload-script"], ["--script FILE", "POST scripts/"]),
        (["doctor"], ["--kubeconfig FILE", "--context NAME", "--json", "Read-only", "Exit status"]),
    ],
)
def test_help_describes_every_command(sub, mentions, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(sub + ["--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(" ".join(["usage: maas-kubevirt"] + sub))
    for mention in mentions:
        assert mention in out


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main([])
    assert exited.value.code == 2
    assert "required: COMMAND" in capsys.readouterr().err


def test_bad_interval_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["reconcile", "--interval", "0"])
    assert exited.value.code == 2
    assert "expected at least 1 second, found 0" in capsys.readouterr().err


def test_once_and_interval_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["reconcile", "--once", "--interval", "5"])
    assert exited.value.code == 2
