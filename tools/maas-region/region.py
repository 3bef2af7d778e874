"""Run MAAS's region web application for the real-MAAS test tier, with the MAAS venv's python.

    region.py schema              create MAAS's schema (dbupgrade's steps but Temporal's own)
    region.py prepare --testing-libs DIR
                                  start up once, then add a synced boot resource and stop
    region.py serve --port PORT   start up and serve /MAAS/ on 127.0.0.1:PORT until SIGTERM

The database and the region's files come from the environment, as for regiond:
MAAS_REGION_CONFIG (regiond.conf: database_host/port/name/user, maas_url), MAAS_ROOT,
MAAS_DATA, MAAS_CACHE. tools/build-maas runs `schema` and `prepare` once for the cached
template; tests/realmaas.py runs `serve` on a copy of it.

The start-up is regiond's, cut down to the web application: MAAS's own thread pools, logging,
django.setup(), maasserver.start_up.start_up(master=True), then MAAS's WebApplicationService
(Django behind Twisted's WSGI resource, with the metadata status resource and its worker) on
TCP 127.0.0.1 instead of regiond's per-worker Unix socket, under Twisted's asyncio reactor on
uvloop as regiond runs. MAAS's database listener, database task and status worker services run;
its RPC service for rack controllers is registered but never listens; no DHCP, DNS, proxy,
image import or Temporal service is started. Workflow starts reach a Temporal stand-in that
accepts and records them (install_temporal_standin), as a region's Temporal server accepts them.

The one stub (see tests/realmaas.py): Node._power_control_node, where MAAS hands a power action
to a rack controller, after the request commits. The file named by MAAS_KUBEVIRT_POWER_STUB is
read at each power action, so a test switches it at run time:
- no file: MAAS's own code runs, and with no rack connected it fails as a region without racks;
- the file holds "rack": the rack stand-in (rack_stand_in) does what the rack's power workflow
  does: MAAS's own power driver from this tree (RedfishPowerDriver, its waiting policy and
  retries), as the rack's agent runs it (`maas.power <action> <driver>` then a query), with the
  power workflow's activity retry policy, and the Deferred fires with the workflow's result or
  fails with PowerActionFail, as _power_control_node's exec_power_workflow does, so MAAS's own
  success handling (the node's power state) and failure handling (_start_bmc_unavailable: revert
  and event) run. It skips only the rack selection (routable racks, RPC client, task queue);
- any other content: the action counts as handed off (the deferred goes on with nothing done).

Name resolution (install_bmc_names), for the stand-in only: with MAAS_KUBEVIRT_BMC_DOMAIN and
MAAS_KUBEVIRT_BMC_PORT set, the name `reactor` in provisioningserver.drivers.power.redfish, which
that module hands to Twisted's Agent and so to HostnameEndpoint, is the real reactor with another
nameResolver: a host under that domain on port 443 resolves to 127.0.0.1:<port> (the test
process's kubevirtBMC stand-in, tests/kubevirt_bmc.py), any other name or port to no address.
Nothing else in the process resolves differently; no system DNS, /etc/hosts or network is used.
The Host header stays the VM's host, on which the BMC Ingress routes (MAAS's driver sends no TLS
server name: its WebClientContextFactory replaces the callback that would).

`serve` also makes sure of an administrator (user `admin`) and writes its API key, as
consumer:token:secret, to $MAAS_DATA/admin.key; then it writes $MAAS_DATA/ready with the port.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

STUB_ENV = "MAAS_KUBEVIRT_POWER_STUB"
BMC_DOMAIN_ENV = "MAAS_KUBEVIRT_BMC_DOMAIN"
BMC_PORT_ENV = "MAAS_KUBEVIRT_BMC_PORT"
RACK = "rack"
ADMIN = "admin"


def install_reactor() -> None:
    """Twisted's asyncio reactor on uvloop, as MAAS's daemons install it before any other
    Twisted import (provisioningserver/server.py); MAAS's database listener relies on it."""
    import asyncio

    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    from twisted.internet import asyncioreactor

    asyncioreactor.install(asyncio.new_event_loop())


