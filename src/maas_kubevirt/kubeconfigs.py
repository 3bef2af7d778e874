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
