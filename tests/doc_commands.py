"""The commands of the documentation, as test_docs.py runs them.

`commands(page)` reads every ```sh block of a page and returns its commands in page order:
comments and blank lines dropped, a line continued with a trailing `\\` (or ending in `|`, `&&`
or `||`) joined to the next, each command with the line it starts on. `Shell` runs commands one
after another in a sandbox, keeping the shell's variables between them (`NS=... SA=...`, `export
MAAS_API_KEY=...`), so a page's commands run as an operator would type them, in order.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")))


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str   # without comments, continuation lines joined by one space

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def strip_comment(line: str) -> str:
    """The line without its shell comment: a `#` at a word's start, outside quotes."""
    quote = None
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def commands(page: str, text: str | None = None) -> list[Command]:
    text = (ROOT / page).read_text() if text is None else text
    found: list[Command] = []
    in_sh = False
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not in_sh:
            if raw.strip() == "```sh":
                in_sh = True
            elif raw.lstrip().startswith("```sh"):
                raise ValueError(f"{page}:{number}: a sh block must open with a line of just ```sh")
            continue
        if raw.strip() == "```":
            if pending:
                raise ValueError(f"{page}:{start}: the block ends inside a continued command")
            in_sh = False
            continue
        line = strip_comment(raw)
        if not line.strip() and not pending:
            continue
        if not pending:
            start = number
        continued = line.endswith("\\")
        part = line[:-1].strip() if continued else line.strip()
        pending.append(part)
        if continued or re.search(r"(\|\||&&|\|)$", part):
            continue
        found.append(Command(page, start, " ".join(p for p in pending if p)))
        pending = []
    if in_sh:
        raise ValueError(f"{page}: a ```sh block is not closed")
    return found


class CommandFailed(AssertionError):
    pass


@dataclass
class Result:
    command: Command
    returncode: int
    stdout: str
    stderr: str


class Shell:
    """Runs commands one at a time in `cwd`, with `env`, keeping exported and assigned variables
    between them (the state file is re-read before each command). `prefix` (e.g. nsenter into a
    mount namespace) goes in front of the bash that runs each command."""

    def __init__(self, cwd: Path, env: dict[str, str], state: Path, prefix: list[str] | None = None):
        self.cwd, self.env, self.state, self.prefix = cwd, env, state, prefix or []
        state.write_text("")

    def run(self, command: Command | str, codes=(0,), timeout: float = 600, text: str | None = None) -> Result:
        if isinstance(command, str):
            command = Command("(test)", 0, command)
        script = text if text is not None else command.text
        # set -a: assignments such as NS=... become exported, so the next command sees them.
        # Only what the commands set is kept: not the test's own variables (DOCS_*, PATH, ...),
        # which the next command gets afresh from env.
        wrapper = ('set -a; . "$DOCS_STATE"; set +a; set -o pipefail; set -a\n'
                   'eval "$DOCS_COMMAND"; rc=$?\nset +a\n'
                   'export -p | grep -Ev "^declare -x (DOCS_[A-Z_]*|PATH|HOME|KUBECONFIG|PWD|OLDPWD|SHLVL|_)(=|$)"'
                   ' >"$DOCS_STATE"; exit $rc')
        env = {**self.env, "DOCS_STATE": str(self.state), "DOCS_COMMAND": script}
        result = subprocess.run([*self.prefix, "bash", "--noprofile", "--norc", "-c", wrapper], cwd=self.cwd,
                                env=env, capture_output=True, text=True, timeout=timeout)
        outcome = Result(command, result.returncode, result.stdout, result.stderr)
        if result.returncode not in codes:
            raise CommandFailed(
                f"{command} exited {result.returncode} (expected {' or '.join(map(str, codes))})"
                + (f"\n  ran as: {script}" if script != command.text else "")
                + f"\n--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-3000:]}")
        return outcome


def quote(path: Path | str) -> str:
    return shlex.quote(str(path))


def copy_tree(destination: Path) -> Path:
    """The files of this checkout git tracks or would track (uncommitted work included, build/
    and .venv/ not), copied with their times, plus an empty git repository there (tools/build-deb
    lists the tree with git ls-files)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".",
                             ":!build/", ":!.venv/"], cwd=ROOT, capture_output=True, check=True).stdout
    import shutil
    for name in listed.decode().split("\0"):
        if not name or not (ROOT / name).is_file():
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    subprocess.run(["git", "init", "-q", str(destination)], check=True)
    return destination


def environ_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}