def die_with_parent() -> None:
    """SIGTERM when the process that started this one ends (as MAAS's region workers do), so a
    test session that is killed leaves no region behind."""
    import ctypes

    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def configure(verbosity: int = 1) -> None:
    """What RegionWorkerServiceMaker.makeService does before it populates the event loop."""
    from maasserver.utils import threads

    threads.install_default_pool()
    threads.install_database_pool()

    from provisioningserver import logger

    logger.configure(verbosity, logger.LoggingMode.COMMAND)

    import django

    django.setup()

    from django.conf import settings as django_settings

    from provisioningserver import settings

    settings.DEBUG = django_settings.DEBUG
    # A packaged MAAS reads its preseed templates from /etc/maas/preseeds (settings name it
    # without MAAS_ROOT): here, from their copy under MAAS_ROOT (see make_directories).
    django_settings.PRESEED_TEMPLATE_LOCATIONS = (
        str(Path(os.environ["MAAS_ROOT"]) / "etc" / "maas" / "preseeds"),)

    import crochet

    crochet.no_setup()

    # Modules whose import builds forms from models, which asks the database connection for its
    # features: imported here, before the reactor thread's connections are disabled.
    import maasserver.eventloop  # noqa: F401
    import maasserver.listener  # noqa: F401
    import maasserver.webapp  # noqa: F401
    import metadataserver.api_twisted  # noqa: F401


def fail_fast() -> None:
    """start_up retries every 3 s for ever on any error, as a service should; a test harness
    should stop and show the first one instead."""
    from maasserver import start_up

    inner = start_up.inner_start_up

    def inner_start_up(*args, **kwargs):
        try:
            return inner(*args, **kwargs)
        except Exception:
            import traceback

            traceback.print_exc()
            print("region: start-up failed (above)", file=sys.stderr, flush=True)
            os._exit(3)

    start_up.inner_start_up = inner_start_up


def make_directories() -> None:
    """What a packaged MAAS has under /var/lib/maas and /etc/maas, here under MAAS_ROOT and
    MAAS_DATA: its directories, and the files its package installs in /etc/maas (drivers.yaml,
    the preseed templates), from the source tree's package-files/."""
    import shutil

    for base, names in ((os.environ["MAAS_ROOT"], ("certificates",)),
                        (os.environ["MAAS_DATA"], ("image-storage",)),
                        (os.environ["MAAS_CACHE"], ())):
        for name in ("", *names):
            os.makedirs(os.path.join(base, name), exist_ok=True)
    etc = Path(os.environ["MAAS_ROOT"]) / "etc" / "maas"
    if not etc.exists():
        shutil.copytree(_source_root() / "package-files" / "etc" / "maas", etc)


def _source_root() -> Path:
    """MAAS's source tree (src/ and package-files/), found from the maasserver package."""
    import importlib.util

    return Path(importlib.util.find_spec("maasserver").origin).resolve().parents[2]


def _stub_mode() -> str | None:
    """None (MAAS's own code), RACK (the rack stand-in) or "handed-off", from the flag file."""
    flag = os.environ.get(STUB_ENV)
    try:
        with open(flag or "", encoding="utf-8") as file:
            content = file.read().strip()
    except OSError:
        return None
    return RACK if content == RACK else "handed-off"


def install_power_stub() -> None:
    from maasserver.models.node import Node

    original = Node._power_control_node

    def _power_control_node(self, defer, power_method_name, power_info, order=None):
        mode = _stub_mode()
        if mode == RACK:
            return rack_stand_in(self, defer, power_method_name, power_info)
        if mode is not None:
            print(f"power stub: {power_method_name} for {self.system_id} counted as handed off",
                  file=sys.stderr, flush=True)
            return defer
        return original(self, defer, power_method_name, power_info, order)

    Node._power_control_node = _power_control_node


