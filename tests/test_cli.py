"""The command line itself: help, version, the exit codes of success, module entry point, error format."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import write_values  # noqa: E402

from maas_kubevirt import __version__, cli  # noqa: E402
from maas_kubevirt.paths import SCRIPT_NAME  # noqa: E402

VENV_BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [[str(VENV_BIN / "maas-kubevirt")], [sys.executable, "-m", "maas_kubevirt"]])
def test_version_from_console_script_and_module(command):
    result = subprocess.run(command + ["--version"], capture_output=True, text=True, check=True)
    assert result.stdout == f"maas-kubevirt {__version__}\n"


@pytest.mark.parametrize(
    "sub, mentions",
    [
        ([], ["--values FILE", "render", "reconcile", "status", "upload-script", "doctor", "Exit status",
              "3: changes pending"]),
        (["render"], ["--output DIR", "kubectl apply -f -", "seed"]),
        (["reconcile"], ["--once", "--interval SECONDS", "--dry-run", "audit record", "Exit status", "--json",
                         "--detailed-exitcode, 3 changes pending (0 none)"]),
        (["status"], ["power state", "-o FORMAT, --output FORMAT", "--json deprecated: the same as -o json",
                      "--watch", "--interval SECONDS"]),
        (["upload-script"], ["--script FILE", "POST scripts/", "read it back", "bmc-config and enlisting",
                             "not rendered from these values"]),
        (["doctor"], ["--kubeconfig FILE", "--context NAME", "-o FORMAT, --output FORMAT",
                      "--json deprecated: the same as -o json", "Read-only", "Exit status"]),
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


# --- the exit codes of success ----------------------------------------------------------------


def test_every_command_that_can_succeed_without_a_cluster_exits_0_when_it_does(tmp_path, monkeypatch, capsys):
    """As the epilogs and the docs say: 0 for success or nothing to do, from a site's first render
    to a converged VM (rotate needs a cluster)."""
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)

    def succeeds(*argv: str) -> None:
        code = cli.main(values + list(argv))
        out, err = capsys.readouterr()
        assert code == 0, (argv, out[-2000:], err[-2000:])

    with MaasDouble() as double:
        values = ["--values", str(write_values(tmp_path, double))]
        build = tmp_path / "build"
        succeeds("render", "--output", str(build))
        succeeds("upload-script", "--script", str(build / "commissioning" / SCRIPT_NAME))
        # Before any VM enlists: without a cluster its DNS and Redfish rows would fail.
        succeeds("doctor")
        succeeds("doctor", "--json")
        sid = double.add_vm("web1", "vms")
        succeeds("reconcile", "--dry-run")
        succeeds("reconcile", "--once")
        assert double.machines[sid]["hostname"] == "web1-vms"
        succeeds("reconcile", "--once")   # nothing left to do
        succeeds("status")
        succeeds("status", "--json")
    for argv in [["--version"], ["--help"], *([command, "--help"] for command in COMMANDS)]:
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 0, argv
    capsys.readouterr()


@pytest.mark.parametrize("command", [[str(VENV_BIN / "maas-kubevirt")], [sys.executable, "-m", "maas_kubevirt"]])
def test_a_render_from_the_console_script_or_the_module_exits_0(command, tmp_path):
    result = subprocess.run(command + ["render", "--output", str(tmp_path / "build")], capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


# --- layout: one module per command, arrows one way ------------------------------------------

PACKAGE = Path(cli.__file__).parent
# Higher imports lower, never the reverse: cli -> commands -> reconciler -> maas/kube -> identity.
RANK = {
    "__main__": 7,
    "cli": 6,
    "loop": 5, "status": 5, "upload": 5, "doctor": 5,   # the commands' entry points
    "compose": 5, "decompose": 5,  # the pool commands
    "completions": 5,             # the completion command: prints the scripts in completion/
    "route": 4,                   # check-route, and doctor's network.route row: the path to a BMC
    "render": 4,                  # the render command, and what upload (and doctor) compare with
    "reconcile": 3, "policies": 3,
    "pools": 2.5,                 # the warm pools: the cluster and MAAS written; policies render their VM's shape
    "lease": 3,                   # the election on a Lease (reads it through kube for status and doctor)
    "rotate": 4,                  # the rotate command, and the reconciler's rotator on the Lease's access
    "rotations": 2,               # the credential generations in their ConfigMap
    "maas": 2, "kube": 2, "audit": 2, "seed": 2, "events": 2,
    "values": 1, "console": 1,
    "exposure": 1,                # how a BMC host is published (Ingress or HTTPRoute): the policies, render and doctor
    "bmc_proxy": 0,               # the BMC proxy render writes and doctor checks: exposure, policies, render, doctor
    "metrics": 1, "notify": 1,    # what the service tells Prometheus and systemd
    "upstream": 1,                # the releases proven, read from upstream.lock.yaml (doctor compares)
    "identity": 0, "paths": 0,
    "quantity": 0,                # Kubernetes quantities as the pools key writes them: values
    "unreachable": 0,             # why a server gave no answer, its URL without credentials: maas and kube
    "kubeconfigs": 0,             # the kubeconfig kubectl would read: doctor, rotate, lease, kube
    "__init__": -1,               # PROG, the version and the exit codes: anyone may import them
}
COMMANDS = {"render": "render", "reconcile": "loop", "status": "status", "upload-script": "upload",
            "doctor": "doctor", "rotate": "rotate", "compose": "compose", "decompose": "decompose",
            "check-route": "route", "completion": "completions"}


def _imports(path: Path) -> set[str]:
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("maas_kubevirt"):
            module = node.module.split(".")[1] if "." in node.module else None
            if module is None:  # from maas_kubevirt import x, y
                found |= {alias.name for alias in node.names if (PACKAGE / f"{alias.name}.py").exists()}
                found.add("__init__")
            else:
                found.add(module)
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names
                      if alias.name.startswith("maas_kubevirt.")}
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.stem)
def test_imports_point_one_way(path):
    module = path.stem
    assert module in RANK, f"{module}.py: give it a rank in RANK (which layer is it?)"
    for imported in _imports(path):
        assert RANK[imported] < RANK[module], f"{module} imports {imported}: an arrow pointing back"


def _siblings(path: Path) -> set[str]:
    """The modules of its own package that a module imports, at the top or inside a function."""
    import ast

    package = ".".join(("maas_kubevirt",) + path.parent.relative_to(PACKAGE).parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            found |= {alias.name for alias in node.names if (path.parent / f"{alias.name}.py").exists()}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package + "."):
            found.add(node.module[len(package) + 1:].split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE),
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_the_modules_of_a_subpackage_import_each_other_one_way(package):
    """No cycle among a subpackage's modules, its __init__ (which gathers them) aside."""
    import graphlib

    graph = {path.stem: _siblings(path) for path in package.glob("*.py") if path.stem != "__init__"}
    graphlib.TopologicalSorter(graph).prepare()   # CycleError names the modules of a cycle


