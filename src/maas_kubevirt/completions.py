"""``maas-kubevirt completion bash|zsh``: print the shell completion script the package ships,
so that it can be sourced or saved where a shell without the package's copy loads it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from maas_kubevirt import EXIT_FAILED, EXIT_OK, PROG
from maas_kubevirt.console import error
from maas_kubevirt.paths import data_dir

# Where debian/maas-kubevirt.install puts each script: the loaders of bash-completion and of
# Debian's zsh look there, so the package keeps no second copy under /usr/share/maas-kubevirt.
INSTALLED = {
    "bash": Path("/usr/share/bash-completion/completions") / PROG,
    "zsh": Path("/usr/share/zsh/vendor-completions") / f"_{PROG}",
}


def script_path(shell: str) -> Path:
    """The script for shell: completion/ beside the data (a source tree, $MAAS_KUBEVIRT_DATA), else
    the installed package's."""
    beside = data_dir() / "completion" / INSTALLED[shell].name
    return beside if beside.is_file() else INSTALLED[shell]


def main(values: dict, args: Any) -> int:
    """``completion SHELL``: 0 printed, 1 the script is not where the package installs it."""
    path = script_path(args.shell)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as failure:
        error(f"completion {args.shell}: {path}: {failure.strerror or failure}: is the maas-kubevirt package "
              "installed? From a clone, the scripts are in completion/")
        return EXIT_FAILED
    sys.stdout.write(text)
    return EXIT_OK