# The rack's side of a power action in MAAS 3.6.5. The region runs a Temporal workflow
# (src/maastemporalworker/workflow/power.py: PowerOnWorkflow...) of one activity on the rack's
# agent, with RetryPolicy(maximum_attempts=3) and start_to_close_timeout
# POWER_ACTION_ACTIVITY_TIMEOUT (5 min); Temporal's default RetryPolicy waits 1 s, then twice as
# long (temporalio/common.py: initial_interval 1 s, backoff_coefficient 2). The agent's activity
# (src/maasagent/internal/power/service.go, powerCommand) runs `maas.power <command> <driver>
# --<param> <value>...` (src/provisioningserver/power_driver_command.py: the driver's action,
# then always a query, printed) and fails when the CLI fails or the state printed is not the
# one wanted (ErrWrongPowerState). MAAS 3.5 hands power actions to the same workflows, with the
# same policy and timeout (src/maasserver/workflow/power.py there, convert_power_action_to_power_
# workflow and execute_workflow from Node._power_control_node), and its agent runs the same
# command (src/maasagent/internal/power/service.go); what differs is the driver, which runs here
# from the release's own tree (3.5's Redfish driver retries a 401: see tests/test_real_maas.py).
POWER_COMMANDS = {  # workflow action -> (maas.power command, state the agent requires)
    "power_on": ("on", "on"),
    "power_off": ("off", "off"),
    "power_cycle": ("cycle", "on"),
    "power_query": ("status", None),
}
ACTIVITY_ATTEMPTS = 3
ACTIVITY_TIMEOUT = 5 * 60
ACTIVITY_RETRY_FIRST_WAIT = 1.0


def rack_stand_in(node, defer, power_method_name, power_info):
    """Chain on ``defer`` what _power_control_node chains once it has a rack (src/maasserver/models/
    node.py, cb_power_control): the power workflow, its result, and the node's power state."""
    from twisted.internet.defer import ensureDeferred

    from maasserver.utils.orm import transactional
    from maasserver.utils.threads import deferToDatabase

    node_id, system_id = node.id, node.system_id
    defer.addCallback(lambda _: ensureDeferred(_power_workflow(system_id, power_method_name, power_info)))

    @transactional
    def _update_node_power_state(result):  # as node.py's, after _handle_workflow_result
        from maasserver.models.node import Node

        Node.objects.get(id=node_id).update_power_state(result.get("state"))
        return result

    defer.addCallback(lambda result: deferToDatabase(_update_node_power_state, result))
    return defer


async def _power_workflow(system_id: str, power_method_name: str, power_info) -> dict:
    """The workflow's result {"state": ...}, or PowerActionFail as exec_power_workflow raises it
    (its cause: the failed activity's error, "exit status 1" when the CLI failed)."""
    from twisted.internet import reactor

    from provisioningserver.drivers.power import get_error_message
    from provisioningserver.drivers.power.registry import PowerDriverRegistry
    from provisioningserver.rpc.exceptions import PowerActionFail
    from provisioningserver.utils.twisted import pause

    command, wanted = POWER_COMMANDS[power_method_name]
    driver = PowerDriverRegistry.get_item(power_info.power_type)
    if driver is None:
        raise PowerActionFail(f"unknown power driver {power_info.power_type!r}")
    # _collect_context: each of the driver's settings, None when the agent passed none (it skips
    # system_id, null and empty values: fmtPowerOpts).
    params = power_info.power_parameters or {}
    context = {setting["name"]: (params.get(setting["name"]) or None) for setting in driver.settings}
    started = reactor.seconds()
    wait = ACTIVITY_RETRY_FIRST_WAIT
    for attempt in range(1, ACTIVITY_ATTEMPTS + 1):
        try:
            state = await _maas_power(driver, command, context).addTimeout(ACTIVITY_TIMEOUT, reactor)
        except Exception as error:  # the CLI would exit 1: its traceback goes to the agent's log
            cause = "exit status 1"
            print(f"rack stand-in: {power_method_name} for {system_id}, attempt {attempt}: "
                  f"{get_error_message(error)}", file=sys.stderr, flush=True)
        else:
            if wanted is None or state == wanted:
                print(f"rack stand-in: {power_method_name} for {system_id}: {state} after "
                      f"{reactor.seconds() - started:.1f} s", file=sys.stderr, flush=True)
                return {"state": state}
            cause = "BMC is in the wrong power state"
            print(f"rack stand-in: {power_method_name} for {system_id}, attempt {attempt}: {state}, "
                  f"not {wanted}", file=sys.stderr, flush=True)
        if attempt < ACTIVITY_ATTEMPTS:
            await pause(wait)
            wait *= 2
    raise PowerActionFail(cause)


