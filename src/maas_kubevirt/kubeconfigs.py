"""Which kubeconfig a command reads when none is given, as kubectl picks it: $KUBECONFIG (a
colon-separated list, merged), else ~/.kube/config."""

from __future__ import annotations

import os

ENV = "KUBECONFIG"
HOME_CONFIG = "~/.kube/config"


def default() -> tuple[str, str] | None:
    """(the files to read, joined by ':' as the kubernetes client takes them, and where they came
    from for messages), or None when $KUBECONFIG names no file that exists and ~/.kube/config does
    not exist. Like kubectl, a file of the list that does not exist is skipped."""
    listed = os.environ.get(ENV, "")
    if listed:
        found = [path for path in (os.path.expanduser(p) for p in listed.split(os.pathsep) if p)
                 if os.path.isfile(path)]
        return (os.pathsep.join(found), f"${ENV}") if found else None
    home = os.path.expanduser(HOME_CONFIG)
    return (home, HOME_CONFIG) if os.path.isfile(home) else None


def files(kubeconfig: str) -> list[str]:
    """The files of a kubeconfig setting: one path, or default()'s ':'-joined list."""
    return [path for path in kubeconfig.split(os.pathsep) if path]


def none_found() -> str:
    """Why default() found no kubeconfig, for messages: $KUBECONFIG naming only files that do not
    exist (kubectl then does not read ~/.kube/config either), or neither set nor there."""
    listed = [p for p in os.environ.get(ENV, "").split(os.pathsep) if p]
    if listed:
        return (f"${ENV} names {'a file that does' if len(listed) == 1 else 'files that do'} not exist "
                f"({', '.join(listed)}), and {HOME_CONFIG} is then not read, as by kubectl")
    return f"no ${ENV} is set and {HOME_CONFIG} does not exist"


def fix() -> str:
    """What to do when default() found none."""
    if os.environ.get(ENV):
        return f"point ${ENV} at an existing kubeconfig (or unset it to read {HOME_CONFIG}), or give --kubeconfig FILE"
    return f"give --kubeconfig FILE, or set ${ENV}"
