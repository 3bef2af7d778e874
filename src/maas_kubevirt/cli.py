"""The maas-kubevirt command line."""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
import textwrap
from pathlib import Path
from types import ModuleType

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_PENDING, EXIT_USAGE, PROG, __version__
from maas_kubevirt.console import OUTPUT_FORMATS, error
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


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, but an indented line (an example command) is kept as written: prose
    paragraphs are filled to the width as usual, so the man page and a terminal read alike."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        prose: list[str] = []

        def flush() -> None:
            if prose:
                out.extend(textwrap.wrap(" ".join(prose), width, initial_indent=indent, subsequent_indent=indent,
                                         break_on_hyphens=False))
                prose.clear()

        for line in text.splitlines():
            if line.startswith(" ") or not line.strip():
                flush()
                out.append(indent + line if line.strip() else "")
            else:
                prose.append(line.strip())
        flush()
        return "\n".join(out)


class _Parser(argparse.ArgumentParser):
    """The parser of the command and of each subcommand: its help keeps example lines as written."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def _epilog(examples: list[str], exit_status: str) -> str:
    """The Examples section (one command a line, as written) and the Exit status paragraph."""
    return "Examples:\n" + "".join(f"  {example}\n" for example in examples) + "\n" + exit_status


def _output_options(parser: argparse.ArgumentParser, what: str) -> None:
    """-o FORMAT as kubectl's (the table when not given), and --json, its deprecated alias."""
    parser.add_argument(
        "-o", "--output", metavar="FORMAT", choices=OUTPUT_FORMATS, default=None,
        help=f"print {what} as json, yaml or wide (every column, never wrapped) instead of the table",
    )
    parser.add_argument("--json", dest="output", action="store_const", const="json",
                        help="deprecated: the same as -o json")


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
    parser = _Parser(
        prog=PROG,
        description="Let Canonical MAAS manage KubeVirt virtual machines like bare-metal servers: "
        "render the Kyverno policies and the MAAS commissioning script, and reconcile MAAS machines.",
        epilog=_epilog([
            "maas-kubevirt --values site.yaml render --output build",
            "maas-kubevirt --values site.yaml doctor -o json",
            "maas-kubevirt --values site.yaml status --watch",
            "maas-kubevirt completion bash >~/.local/share/bash-completion/completions/maas-kubevirt",
        ], "Exit status: 0 success or nothing to do, 1 some actions failed, 2 usage or configuration error "
            f"({EXIT_PENDING}: changes pending, from `reconcile --dry-run --detailed-exitcode` only)."),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--values", metavar="FILE", help=VALUES_HELP + "; before or after the command")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    shared = [_values_option()]
    commands.required = True

    render = commands.add_parser(
        "render", parents=shared,
        help="render the bundle: Kubernetes manifests and the commissioning script",
        description="Render the Kyverno policies, RBAC, seed Secret and example namespace into "
        "DIR/kubernetes/, and the configured commissioning script into DIR/commissioning/. "
        "Without seed.file in the values, a seed is generated once as DIR/seed (mode 0600).",
        epilog=_epilog([
            "maas-kubevirt --values site.yaml render --output build",
            "maas-kubevirt --values site.yaml render --output - | kubectl apply -f -",
        ], "Exit status: 0 rendered, 1 a file could not be written, 2 usage or configuration error."),
    )
    # --output only: -o is the output format of the other commands, as kubectl's.
    render.add_argument(
        "--output", metavar="DIR", default=str(DEFAULT_OUTPUT),
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
        epilog=_epilog([
            "maas-kubevirt --values site.yaml reconcile --dry-run",
            "maas-kubevirt --values site.yaml reconcile --dry-run -o json --detailed-exitcode",
            "maas-kubevirt --values site.yaml reconcile --once",
        ], "Exit status: 0 converged or nothing to do, 1 some actions failed, 2 usage or configuration "
            f"error; with --dry-run --detailed-exitcode, {EXIT_PENDING} changes pending (0 none)."),
    )
    mode = reconcile.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="run one cycle and exit")
    mode.add_argument(
        "--interval", metavar="SECONDS", type=_positive_seconds,
        help="seconds between cycles (default: maas.interval from the values)",
    )
    reconcile.add_argument("--dry-run", action="store_true", help="print the plan as a table; change nothing")
    _output_options(reconcile, "the plan (with --dry-run)")
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
        epilog=_epilog([
            "maas-kubevirt --values site.yaml status",
            "maas-kubevirt --values site.yaml status -o yaml",
            "maas-kubevirt --values site.yaml status --watch --interval 10",
        ], "Exit status: 0 printed (with --watch: interrupted), 1 MAAS could not be read, 2 usage or "
            "configuration error or the API key was refused."),
    )
    _output_options(status, "the machines")
    status.add_argument("-w", "--watch", action="store_true",
                        help="print again every --interval seconds, until interrupted (Ctrl-C: exit 0)")
    status.add_argument("--interval", metavar="SECONDS", type=_positive_seconds, default=None,
                        help="with --watch: seconds between two prints (default: 5)")

    upload = commands.add_parser(
        "upload-script", parents=shared,
        help="create or update the commissioning script in MAAS",
        description="Render the commissioning script from the values (or take --script, which "
        "render must have written from the same values) and upload it to MAAS through its API "
        "(POST scripts/, or PUT scripts/{name} with the tags and timeout, "
        "which MAAS takes from a script only when creating it), then read it back: its tags must "
        "hold bmc-config and enlisting and its text must be the rendered one.",
        epilog=_epilog([
            "sudo maas-kubevirt --values /etc/maas-kubevirt/values.yaml upload-script",
            "maas-kubevirt --values site.yaml upload-script --script build/commissioning/31-kubevirt-bmc-config",
        ], "Exit status: 0 uploaded and verified, 1 MAAS failed or stored something else, "
            "2 usage or configuration error (a script not rendered from these values, a refused key)."),
    )
    upload.add_argument(
        "--script", metavar="FILE", default=None,
        help="a script render wrote from these values, e.g. build/commissioning/%s (default: render it "
        "here from the values)" % SCRIPT_NAME,
    )
    rotate = commands.add_parser(
        "rotate", parents=shared,
        help="give one VM new BMC credentials (a password that may have leaked)",
        description="Increment the credential generation of VM.NAMESPACE in the ConfigMap "
        "maas-kubevirt-rotations of the system namespace. It needs reconciler.lease in the values, on a "
        "workstation too: the reconciler reads every generation through the lease's cluster access, and "
        "without it would set the old password back. It writes through the lease's kubeconfig, or where "
        "that file is not on this host (a workstation) through --kubeconfig, $KUBECONFIG or ~/.kube/config. "
        "Kyverno "
        "derives the VM's <vm>-bmc Secret anew within seconds, and the reconciler sets the new user "
        "and password in MAAS shortly after. The reconciler does the same by itself when it takes a "
        "password back from beside another address; `status` and doctor name every VM still to "
        "rotate. The rotation is written to maas.audit_log.",
        epilog=_epilog([
            "sudo maas-kubevirt --values /etc/maas-kubevirt/values.yaml rotate web1.vms",
            "maas-kubevirt --values site.yaml rotate web1.vms --kubeconfig ~/.kube/admin.conf",
        ], "Exit status: 0 rotated, 1 the cluster refused or did not answer, 2 usage or configuration error "
            "(no reconciler.lease in the values, no usable kubeconfig)."),
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
        epilog=_epilog([
            "maas-kubevirt check-route web1.tenant-a",
            "maas-kubevirt check-route web1.tenant-a --address 10.0.0.40   # before DNS has the record",
            "maas-kubevirt check-route web1.tenant-a -o json",
        ], "Exit status: 0 a Redfish service root answered, 1 a hop failed, 2 usage or configuration error."),
    )
    route.add_argument("serial", metavar="VM.NAMESPACE", help="the VM, as its SMBIOS serial names it")
    route.add_argument("--address", metavar="ADDRESS",
                       help="connect to this IP address (optionally ADDRESS:PORT, [IPv6]:PORT) instead of DNS's answer")
    route.add_argument("--source", metavar="ADDRESS",
                       help="connect from this local address (the rack controller's, toward the BMC proxy)")
    route.add_argument("-o", "--output", metavar="FORMAT", choices=("text", "json", "yaml"), default="text",
                       help="text (a table), json or yaml (default: %(default)s)")
    compose = commands.add_parser(
        "compose", parents=shared,
        help="make one VM of a pool now, as vm-host compose did in MAAS",
        description="Create one VirtualMachine of POOL (a pool of the values' pools list) through the pools' "
        "cluster access (reconciler.pools.kubeconfig), beyond the pool's ready spares but within its max. "
        "It boots from the network and enlists by itself; the reconciler sets its BMC credentials, names, "
        "files and commissions its machine as any VM's, and tags it with the pool's tags once Ready. "
        "Prints the VM, its namespace and where it stands; with --wait, once MAAS has its machine Ready, "
        "also its system_id and hostname. With --name of a VM the pool already made, it makes none and "
        "reports on that one (with --wait, waits for it): run the same command again after a timeout.",
        epilog=_epilog([
            "maas-kubevirt compose small",
            "maas-kubevirt compose small --wait -o json",
            "maas-kubevirt compose small --name small-1 --wait   # again: waits for small-1, makes no other",
        ], "Exit status: 0 made or found (with --wait: Ready), 1 the pool is at its max, the cluster refused, or --wait "
        "ran out or saw commissioning fail (the stage is named: VM created, no enlistment, New, "
        "Commissioning, Commissioning failed), 2 usage or configuration error."),
    )
    compose.add_argument("pool", metavar="POOL", help="the pool's name (pools[].name)")
    compose.add_argument("--name", metavar="NAME", help="the VM's name, POOL-<suffix> (default: a random suffix); "
                         "a VM of that name the pool made already is reported on, not made again")
    compose.add_argument("--wait", action="store_true", help="return once MAAS has the machine Ready")
    compose.add_argument("--timeout", metavar="SECONDS", type=_positive_seconds, default=1800,
                         help="with --wait: how long to wait (default: %(default)s)")
    compose.add_argument("-o", "--output", metavar="FORMAT", choices=("text", "json", "yaml"), default="text",
                         help="text (tab-separated), json (one line) or yaml (default: %(default)s)")
    decompose = commands.add_parser(
        "decompose", parents=shared,
        help="delete a pool VM, its disk and its MAAS machine",
        description="Delete the MAAS machine MACHINE (a hostname or system_id), then its VM and the VM's disk. "
        "Only a machine whose VM a pool made (its pool label and the reconciler's proof, its MAC and its "
        "address) is deleted; a machine a user holds (Allocated, Deployed, ...) only with --force.",
        epilog=_epilog([
            "maas-kubevirt decompose small-x7k2p-maas-vms",
            "maas-kubevirt decompose 4y3h7p --force",
        ], "Exit status: 0 deleted, 1 refused (no pool made it, or a user holds it) or failed, 2 usage or "
            "configuration error."),
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
        "to the terminal's width (or COLUMNS; piped, 120 columns) with those two columns wrapped. Read-only.",
        epilog=_epilog([
            "maas-kubevirt --values site.yaml doctor",
            "maas-kubevirt --values site.yaml doctor --kubeconfig ~/.kube/config -o json",
            "maas-kubevirt --values site.yaml doctor -o wide | grep fail",
        ], "Exit status: 0 nothing fails, 1 some check fails, 2 usage or configuration error."),
    )
    doctor.add_argument(
        "--kubeconfig", metavar="FILE",
        help="kubeconfig of the cluster to check (read access is enough; default: $KUBECONFIG, a "
        "':'-separated list, else ~/.kube/config, as kubectl); without any the cluster checks are skipped",
    )
    doctor.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current one)")
    _output_options(doctor, "the checks")
    completion = commands.add_parser(
        "completion", parents=shared,
        help="print the shell completion script for bash or zsh",
        description="Print the completion script the package installs for SHELL (from the source tree "
        "when run from a clone), to source it or save it where the shell loads completions.",
        epilog=_epilog([
            "source <(maas-kubevirt completion bash)",
            "maas-kubevirt completion zsh >~/.zfunc/_maas-kubevirt   # a directory on $fpath",
        ], "Exit status: 0 printed, 1 the script is not installed, 2 usage error."),
    )
    completion.add_argument("shell", metavar="SHELL", choices=("bash", "zsh"), help="bash or zsh")
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
        "completion": "completions",
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
        given = [option for option, on in (("-o/--json", args.output), ("--detailed-exitcode", args.detailed_exitcode))
                 if on]
        if given:
            parser.error(f"reconcile: {' and '.join(given)} only with --dry-run")
    if args.command == "status" and args.interval is not None and not args.watch:
        parser.error("status: --interval only with --watch")
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