def _maas_power(driver, command: str, context: dict):
    """What `maas.power <command>` does (power_driver_command._run): the action, then a query."""
    from twisted.internet.defer import ensureDeferred

    async def run():
        if command == "on":
            await driver.on(None, context)
        elif command == "off":
            await driver.off(None, context)
        elif command == "cycle":
            await driver.cycle(None, context)
        return await driver.query(None, context)

    return ensureDeferred(run())


def install_bmc_names() -> None:
    """For MAAS's Redfish driver alone, hosts under MAAS_KUBEVIRT_BMC_DOMAIN on port 443 resolve to
    127.0.0.1:MAAS_KUBEVIRT_BMC_PORT, and every other name to nothing (see the docstring above)."""
    domain = os.environ.get(BMC_DOMAIN_ENV, "").lower().strip(".")
    port = os.environ.get(BMC_PORT_ENV, "")
    if not (domain and port.isdigit()):
        return
    from twisted.internet import reactor
    from twisted.internet.address import IPv4Address
    from twisted.internet.interfaces import IHostnameResolver, IHostResolution
    from zope.interface import classImplements, implementer, providedBy

    from provisioningserver.drivers.power import redfish

    @implementer(IHostResolution)
    class Resolution:
        def __init__(self, name):
            self.name = name

        def cancel(self):
            pass

    @implementer(IHostnameResolver)
    class LoopbackBMCNames:
        # HostnameEndpoint connects to the port of each address resolved (twisted/internet/
        # endpoints.py, resolvedAddressesToEndpoints), so host:443 becomes 127.0.0.1:<port>.
        def resolveHostName(self, resolutionReceiver, hostName, portNumber=0, addressTypes=None,
                            transportSemantics="TCP"):
            resolution = Resolution(hostName)
            resolutionReceiver.resolutionBegan(resolution)
            if hostName.lower().rstrip(".").endswith("." + domain) and portNumber == 443:
                resolutionReceiver.addressResolved(IPv4Address("TCP", "127.0.0.1", int(port)))
            else:
                print(f"rack stand-in: {hostName}:{portNumber} resolves to nothing (only *.{domain}:443 "
                      "is served here)", file=sys.stderr, flush=True)
            resolutionReceiver.resolutionComplete()
            return resolution

    class RedfishReactor:
        """The reactor, but for its nameResolver (IReactorPluggableNameResolver, which HostnameEndpoint
        asks of the reactor Agent was given)."""

        def __init__(self, real, resolver):
            self._real = real
            self.nameResolver = resolver

        def __getattr__(self, name):
            return getattr(self._real, name)

    classImplements(RedfishReactor, *providedBy(reactor))
    proxy = RedfishReactor(reactor, LoopbackBMCNames())
    # redfish.py: `from twisted.internet import reactor`, used only in Agent(reactor, ...).
    redfish.reactor = proxy


# Temporal, as the region sees it (for every release): the client that get_client_async would
# connect to the region's Temporal server (maasserver.workflow.worker.worker in 3.6,
# maastemporalworker.worker in 3.7). Requests start fire-and-forget workflows after they commit
# (configure-DHCP when IP addresses change, tag evaluation...: maasserver.workflow.start_workflow,
# the service layer's TemporalService.post_commit); a server accepts the start and a worker runs
# the workflow later. The stand-in accepts and records each start, one JSON line in
# $MAAS_DATA/workflows.jsonl (the workflow's name, id, task queue and its parameter's type, never
# its values), and refuses everything else, loudly: a request that waits for a workflow's result
# fails here instead of passing unseen. (Power actions never reach it: see install_power_stub.)
WORKFLOW_LOG = "workflows.jsonl"
TEMPORAL_CLIENT_MODULES = ("maastemporalworker.worker", "maasserver.workflow.worker.worker")


