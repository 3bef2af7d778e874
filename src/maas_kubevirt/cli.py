"""The maas-kubevirt command line."""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from pathlib import Path
from types import ModuleType

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_PENDING, EXIT_USAGE, PROG, __version__
from maas_kubevirt.console import error
from maas_kubevirt.paths import SCRIPT_NAME
from maas_kubevirt.values import DEFAULT_VALUES_PATH, ValuesError, load_values

DEFAULT_OUTPUT = Path("build")


def _positive_seconds(text: str) -> int:
    try:
        seconds = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of seconds, found {text!r}") from None
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 second, found {seconds}")
    return seconds


VALUES_HELP = f"values file merged over the built-in defaults ({DEFAULT_VALUES_PATH})"
# --values after the command lands here (a dest of its own: argparse would otherwise let the
# subcommand's default overwrite a --values given before it); main() merges the two.
VALUES_AFTER = "values_after_command"


def _values_option() -> argparse.ArgumentParser:
    """--values as every subcommand takes it, after the command name (`render --values FILE`)."""
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--values", metavar="FILE", dest=VALUES_AFTER, default=argparse.SUPPRESS, help=VALUES_HELP)
    return shared


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Let Canonical MAAS manage KubeVirt virtual machines like bare-metal servers: "
        "render the Kyverno policies and the MAAS commissioning script, and reconcile MAAS machines.",
        epilog="Exit status: 0 success or nothing to do, 1 some actions failed, 2 usage or configuration error "
        f"({EXIT_PENDING}: changes pending, from `reconcile --dry-run --detailed-exitcode` only).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--values", metavar="FILE", help=VALUES_HELP + "; before or after the command")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    shared = [_values_option()]
    commands.required = True

    render = commands.add_parser(
        "render", parents=shared,
        help="render the bundle: Kubernetes manifests and the commissioning script",
        description="Render the Kyverno policies, RBAC, seed Secret and example namespace into "
        "DIR/kubernetes/, and the configured commissioning script into DIR/commissioning/. "
        "Without seed.file in the values, a seed is generated once as DIR/seed (mode 0600).",
    )
    render.add_argument(
        "--output", "-o", metavar="DIR", default=str(DEFAULT_OUTPUT),
        help="output directory, or '-' for one YAML stream of the manifests for `kubectl apply -f -` "
        "(default: %(default)s)",
    )

    reconcile = commands.add_parser(
        "reconcile", parents=shared,
        help="set the BMC password, rename, pool and commission the MAAS machines of KubeVirt VMs",
        description="Poll MAAS and, only for machines whose Redfish power address is exactly the bare "
        "host <vm>.<namespace>.<domain> (and no other machine claims that VM), set their BMC password "
        "(derived from the seed in seed.file) with that address, rename them <vm>-<namespace>, file "
        "them in the pool <namespace> and commission those in New, backing off a machine whose "
        "commission MAAS refuses. A derived password found on any other machine (a look-alike "
        "address, a duplicate claim, an address changed) is put back to the placeholder. Every "
        "change is written as a JSON audit record, and in the foreground each cycle says one line of "
        "counts on stderr (the service shows it in systemctl status). With reconciler.lease in the values, the "
        "reconcilers of a site (one per region host) elect one holder on a Kubernetes Lease: only "
        "it reads MAAS and writes to it, the others wait as standbys and say so in their log; "
        "--once then waits at most a lease duration and three retry periods for it, and --dry-run "
        "takes no part.",
        epilog="Exit status: 0 converged or nothing to do, 1 some actions failed, 2 usage or configuration "
        f"error; with --dry-run --detailed-exitcode, {EXIT_PENDING} changes pending (0 none).",
    )
    mode = reconcile.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="run one cycle and exit")
    mode.add_argument(
        "--interval", metavar="SECONDS", type=_positive_seconds,
        help="seconds between cycles (default: maas.interval from the values)",
    )
    reconcile.add_argument("--dry-run", action="store_true", help="print the plan as a table; change nothing")
    reconcile.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    reconcile.add_argument(
        "--detailed-exitcode", action="store_true",
        help=f"with --dry-run: exit {EXIT_PENDING} when changes are pending, 0 when there are none "
        "(as terraform plan -detailed-exitcode; 2 is taken by usage errors)",
    )

    status = commands.add_parser(
        "status", parents=shared,
        help="one row per MAAS machine that is a KubeVirt VM",
        description="List the MAAS machines whose power address names a KubeVirt BMC: VM, namespace, "
        "MAAS hostname, system_id, status, pool, power state, whether the password is the derived "
        "one, the power address (a look-alike marked suspect) and why a commission waits (from "
        "maas.audit_log); then every duplicate claim, and with reconciler.lease who holds the "
        "site's Lease and since when.",
    )
    status.add_argument("--json", action="store_true", help="print the machines as JSON instead of a table")

    upload = commands.add_parser(
        "upload-script", parents=shared,
        help="create or update the commissioning script in MAAS",
        description="Upload the commissioning script that render wrote from the same values "
        "to MAAS through its API (POST scripts/, or PUT scripts/{name} with the tags and timeout, "
        "which MAAS takes from a script only when creating it), then read it back: its tags must "
        "hold bmc-config and enlisting and its text must be the rendered one.",
        epilog="Exit status: 0 uploaded and verified, 1 MAAS failed or stored something else, "
        "2 usage or configuration error (a script not rendered from these values, a refused key).",
    )
    upload.add_argument(
        "--script", metavar="FILE", default=str(DEFAULT_OUTPUT / "commissioning" / SCRIPT_NAME),
        help="the rendered script (default: %(default)s)",
    )
    rotate = commands.add_parser(
        "rotate", parents=shared,
        help="give one VM new BMC credentials (a password that may have leaked)",
        description="Increment the credential generation of VM.NAMESPACE in the ConfigMap "
        "maas-kubevirt-rotations of the system namespace, through the cluster access of "
        "reconciler.lease (which it needs: the reconciler reads every generation there). Kyverno "
        "derives the VM's <vm>-bmc Secret anew within seconds, and the reconciler sets the new user "
        "and password in MAAS shortly after. The reconciler does the same by itself when it takes a "
        "password back from beside another address; `status` and doctor name every VM still to "
        "rotate. The rotation is written to maas.audit_log.",
        epilog="Exit status: 0 rotated, 1 the cluster refused or did not answer, 2 usage or configuration error.",
    )
    rotate.add_argument("serial", metavar="VM.NAMESPACE", help="the VM, as its SMBIOS serial names it")
    rotate.add_argument(
        "--kubeconfig", metavar="FILE",
        help="a kubeconfig allowed to update that ConfigMap (default: reconciler.lease.kubeconfig, or, "
        "when that file is not on this host, $KUBECONFIG or ~/.kube/config as kubectl reads them)",
    )
    route = commands.add_parser(
        "check-route", parents=shared,
        help="check the path from this host to one VM BMC, as the Redfish driver of MAAS takes it",
        description="Run on a MAAS rack controller (no MAAS API key needed): resolve <vm>.<namespace>.<domain>, "
        "compare the answer with bmc_proxy.address, connect to port 443, speak TLS with no SNI and no "
        "certificate check, and GET the unauthenticated Redfish service root /redfish/v1/, exactly as MAAS's "
        "Redfish driver reaches a BMC. One row per hop: what was found and, where it failed, what to do (a 403 "
        "names the source address this host connected from). Works for a VM that has never booted.",
        epilog="Examples:\n  maas-kubevirt check-route web1.tenant-a\n"
        "  maas-kubevirt check-route web1.tenant-a --address 10.0.0.40   # before DNS has the record\n"
        "  maas-kubevirt check-route web1.tenant-a -o json\n\n"
        "Exit status: 0 a Redfish service root answered, 1 a hop failed, 2 usage or configuration error.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    route.add_argument("serial", metavar="VM.NAMESPACE", help="the VM, as its SMBIOS serial names it")
    route.add_argument("--address", metavar="ADDRESS",
                       help="connect to this IP address (optionally ADDRESS:PORT, [IPv6]:PORT) instead of DNS's answer")
    route.add_argument("--source", metavar="ADDRESS",
                       help="connect from this local address (the rack controller's, toward the BMC proxy)")
    route.add_argument("-o", "--output", metavar="FORMAT", choices=("text", "json"), default="text",
                       help="text (a table) or json (default: %(default)s)")
    compose = commands.add_parser(
        "compose", parents=shared,
        help="make one VM of a pool now, as vm-host compose did in MAAS",
        description="Create one VirtualMachine of POOL (a pool of the values' pools list) through the pools' "
        "cluster access (reconciler.pools.kubeconfig), beyond the pool's ready spares but within its max. "
        "It boots from the network and enlists by itself; the reconciler sets its BMC credentials, names, "
        "files and commissions its machine as any VM's, and tags it with the pool's tags once Ready. "
        "Prints the VM, its namespace and where it stands; with --wait, once MAAS has its machine Ready, "
        "also its system_id and hostname.",
        epilog="Examples:\n  maas-kubevirt compose small\n  maas-kubevirt compose small --wait -o json\n\n"
        "Exit status: 0 made (with --wait: Ready), 1 the pool is at its max, the cluster refused, or --wait "
        "ran out or saw commissioning fail (the stage is named: VM created, no enlistment, New, "
        "Commissioning, Commissioning failed), 2 usage or configuration error.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compose.add_argument("pool", metavar="POOL", help="the pool's name (pools[].name)")
    compose.add_argument("--name", metavar="NAME", help="the VM's name, POOL-<suffix> (default: a random suffix)")
    compose.add_argument("--wait", action="store_true", help="return once MAAS has the machine Ready")
    compose.add_argument("--timeout", metavar="SECONDS", type=_positive_seconds, default=1800,
                         help="with --wait: how long to wait (default: %(default)s)")
    compose.add_argument("-o", "--output", metavar="FORMAT", choices=("text", "json"), default="text",
                         help="text (tab-separated) or json (default: %(default)s)")
    decompose = commands.add_parser(
        "decompose", parents=shared,
        help="delete a pool VM, its disk and its MAAS machine",
        description="Delete the MAAS machine MACHINE (a hostname or system_id), then its VM and the VM's disk. "
        "Only a machine whose VM a pool made (its pool label and the reconciler's proof, its MAC and its "
        "address) is deleted; a machine a user holds (Allocated, Deployed, ...) only with --force.",
        epilog="Examples:\n  maas-kubevirt decompose small-x7k2p-maas-vms\n  maas-kubevirt decompose 4y3h7p --force\n\n"
        "Exit status: 0 deleted, 1 refused (no pool made it, or a user holds it) or failed, 2 usage or "
        "configuration error.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    decompose.add_argument("machine", metavar="HOSTNAME|SYSTEM_ID", help="the machine to delete")
    decompose.add_argument("--force", action="store_true", help="delete it even when a user holds it")
    doctor = commands.add_parser(
        "doctor", parents=shared,
        help="check a whole site: MAAS, the cluster and the network",
        description="Check MAAS (version, administrator key, the commissioning script, "
        "enlist_commissioning, the seed file, duplicate claims, power passwords), the reconciler's "
        "lease (who holds it and when it was renewed; a warning when MAAS lists several region "
        "controllers and no lease is configured), the cluster "
        "(CRDs, Kyverno and its RBAC, the policies, the seed Secret, KubeMacPool labels, each VM's "
        "MACs, Secret, VirtualMachineBMC and Ingress allowlist), how many hosts ingress.source_ranges "
        "admits (a few: the rack controllers) and the network (DNS, Redfish). "
        "One row per check: ok, warn, fail or skip, what was found and the exact fix, the table fitted "
        "to the terminal's width (or COLUMNS) with those two columns wrapped. Read-only.",
        epilog="Exit status: 0 nothing fails, 1 some check fails, 2 usage or configuration error.",
    )
    doctor.add_argument(
        "--kubeconfig", metavar="FILE",
        help="kubeconfig of the cluster to check (read access is enough; default: $KUBECONFIG, a "
        "':'-separated list, else ~/.kube/config, as kubectl); without any the cluster checks are skipped",
    )
    doctor.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current one)")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON instead of a table")
    return parser


def _command(name: str) -> ModuleType:
    """The module of one command; imported on use, so `render` never loads the MAAS client."""
    module = {
        "render": "render",
        "reconcile": "loop",
        "status": "status",
        "upload-script": "upload",
        "doctor": "doctor",
        "rotate": "rotate",
        "check-route": "route",
        "compose": "compose",
        "decompose": "decompose",
    }[name]
    return importlib.import_module(f"maas_kubevirt.{module}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with --values taken from before or after the command (once)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    after = getattr(args, VALUES_AFTER, None)
    if hasattr(args, VALUES_AFTER):
        delattr(args, VALUES_AFTER)
    if after is not None:
        if args.values is not None and args.values != after:
            parser.error(f"--values given twice, {args.values!r} before the command and {after!r} after it: "
                         "give one values file")
        args.values = after
    if args.command == "reconcile" and not args.dry_run:
        given = [option for option, on in (("--json", args.json), ("--detailed-exitcode", args.detailed_exitcode)) if on]
        if given:
            parser.error(f"reconcile: {' and '.join(given)} only with --dry-run")
    return args


def _stdout_closed() -> bool:
    """Whether the reader of stdout has gone (`status | head -1`): a pipe whose other end is
    closed polls as an error. A broken pipe elsewhere (a socket) is a failure like any other."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit does not fail again on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            args = parse(argv)
        except SystemExit:   # --help, --version, a usage error: what argparse printed is flushed here
            sys.stdout.flush()
            raise
        values = load_values(args.values)
        code = _command(args.command).main(values, args)
        sys.stdout.flush()   # here, not at exit: a closed pipe is still ours to handle
        return code
    except ValuesError as failure:
        error(str(failure))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_FAILED
    except BrokenPipeError as failure:
        if _stdout_closed():   # as `git log | head` does: the reader had what it wanted
            _quiet_stdout()
            return EXIT_OK
        error(f"{failure.filename or ''}: {failure.strerror or failure}".lstrip(": "))
        return EXIT_FAILED
    except OSError as failure:
        error(f"{failure.filename or ''}: {failure.strerror or failure}".lstrip(": "))
        return EXIT_FAILED
    except Exception as failure:  # noqa: BLE001 - a traceback could carry secrets; say what failed instead
        if os.environ.get("MAAS_KUBEVIRT_DEBUG"):
            raise
        error(f"internal error: {type(failure).__name__}: {failure} (set MAAS_KUBEVIRT_DEBUG=1 for a traceback)")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
