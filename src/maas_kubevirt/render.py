"""values -> files: the commissioning script and the Kubernetes manifests of the bundle."""

from __future__ import annotations

import ast
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from maas_kubevirt import EXIT_OK, EXIT_USAGE, PROG, bmc_proxy, exposure, policies
from maas_kubevirt.console import error, warn
from maas_kubevirt import seed as seeds
from maas_kubevirt.paths import INSTALLED_VALUES, SCRIPT_NAME, data_dir, write_atomic
from maas_kubevirt.policies import KUSTOMIZATION_FILE, SEED_SECRET_FILE, render_kubernetes

# The output directory holding the seed is private; the others are readable (the files
# holding the seed inside them are 0600). Set explicitly: the umask must not decide.
PRIVATE_DIR, PUBLIC_DIR = 0o700, 0o755
_SETTINGS_LINE = re.compile(r"^SETTINGS = .*# replaced by maas-kubevirt render$", re.MULTILINE)
# Scripts run at enlistment: tagged enlisting (enlist_commissioning on) or bmc-config (off)
# (src/maasserver/models/scriptset.py); docs/explanation/design.md, "MAAS contracts". upload-script
# and doctor check them.
REQUIRED_TAGS = ("bmc-config", "enlisting")


def script_settings(values: dict) -> dict[str, str | bool]:
    """The values the commissioning script needs: no secret, since MAAS serves the script to anyone."""
    return {
        "domain": values["redfish"]["domain"],
        "check": values["redfish"]["check"],
        "manufacturer": values["smbios"]["manufacturer"],
        "rendered": True,
    }


def render_commissioning(values: dict) -> str:
    """The commissioning script with the values injected as Python literals; the same whatever the seed."""
    source = (data_dir() / "commissioning" / SCRIPT_NAME).read_text(encoding="utf-8")
    settings = script_settings(values)
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



def _embedded_settings(text: str) -> dict | None:
    """The literal assigned to SETTINGS at the top level of the script, if there is one."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SETTINGS"]:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def rendering_problem(text: str, values: dict, source: str) -> str | None:
    """Why text is not what ``render`` writes from these values, or None when it is.

    Only the names of differing settings are given, never a value: a secret must not be echoed.
    """
    render_again = f"run `{PROG} --values FILE render` with the values you pass here"
    settings = _embedded_settings(text)
    if settings is None:
        return f"{source}: not a script rendered by {PROG} (no SETTINGS): {render_again}"
    template = (data_dir() / "commissioning" / SCRIPT_NAME).read_text(encoding="utf-8")
    if text == template:
        return f"{source}: the unrendered commissioning script from the source tree: {render_again}"
    if text == render_commissioning(values):
        return None
    expected = script_settings(values)
    differing = sorted(key for key in set(expected) | set(settings) if expected.get(key) != settings.get(key))
    if differing:
        return (f"{source}: rendered from other values ({', '.join(differing)} differ from these): "
                f"{render_again}")
    return (f"{source}: its code differs from what {PROG} renders (another version, or edited): "
            f"{render_again}")


def make_directory(path: Path, mode: int) -> None:
    """Create path and its missing parents with mode, whatever the umask; leave existing ones."""
    missing = []
    for directory in [path, *path.parents]:
        if directory.exists():
            break
        missing.append(directory)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue
        os.chmod(directory, mode if directory == path else PUBLIC_DIR)


def render(values: dict, output: str | Path) -> list[Path]:
    """Render the whole bundle into the output directory, or the manifests to stdout for '-'.

    Everything is computed and checked before the first file is written.
    """
    if str(output) == "-":
        seed, _ = seeds.for_render(values, None)
        manifests = render_kubernetes(values, seed)
        documents = [text.rstrip("\n") + "\n" for name, text in manifests.items() if name != KUSTOMIZATION_FILE]
        sys.stdout.write("---\n".join(documents))
        return []
    output = Path(output)
    seed, new_seed_file = seeds.for_render(values, output)
    manifests = render_kubernetes(values, seed)
    script = render_commissioning(values)
    holds_seed = new_seed_file is not None or (output / seeds.SEED_FILE).exists()
    make_directory(output, PRIVATE_DIR if holds_seed else PUBLIC_DIR)
    make_directory(output / "commissioning", PUBLIC_DIR)
    make_directory(output / "kubernetes", PUBLIC_DIR)
    written = []
    stale = output / "kubernetes" / policies.EXAMPLE_NAMESPACE_FILE
    if policies.EXAMPLE_NAMESPACE_FILE not in manifests and stale.is_file() and not stale.is_symlink():
        # kubernetes.example_namespace false: a previous render's file would still be applied by
        # `kubectl apply -f DIR/kubernetes/` (the kustomization no longer lists it).
        stale.unlink()
    if new_seed_file is not None:
        write_atomic(new_seed_file, seed + "\n", mode=0o600)
    written.append(write_atomic(output / "commissioning" / SCRIPT_NAME, script, mode=0o755))
    for name, text in manifests.items():
        private = name == SEED_SECRET_FILE or seed in text
        written.append(write_atomic(output / "kubernetes" / name, text, mode=0o600 if private else 0o644))
    return written


def tls_warning(values: dict) -> str | None:
    """Why the BMC Ingresses may not be reachable by MAAS, when they name no certificate; else None."""
    ingress = values["ingress"]
    if values["exposure"] != "ingress" or ingress["tls_secret"] or ingress["cluster_issuer"]:
        return None
    return ("ingress.tls_secret and ingress.cluster_issuer are both empty: the BMC Ingresses name no certificate, "
            "and MAAS's Redfish driver reaches a BMC only over HTTPS on port 443; set one of them, or make sure the "
            f"controller of class {ingress['class_name']!r} serves these hosts over HTTPS with its default certificate")


# Which values file rendered an output directory: a later render with the built-in defaults
# (a bare `make` after `make VALUES=site.yaml`) would silently replace the site's bundle.
VALUES_SOURCE = ".values-source"


def overwrites_site(output: Path, given: str | None) -> str:
    """Why rendering the defaults into output would drop a site's values ("" when it would not)."""
    try:
        recorded = (output / VALUES_SOURCE).read_text(encoding="utf-8").strip()
    except OSError:
        return ""
    if not recorded or given:
        return ""
    return (f"{output}/ holds the bundle rendered from {recorded}; rendering the built-in defaults over it would "
            f"drop that site's values: give --values {recorded} (make VALUES={recorded}), or remove {output}/ "
            "to start from the defaults")