class StartedWorkflow:
    """What Client.start_workflow returns, as far as the region reads it."""

    def __init__(self, workflow_id: str, run_id: str):
        self.id = workflow_id
        self.run_id = self.first_execution_run_id = self.result_run_id = run_id


class TemporalStandIn:
    """A connected Temporal client that takes workflow starts and nothing else."""

    def __init__(self, log: Path):
        import threading

        self._log, self._lock = log, threading.Lock()

    async def start_workflow(self, workflow, arg=None, *args, id: str, task_queue: str, **kwargs):  # noqa: A002
        import json
        import uuid

        name = workflow if isinstance(workflow, str) else getattr(workflow, "__name__", repr(workflow))
        record = {"workflow": name, "id": id, "task_queue": task_queue,
                  "param": None if arg is None else type(arg).__name__}
        with self._lock, open(self._log, "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")
        print(f"temporal stand-in: started {name} ({id}) on {task_queue}", file=sys.stderr, flush=True)
        return StartedWorkflow(id, str(uuid.uuid4()))

    def __getattr__(self, name: str):
        raise RuntimeError(f"temporal stand-in: Client.{name} is not stood in (only workflow starts are); "
                           "a region that needs it needs a Temporal server")


def install_temporal_standin() -> None:
    """get_client_async answers the stand-in, in its own module and wherever it was imported."""
    import importlib

    standin = TemporalStandIn(Path(os.environ["MAAS_DATA"]) / WORKFLOW_LOG)

    async def get_client_async():
        return standin

    for name in TEMPORAL_CLIENT_MODULES:
        try:
            original = importlib.import_module(name).get_client_async
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise RuntimeError(f"no get_client_async in {' or '.join(TEMPORAL_CLIENT_MODULES)}: this release's "
                           "Temporal client is elsewhere; the stand-in must follow it")
    for module in list(sys.modules.values()):
        for attribute, value in list(vars(module).items()) if module is not None else ():
            if value is original:
                setattr(module, attribute, get_client_async)


# MAAS's OpenFGA server (from master on): the region asks it, over a Unix socket, what each user
# may do (maasserver/auth/local.py, maascommon/openfga/sync_client.py), and dbupgrade runs its
# migrators. tools/build-maas builds the three binaries of src/maasopenfga beside the venv.
OPENFGA_SERVER = "maas-openfga"
OPENFGA_SOCKET_ENV = "MAAS_OPENFGA_HTTP_SOCKET_PATH"  # maascommon/openfga/base.py, cmd/maas-openfga/main.go


def openfga_dir() -> Path | None:
    """Where tools/build-maas put MAAS's OpenFGA binaries (beside the venv), or None before master."""
    path = Path(sys.prefix).parent / "openfga"
    return path if (path / OPENFGA_SERVER).exists() else None


def start_openfga():
    """maas-openfga on a Unix socket, reading the region's database settings from regiond.conf
    (it reads $SNAP_DATA/regiond.conf), as the snap runs it beside regiond; None before master."""
    import atexit
    import subprocess
    import tempfile
    import time

    binaries = openfga_dir()
    if binaries is None:
        return None
    # A short directory: a Unix socket's path is limited to 107 bytes.
    socket_path = Path(tempfile.mkdtemp(prefix="maas-openfga-")) / "http.sock"
    os.environ[OPENFGA_SOCKET_ENV] = str(socket_path)
    env = {**os.environ, "SNAP_DATA": str(Path(os.environ["MAAS_REGION_CONFIG"]).parent)}
    process = subprocess.Popen([str(binaries / OPENFGA_SERVER)], env=env, preexec_fn=die_with_parent)
    atexit.register(process.terminate)
    deadline = time.monotonic() + 60
    while not socket_path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{OPENFGA_SERVER} did not listen on {socket_path} (exit {process.poll()})")
        time.sleep(0.1)
    return process


