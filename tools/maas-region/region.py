"""Run MAAS's region web application for the real-MAAS test tier, with the MAAS venv's python.

    region.py schema              create MAAS's schema (dbupgrade's steps but Temporal's)
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
image import or Temporal service is started.

The one stub (see tests/realmaas.py): Node._power_control_node, where MAAS hands a power action
to a rack controller, after the request commits. When the file named by
MAAS_KUBEVIRT_POWER_STUB exists, the action counts as handed off (the deferred goes on with
nothing done); otherwise MAAS's own code runs, and with no rack connected it fails as a region
without racks does. The file is read at each power action, so a test switches it at run time.

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


def install_power_stub() -> None:
    from maasserver.models.node import Node

    original = Node._power_control_node

    def _power_control_node(self, defer, power_method_name, power_info, order=None):
        flag = os.environ.get(STUB_ENV)
        if flag and os.path.exists(flag):
            print(f"power stub: {power_method_name} for {self.system_id} counted as handed off",
                  file=sys.stderr, flush=True)
            return defer
        return original(self, defer, power_method_name, power_info, order)

    Node._power_control_node = _power_control_node


def schema() -> int:
    """dbupgrade's steps: drop views and triggers, Django migrations, triggers, views."""
    import django

    django.setup()
    from django.core.management import call_command

    from maasserver.management.commands import dbupgrade

    # The last step sets up the Temporal server's own schema with its SQL tool: the web
    # application never talks to Temporal, so it is left out.
    dbupgrade.Command._temporal_migration = classmethod(lambda cls, database: None)
    call_command("dbupgrade")
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
    """A synced ubuntu/noble amd64/generic resource, made by MAAS's own test factory: without
    one MAAS refuses a new machine's architecture, and commissioning."""
    from maasserver.models import BootResource
    from maasserver.testing.factory import factory  # needs the libraries in --testing-libs

    if not BootResource.objects.filter(name="ubuntu/noble", architecture="amd64/generic").exists():
        factory.make_usable_boot_resource(name="ubuntu/noble", architecture="amd64/generic")


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
    configure()
    fail_fast()
    install_power_stub()
    return run(args.command, args.port)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