def main(values: dict, args: Any) -> int:
    """``render [--output DIR | -]``: render the bundle and print the next commands."""
    if str(args.output) != "-" and (problem := overwrites_site(Path(args.output), getattr(args, "values", None))):
        error(f"render: {problem}")
        return EXIT_USAGE
    previous = {} if str(args.output) == "-" else policies.cluster_policies(Path(args.output) / "kubernetes")
    # Whether render is about to generate the seed (seeds.for_render's rule), to announce it.
    seed_file = Path(args.output) / seeds.SEED_FILE
    generates = str(args.output) != "-" and not values["seed"]["file"] and not os.path.lexists(seed_file)
    written = render(values, args.output)
    if (problem := tls_warning(values)) is not None:
        warn(problem)
    if written:
        output = Path(args.output)
        given = getattr(args, "values", None)
        write_atomic(output / VALUES_SOURCE, (os.path.abspath(given) if given else "") + "\n")
        # What Kyverno would refuse to update in place, compared with the last render here.
        current = policies.cluster_policies(output / "kubernetes")
        recreate = policies.policies_to_recreate(previous, current)
        retired = sorted(set(previous) - set(current))
        command = sys.argv[0] if sys.argv[0].endswith(PROG) else PROG
        if getattr(args, "values", None):
            command += f" --values {shlex.quote(args.values)}"
        print(f"Rendered {len(written)} files into {output}/")
        bmc_policy = policies.POLICY_NAMES["bmc"]
        switched_from = exposure.rendered_exposure(previous.get(bmc_policy))
        if switched_from not in (None, values["exposure"]):
            print(exposure.switch_procedure(switched_from, values, output / "kubernetes", bmc_policy, command))
            recreate = [name for name in recreate if name != bmc_policy]
        if recreate or retired:
            print(policies.recreate_procedure(recreate, retired, output / "kubernetes", previous))
        if bmc_proxy.rendered(values):
            namespace = values["ingress"]["controller_namespace"]
            print(f"The BMC proxy ({bmc_proxy.FILE}) serves the BMC hosts alone: point the DNS records "
                  f"*.<ns>.{values['redfish']['domain']} at the address of Service {namespace}/{bmc_proxy.NAME}:")
            print(f"  kubectl -n {namespace} get service {bmc_proxy.NAME} -o jsonpath='{{.status.loadBalancer.ingress[0].ip}}'")
        if generates:
            print(f"Generated a new site seed in {seed_file} (mode 0600): every BMC password derives from it.")
            print("  Back it up now, somewhere safe and private: it is in no repository, and a lost seed means "
                  f"new passwords for every BMC. The MAAS region host needs the same file as its seed.file "
                  f"(e.g. {seeds.INSTALLED_SEED}).")
        print("Next steps:")
        print(f"  kubectl apply -k {output / 'kubernetes'}")
        print(f"  on the MAAS region host, with this release's package installed: "
              f"sudo {PROG} --values {INSTALLED_VALUES} upload-script")
    return EXIT_OK