def install_snap_standin() -> None:
    """From master on MAAS runs only as a snap (provisioningserver/utils/version.py: get_versions_info
    asks snap.get_snap_versions_info alone, no deb), so the region runs as MAAS's own test environment
    sets it (maastesting/pytest/environment.py: SNAP_VERSION, SNAP_REVISION), with the installed
    version, and a `snapctl` that, with no snapd here, fails: no refresh is pending. Before master,
    the deb path's apt_pkg stand-in (standins.py) answers instead."""
    import importlib.util
    import stat
    import tempfile
    from importlib.metadata import version

    if importlib.util.find_spec("provisioningserver.utils.deb") is not None:
        return
    os.environ.setdefault("SNAP_VERSION", version("maas"))
    os.environ.setdefault("SNAP_REVISION", "0")
    bin_dir = Path(tempfile.mkdtemp(prefix="maas-snapctl-"))
    snapctl = bin_dir / "snapctl"
    snapctl.write_text("#!/bin/sh\necho 'error: no snapd here (tools/maas-region/region.py)' >&2\nexit 1\n")
    snapctl.chmod(stat.S_IRWXU)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def schema() -> int:
    """dbupgrade's steps (3.6: Django's migrations, triggers, views; 3.7: alembic's migrations;
    master: OpenFGA's, then alembic's, then OpenFGA's model)."""
    import django

    django.setup()
    from django.core.management import call_command

    from maasserver.management.commands import dbupgrade

    # The last step sets up the Temporal server's own schema with its SQL tool: the web
    # application never talks to Temporal, so it is left out.
    dbupgrade.Command._temporal_migration = classmethod(lambda cls, database: None)
    binaries = openfga_dir()
    # dbupgrade's --openfga-path (master's maasserver/management/commands/dbupgrade.py).
    call_command("dbupgrade", **({"openfga_path": str(binaries)} if binaries else {}))
    # Up to 3.6 the schema came from Django's migrate, whose post_migrate handler makes the sites
    # framework's default row; from 3.7 it is alembic's (maasservicelayer/db/alembic), which makes
    # the table and no row, and creating MAAS's administrator (createadmin) needs it. Made as
    # Django makes it (nothing when it is there).
    from django.apps import apps

    if apps.is_installed("django.contrib.sites"):
        from django.contrib.sites.management import create_default_site

        create_default_site(apps.get_app_config("sites"), verbosity=0)
    return 0


def ensure_admin() -> str:
    from django.contrib.auth.models import User

    from maasserver.models.user import get_auth_tokens

    user = User.objects.filter(username=ADMIN).first()
    if user is None:
        user = User.objects.create_superuser(ADMIN, email="admin@example.com", password="admin")
    token = get_auth_tokens(user).first()
    if token is None:
        from maasserver.models.user import create_auth_token

        token = create_auth_token(user)
    return f"{token.consumer.key}:{token.key}:{token.secret}"


def mint_region() -> str:
    """The region controller's record, as MAAS mints it on its first start on an empty
    database (RegionController.objects._create_running_controller), before start_up.

    start_up would look for an existing node by host name and MAC addresses first, which runs
    `sudo machine-resources` (MAAS's Go helper) to list the host's interfaces. On the empty
    database of the template build nothing can match, so the lookup is skipped and the Go helper
    is neither built nor run. Later starts find the region by its MAAS ID (kept with the
    template), as regiond does."""
    from maasserver.models import RegionController

    return RegionController.objects._create_running_controller().system_id


def make_boot_resource() -> None:
    """A synced amd64/generic resource of the release's own commissioning series (the
    `commissioning_distro_series` default: noble from 3.6, jammy on 3.5), made by MAAS's own test
    factory: without one MAAS refuses a new machine's architecture, and commissioning ("Ephemeral
    operating system ubuntu/<series> ... is unavailable")."""
    from maasserver.models import BootResource, Config
    from maasserver.testing.factory import factory  # needs the libraries in --testing-libs

    name = "{}/{}".format(Config.objects.get_config("commissioning_osystem"),
                          Config.objects.get_config("commissioning_distro_series"))
    if not BootResource.objects.filter(name=name, architecture="amd64/generic").exists():
        factory.make_usable_boot_resource(name=name, architecture="amd64/generic")