def test_each_command_has_its_own_module_with_main():
    import importlib

    parser_commands = set(cli.build_parser()._subparsers._group_actions[0].choices)
    assert set(COMMANDS) <= parser_commands
    for command, module in COMMANDS.items():
        assert cli._command(command).__name__ == f"maas_kubevirt.{module}"
        assert callable(importlib.import_module(f"maas_kubevirt.{module}").main)
    reconcile_source = "".join(path.read_text() for path in (PACKAGE / "reconcile").rglob("*.py"))
    assert "def main" not in reconcile_source and "argparse" not in reconcile_source


# --- --values before or after the command ------------------------------------------------------

from hypothesis import given, strategies as st  # noqa: E402

# What each command needs besides --values to parse.
MINIMAL = {"render": [], "reconcile": ["--once"], "status": [], "upload-script": [], "doctor": [],
           "rotate": ["web1.vms"]}
# A values path as an operator may spell it: anything argparse does not take for an option.
value_paths = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                      min_size=1, max_size=40).filter(lambda p: not p.startswith("-"))


@given(command=st.sampled_from(sorted(MINIMAL)), path=value_paths, where=st.sampled_from(["before", "after", "both"]),
       joined=st.booleans())
def test_values_is_taken_before_or_after_the_command(command, path, where, joined):
    option = [f"--values={path}"] if joined else ["--values", path]
    argv = {"before": option + [command] + MINIMAL[command],
            "after": [command] + MINIMAL[command] + option,
            "both": option + [command] + option + MINIMAL[command]}[where]
    args = cli.parse(argv)
    assert args.values == path and args.command == command
    assert not hasattr(args, cli.VALUES_AFTER)


@pytest.mark.parametrize("command", sorted(MINIMAL))
def test_no_values_anywhere_is_the_defaults(command):
    assert cli.parse([command] + MINIMAL[command]).values is None


