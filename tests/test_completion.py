"""Shell completion: completion/maas-kubevirt (bash) and completion/_maas-kubevirt (zsh), run for real.

The commands, options and option values they must offer are read from the CLI's argparse
parser, so a completion script that misses one, or offers one the CLI does not have, fails
here. bash completes through bash-completion's own loader and helpers, as an installed
system runs it; zsh through compinit and a completion widget on a pseudo-terminal, each
match recorded as the completion system adds it. Either shell missing: skip (fail under CI=true).
"""

from __future__ import annotations

import argparse
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from conftest import require, require_tool
from maas_kubevirt import PROG, cli

ROOT = Path(__file__).resolve().parents[1]
COMPLETION = ROOT / "completion"
BASH_SCRIPT = COMPLETION / PROG
ZSH_SCRIPT = COMPLETION / f"_{PROG}"
BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")

# What the completion offers for a value, by the metavar the parser gives it. A new metavar
# fails the tests until both scripts and this table say how to complete it.
FILES, DIRECTORIES, NOTHING = "files", "directories", "nothing"
METAVAR_KIND = {"FILE": FILES, "DIR": DIRECTORIES, "SECONDS": NOTHING, "NAME": NOTHING, "VM.NAMESPACE": NOTHING,
                "POOL": NOTHING, "HOSTNAME|SYSTEM_ID": NOTHING, "ADDRESS": NOTHING}

# The directory every completion runs in: one file and one directory.
A_FILE, A_DIRECTORY = "site-values.yaml", "out"


# --- the parser, as the completion must see it -------------------------------------------

def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))


PARSER = cli.build_parser()
COMMANDS: dict[str, argparse.ArgumentParser] = dict(_subcommands(PARSER).choices)
COMMAND_HELP = {action.dest: action.help for action in _subcommands(PARSER)._choices_actions}


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {string for action in parser._actions for string in action.option_strings}


def value_options(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    return [(string, action) for action in parser._actions if action.option_strings and action.nargs != 0
            for string in action.option_strings]


def positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction)]


def expected_values(action: argparse.Action) -> set[str]:
    """What completing this action's value offers in the completion directory."""
    if action.choices is not None:
        return {str(choice) for choice in action.choices}
    kind = METAVAR_KIND.get(action.metavar)
    assert kind, (f"{action.dest} has metavar {action.metavar!r}: say how it completes in completion/ "
                  "and in METAVAR_KIND")
    return {FILES: {A_FILE, A_DIRECTORY}, DIRECTORIES: {A_DIRECTORY}, NOTHING: set()}[kind]


# (the command, or None for before it; the option; its action), for every option that takes a value
VALUE_CASES = [(None, option, action) for option, action in value_options(PARSER)] + [
    (name, option, action) for name, command in COMMANDS.items() for option, action in value_options(command)]


# --- the shells ------------------------------------------------------------------------------

class Bash:
    """Completes a command line as bash does: bash-completion loads the script on demand."""

    # bash-completion's loader looks in $BASH_COMPLETION_USER_DIR/completions first.
    DRIVER = r"""
source "$1" || exit 90
__load_completion "$2" || exit 91
spec=$(complete -p "$2") || exit 92
function=${spec#*-F }; function=${function%% *}
shift 2
COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE=$LINE; COMP_POINT=${#LINE}
"$function" "${COMP_WORDS[0]}" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"""

    def __init__(self, cwd: Path, user_dir: Path):
        self.bash = require_tool("bash")
        require(BASH_COMPLETION.is_file(), f"bash-completion is not installed ({BASH_COMPLETION} is missing: "
                "apt-get install bash-completion; make deps)")
        (user_dir / "completions").mkdir(parents=True)
        (user_dir / "completions" / PROG).symlink_to(BASH_SCRIPT)
        self.cwd, self.user_dir = cwd, user_dir

    def complete(self, args: list[str], current: str, joined: bool = False) -> set[str]:
        # bash splits `--values=x` into three words ('=' is in COMP_WORDBREAKS)
        words = [PROG, *args, "=", current] if joined else [PROG, *args, current]
        line = " ".join([PROG, *args]) + ("=" if joined else " ") + current
        env = {"PATH": os.environ["PATH"], "HOME": str(self.cwd), "LINE": line,
               "BASH_COMPLETION_USER_DIR": str(self.user_dir)}
        result = subprocess.run([self.bash, "--norc", "--noprofile", "-c", self.DRIVER, "bash",
                                 str(BASH_COMPLETION), PROG, *words],
                                cwd=self.cwd, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and not result.stderr, f"bash completing {line!r}: {result}"
        return {match.rstrip("/") for match in result.stdout.splitlines() if match}


class Zsh:
    """An interactive zsh on a pseudo-terminal whose Tab runs the completion system and records
    each match it adds (compadd called to collect matches, with -O, -A or -D, adds none)."""

    END = "::end of matches::"
    ZSHRC = r"""
fpath=($COMPLETION_DIR $fpath)
autoload -Uz compinit && compinit -u -D
compadd() {
  local -i end=${@[(i)(-|--)]}
  if (( ${${@[1,end-1]}[(I)-[OAD]*]} )); then
    builtin compadd "$@"
    return
  fi
  local -a added
  builtin compadd -A added "$@"
  (( $#added )) && print -rl -- $added >>| $CAPTURE
  builtin compadd "$@"
}
record-completion() {
  : >| $CAPTURE
  zle complete-word
  print -r -- '%s' >>| $CAPTURE
}
zle -N record-completion
bindkey '^I' record-completion
PS1='> '
"""

    def __init__(self, cwd: Path, home: Path):
        zsh = require_tool("zsh", "zsh is not installed (apt-get install zsh; make deps)")
        (home / ".zshrc").write_text(self.ZSHRC % self.END)
        self.capture = home / "capture"
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "ZDOTDIR": str(home), "TERM": "xterm",
               "CAPTURE": str(self.capture), "COMPLETION_DIR": str(COMPLETION)}
        self.terminal, shell_side = pty.openpty()
        self.process = subprocess.Popen([zsh, "-i"], stdin=shell_side, stdout=shell_side, stderr=shell_side,
                                        cwd=cwd, env=env, start_new_session=True)
        os.close(shell_side)
        self.screen = b""

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        os.close(self.terminal)

    def complete(self, args: list[str], current: str, joined: bool = False) -> set[str]:
        line = " ".join([PROG, *args]) + ("=" if joined else " ") + current
        self.capture.unlink(missing_ok=True)
        os.write(self.terminal, line.encode() + b"\t")
        deadline = time.monotonic() + 60   # one completion takes milliseconds
        while not (self.capture.exists() and self.capture.read_text().endswith(self.END + "\n")):
            assert self.process.poll() is None, f"zsh exited completing {line!r}: {self.screen[-2000:]!r}"
            assert time.monotonic() < deadline, f"zsh did not complete {line!r}: {self.screen[-2000:]!r}"
            ready, _, _ = select.select([self.terminal], [], [], 0.05)
            if ready:   # the screen is read, or zsh would block writing it
                self.screen += os.read(self.terminal, 65536)
        os.write(self.terminal, b"\x15")   # ^U: the next line starts empty
        return {match.rstrip("/") for match in self.capture.read_text().splitlines()[:-1]}