class _TCPWebApplication:
    """MAAS's WebApplicationService, listening on TCP 127.0.0.1:port."""

    @staticmethod
    def make(listener, status_worker, port: int):
        from twisted.internet import reactor
        from twisted.internet.endpoints import TCP4ServerEndpoint

        from maasserver.webapp import WebApplicationService

        class TCPWebApplicationService(WebApplicationService):
            # regiond's worker binds a Unix socket and adopts its descriptor (Twisted then closes
            # the original, which the socket object still names): a plain TCP endpoint instead.
            def _makeEndpoint(self):
                return TCP4ServerEndpoint(reactor, port, interface="127.0.0.1")

        return TCPWebApplicationService(listener, status_worker)


def run(command: str, port: int | None) -> int:
    from twisted.internet import reactor
    from twisted.internet.defer import inlineCallbacks

    outcome = {"status": 0}
    data = Path(os.environ["MAAS_DATA"])

    @inlineCallbacks
    def main():
        try:
            from maasserver.utils.orm import disable_all_database_connections
            from maasserver.utils.threads import deferToDatabase

            disable_all_database_connections()
            from maasserver import start_up
            from provisioningserver.utils.env import MAAS_ID

            if command == "prepare" and MAAS_ID.get() is None:
                from maasserver.utils.orm import transactional

                MAAS_ID.set((yield deferToDatabase(transactional(mint_region))))

            yield start_up.start_up(master=True)
            if command == "prepare":
                from maasserver.utils.orm import transactional

                yield deferToDatabase(transactional(make_boot_resource))
                reactor.stop()
                return

            from maasserver.eventloop import make_DatabaseTaskService
            from maasserver.listener import PostgresListenerService
            from maasserver.utils.orm import transactional
            from metadataserver.api_twisted import StatusWorkerService

            # MAAS's RPC service for rack controllers, registered under its name as regiond does
            # but not started: nothing listens, no rack ever connects. The web application's
            # websocket factory subscribes to its events; a power action finds it without
            # connections, as in a region with no rack.
            from maasserver import eventloop
            from maasserver.rpc.regionservice import RegionService

            rpc = RegionService(None)
            rpc.setName("rpc")
            rpc.setServiceParent(eventloop.services)

            # Made before any is started, as regiond's event loop does: the web application
            # registers its channels with the listener before the listener connects.
            listener = PostgresListenerService()
            dbtasks = make_DatabaseTaskService()
            status_worker = StatusWorkerService(dbtasks)
            web = _TCPWebApplication.make(listener, status_worker, port)
            dbtasks.startService()
            yield listener.startService()
            status_worker.startService()
            yield web.privilegedStartService()
            web.startService()

            key = yield deferToDatabase(transactional(ensure_admin))
            (data / "admin.key").write_text(key + "\n")
            (data / "ready").write_text(f"{port}\n")
            print(f"region: serving http://127.0.0.1:{port}/MAAS/", file=sys.stderr, flush=True)
        except BaseException:
            import traceback

            traceback.print_exc()
            outcome["status"] = 1
            reactor.stop()

    reactor.callWhenRunning(main)
    signal.signal(signal.SIGTERM, lambda *args: reactor.callFromThread(reactor.stop))
    reactor.run(installSignalHandlers=False)
    return outcome["status"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="region.py")
    parser.add_argument("command", choices=("schema", "prepare", "serve"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--testing-libs", help="where MAAS's test factory's own libraries are (testtools, "
                        "fixtures...): on sys.path for `prepare` only, so that `serve` is not a MAAS "
                        "development environment (MAAS takes one where its maastesting imports)")
    args = parser.parse_args(argv)
    if args.command == "prepare" and args.testing_libs:
        sys.path.append(args.testing_libs)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maasserver.djangosettings.settings")
    if args.command == "schema":
        return schema()
    if args.command == "serve" and not args.port:
        parser.error("serve needs --port")
    install_reactor()
    if args.command == "serve":
        die_with_parent()
    make_directories()
    install_snap_standin()
    start_openfga()
    configure()
    fail_fast()
    install_power_stub()
    install_temporal_standin()
    install_bmc_names()
    return run(args.command, args.port)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