def test_two_different_values_files_are_a_usage_error_naming_both(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--values", "site.yaml", "render", "--values", "other.yaml"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--values given twice, 'site.yaml' before the command and 'other.yaml' after it" in err


def test_values_after_the_command_is_the_values_used(tmp_path, capsys):
    values = tmp_path / "values.yaml"
    values.write_text("redfish:\n  domain: after.example.org\n")
    assert cli.main(["render", "--output", str(tmp_path / "build"), "--values", str(values)]) == 0
    capsys.readouterr()
    assert "after.example.org" in (tmp_path / "build" / "commissioning" / SCRIPT_NAME).read_text()


def test_help_of_each_command_shows_values(capsys):
    for command in MINIMAL:
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert "--values FILE" in capsys.readouterr().out, command


# --- a closed pipe ------------------------------------------------------------------------------


def _run_into_closed_pipe(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The command with stdout a pipe whose reader has gone (`... | head -1` once head exits)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "maas_kubevirt", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, cwd=cwd, timeout=120)
    finally:
        os.close(write)


def test_a_closed_pipe_ends_status_quietly_with_exit_0(tmp_path):
    with MaasDouble() as double:
        double.add_vm("web1", "vms")
        values = write_values(tmp_path, double)
        result = _run_into_closed_pipe(["--values", str(values), "status"], tmp_path)
    assert (result.returncode, result.stderr) == (0, "")


def test_a_render_to_a_closed_pipe_ends_quietly_with_exit_0(tmp_path):
    subprocess.run([sys.executable, "-m", "maas_kubevirt", "render", "--output", "build"], cwd=tmp_path,
                   check=True, capture_output=True)
    (tmp_path / "values.yaml").write_text(f"seed:\n  file: {tmp_path / 'build' / 'seed'}\n")
    for argv in (["--values", "values.yaml", "render", "--output", "-"], ["--help"], ["status", "--help"]):
        result = _run_into_closed_pipe(argv, tmp_path)
        assert (result.returncode, result.stderr) == (0, ""), argv


def test_head_of_a_render_reads_its_first_line_and_the_render_exits_0(tmp_path):
    """`render --output - | head -1`: 80 kB of manifests, more than a pipe holds, so the write fails."""
    subprocess.run([sys.executable, "-m", "maas_kubevirt", "render", "--output", "build"], cwd=tmp_path,
                   check=True, capture_output=True)
    (tmp_path / "values.yaml").write_text(f"seed:\n  file: {tmp_path / 'build' / 'seed'}\n"
                                          "ingress:\n  tls_secret: bmc-tls\n")   # no TLS warning on stderr
    result = subprocess.run(f"{sys.executable} -m maas_kubevirt --values values.yaml render --output - | head -1; "
                            "echo \"exit ${PIPESTATUS[0]}\" >&2", shell=True, executable="/bin/bash",
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith("# Rendered by maas-kubevirt") and result.stdout.count("\n") == 1
    assert result.stderr == "exit 0\n"


@pytest.mark.parametrize("command", [[], *([name] for name in COMMANDS)], ids=lambda c: c[0] if c else "(none)")
def test_every_help_gives_examples_and_the_exit_status(command, capsys):
    """As man pages and kubectl's help: Examples, each a command line kept as written, then Exit status."""
    with pytest.raises(SystemExit):
        cli.main(command + ["--help"])
    out = capsys.readouterr().out
    examples = out.split("\nExamples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert examples and all(line.startswith("  maas-kubevirt ") or line.startswith("  sudo maas-kubevirt ")
                            or line.startswith("  source <(maas-kubevirt ") for line in examples), out
    assert "\nExit status: 0 " in out


def test_render_takes_no_o_which_is_a_format_elsewhere(capsys):
    """`render -o json` would have rendered into a directory named json: -o is -o FORMAT, as kubectl's."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["render", "-o", "json"])
    assert exited.value.code == 2
    assert "unrecognized arguments: -o" in capsys.readouterr().err


@pytest.mark.parametrize("shell, name", [("bash", "maas-kubevirt"), ("zsh", "_maas-kubevirt")])
def test_completion_prints_the_shipped_script_from_a_clone_or_the_package(shell, name, tmp_path, monkeypatch, capsys):
    from maas_kubevirt import completions

    assert cli.main(["completion", shell]) == 0
    assert capsys.readouterr().out == (ROOT / "completion" / name).read_text()
    # Installed: the data directory holds no completion/, the script is where the package put it.
    monkeypatch.setattr(completions, "data_dir", lambda: tmp_path)
    installed = tmp_path / "usr-share" / name
    monkeypatch.setitem(completions.INSTALLED, shell, installed)
    assert cli.main(["completion", shell]) == 1
    assert f"completion {shell}: {installed}: No such file or directory" in capsys.readouterr().err
    installed.parent.mkdir()
    installed.write_text("# the installed script\n")
    assert cli.main(["completion", shell]) == 0
    assert capsys.readouterr().out == "# the installed script\n"


def test_the_package_installs_the_completion_scripts_where_completion_reads_them():
    from maas_kubevirt import completions

    install = (ROOT / "debian" / "maas-kubevirt.install").read_text().splitlines()
    for shell, path in completions.INSTALLED.items():
        assert f"completion/{path.name} {str(path.parent).lstrip('/')}/" in install, shell