@pytest.fixture(scope="module")
def completing(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("completing")
    (cwd / A_FILE).touch()
    (cwd / A_DIRECTORY).mkdir()
    return cwd


@pytest.fixture(scope="module")
def bash(completing, tmp_path_factory) -> Bash:
    return Bash(completing, tmp_path_factory.mktemp("bash-completion"))


@pytest.fixture(scope="module")
def zsh(completing, tmp_path_factory):
    shell = Zsh(completing, tmp_path_factory.mktemp("zsh-home"))
    try:
        yield shell
    finally:
        shell.close()


@pytest.fixture(params=["bash", "zsh"])
def shell(request) -> Bash | Zsh:
    return request.getfixturevalue(request.param)


# --- what each shell offers ------------------------------------------------------------------

def test_the_commands_are_the_parsers(shell):
    assert shell.complete([], "") == set(COMMANDS)
    assert shell.complete([], "re") == {name for name in COMMANDS if name.startswith("re")}


def test_the_commands_follow_a_values_file(shell):
    assert shell.complete(["--values", A_FILE], "") == set(COMMANDS)


def test_the_options_before_the_command_are_the_parsers(shell):
    assert shell.complete([], "-") == option_strings(PARSER)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_options_of_each_command_are_the_parsers(shell, command):
    assert shell.complete([command], "-") == option_strings(COMMANDS[command])
    assert shell.complete(["--values", A_FILE, command], "--") == {
        option for option in option_strings(COMMANDS[command]) if option.startswith("--")}


@pytest.mark.parametrize("command, option, action", VALUE_CASES,
                         ids=[f"{command or '(none)'}-{option}" for command, option, _ in VALUE_CASES])
def test_an_options_value_completes_as_its_metavar_says(shell, command, option, action):
    """--values FILE before or after the command, render's DIR, a number or name: nothing."""
    args = [command, option] if command else [option]
    assert shell.complete(args, "") == expected_values(action)
    if option.startswith("--"):
        assert shell.complete(args, "", joined=True) == expected_values(action)


@pytest.mark.parametrize("command", sorted(name for name, parser in COMMANDS.items() if positionals(parser)))
def test_a_positional_completes_as_its_metavar_says(shell, command):
    first = positionals(COMMANDS[command])[0]
    assert shell.complete([command], "") == expected_values(first)


EXCLUSIVE = [(name, group) for name, parser in COMMANDS.items() for group in parser._mutually_exclusive_groups]


@pytest.mark.parametrize("command, group", EXCLUSIVE, ids=[name for name, _ in EXCLUSIVE])
def test_zsh_leaves_out_what_an_option_given_excludes(zsh, command, group):
    """--once and --interval are mutually exclusive: after either, zsh offers neither (bash offers
    every option of the command, as bash-completion's own completions do)."""
    excluded = {string for action in group._group_actions for string in action.option_strings}
    for given in group._group_actions:
        args = [command, given.option_strings[-1]] + (["1"] if given.nargs != 0 else [])
        assert zsh.complete(args, "-") == option_strings(COMMANDS[command]) - excluded

def test_zsh_describes_each_command_with_its_help():
    described = dict(re.findall(r"^\s+'([a-z-]+):(.+)'$", ZSH_SCRIPT.read_text(), re.M))
    assert described == COMMAND_HELP

