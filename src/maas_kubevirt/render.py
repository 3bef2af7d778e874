"""values -> files: the commissioning script and the Kubernetes manifests of the bundle."""

from __future__ import annotations

import ast
import re
import secrets
import shlex
import sys
from pathlib import Path
from typing import Any

from maas_kubevirt import EXIT_OK, PROG, policies
from maas_kubevirt.paths import SCRIPT_NAME, data_dir, write_atomic
from maas_kubevirt.policies import KUSTOMIZATION_FILE, SEED_SECRET_FILE, render_kubernetes
from maas_kubevirt.values import ValuesError

SEED_FILE = "seed"
_SETTINGS_LINE = re.compile(r"^SETTINGS = .*# replaced by maas-kubevirt render$", re.MULTILINE)


def script_settings(values: dict, seed: str) -> dict[str, str]:
    """The values the commissioning script needs, as plain strings."""
    return {
        "domain": values["redfish"]["domain"],
        "scheme": values["redfish"]["scheme"],
        "username": values["redfish"]["username"],
        "check": values["redfish"]["check"],
        "manufacturer": values["smbios"]["manufacturer"],
        "seed": seed,
    }


def render_commissioning(values: dict, seed: str) -> str:
    """The commissioning script with the values injected as Python literals."""
    source = (data_dir() / "commissioning" / SCRIPT_NAME).read_text(encoding="utf-8")
    settings = script_settings(values, seed)
    line = f"SETTINGS = {settings!r}  # replaced by maas-kubevirt render"
    rendered, count = _SETTINGS_LINE.subn(lambda _: line, source)
    if count != 1:
        raise RuntimeError(f"{SCRIPT_NAME}: expected exactly one SETTINGS line to replace, found {count}")
    assigned = [
        node.value
        for node in ast.parse(rendered).body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SETTINGS"]
    ]
    if len(assigned) != 1 or ast.literal_eval(assigned[0]) != settings:
        raise RuntimeError(f"{SCRIPT_NAME}: the injected SETTINGS do not read back as written")
    return rendered


def read_seed(values: dict, output: Path | None) -> str:
    """The site secret: seed.file, else <output>/seed, generated there (mode 0600) the first time."""
    configured = values["seed"]["file"]
    if configured:
        path = Path(configured)
    elif output is None:
        raise ValuesError(
            ["seed.file: expected a seed file when rendering to stdout, found an empty string "
             "(render to a directory once and point seed.file at <directory>/seed)"]
        )
    else:
        path = output / SEED_FILE
        if not path.exists():
            write_atomic(path, secrets.token_hex(32) + "\n", mode=0o600)
    try:
        seed = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ValuesError([f"seed.file: expected a readable seed file, found {path} ({error.__class__.__name__})"]) from None
    if len(seed) < 16 or not seed.isprintable():
        raise ValuesError([f"seed.file: expected at least 16 printable characters in {path}, found fewer"])
    return seed


def render(values: dict, output: str | Path) -> list[Path]:
    """Render the whole bundle into the output directory, or the manifests to stdout for '-'."""
    if str(output) == "-":
        seed = read_seed(values, None)
        manifests = render_kubernetes(values, seed)
        documents = [text.rstrip("\n") + "\n" for name, text in manifests.items() if name != KUSTOMIZATION_FILE]
        sys.stdout.write("---\n".join(documents))
        return []
    output = Path(output)
    seed = read_seed(values, output)
    manifests = render_kubernetes(values, seed)
    script = render_commissioning(values, seed)
    written = [write_atomic(output / "commissioning" / SCRIPT_NAME, script, mode=0o700)]
    for name, text in manifests.items():
        private = name == SEED_SECRET_FILE or seed in text
        written.append(write_atomic(output / "kubernetes" / name, text, mode=0o600 if private else 0o644))
    return written


def main(values: dict, args: Any) -> int:
    """``render [--output DIR | -]``: render the bundle and print the next commands."""
    previous = {} if str(args.output) == "-" else policies.cluster_policies(Path(args.output) / "kubernetes")
    written = render(values, args.output)
    if written:
        output = Path(args.output)
        # What Kyverno would refuse to update in place, compared with the last render here.
        current = policies.cluster_policies(output / "kubernetes")
        recreate = policies.policies_to_recreate(previous, current)
        retired = sorted(set(previous) - set(current))
        script = output / "commissioning" / SCRIPT_NAME
        command = sys.argv[0] if sys.argv[0].endswith(PROG) else PROG
        if getattr(args, "values", None):
            command += f" --values {shlex.quote(args.values)}"
        print(f"Rendered {len(written)} files into {output}/")
        if recreate or retired:
            print(policies.recreate_procedure(recreate, retired, output / "kubernetes", previous))
        print("Next steps:")
        print(f"  kubectl apply -k {output / 'kubernetes'}")
        print(f"  MAAS_API_KEY=... {command} upload-script --script {script}")
        print(f"     (or: maas $PROFILE node-scripts create name={SCRIPT_NAME} script@={script})")
    return EXIT_OK
