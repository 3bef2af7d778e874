"""Run MAAS's own Redfish power driver against one BMC host, as the rack's agent runs it, with the
MAAS venv's python (tools/build-maas): the client of the traffic tier (tests/test_traffic_tier.py).

    power.py on|off|cycle|query --address HOST --user USER --domain DOMAIN --port PORT [--node-id 1]

The password is read from stdin (one line), never from argv. What runs is what the rack stand-in
of region.py runs for a power workflow (`_maas_power`: `maas.power <command> redfish` does the
action and then a query), with RedfishPowerDriver from MAAS's source tree: its URL building
(https:// prepended to the bare host), headers, Basic credentials, retries, waiting policy and its
TLS client (WebClientContextFactory: no server name sent, no certificate verified). It prints one
JSON line, {"state": "on"|"off"|...}, and exits 0; or one line naming the error and exits 1.

Where it connects: MAAS's driver always asks for <address>:443. Here the name is steered as in
the rack stand-in (region.install_bmc_names): inside this process, and only in the name resolver
that redfish.py hands to Twisted's Agent, a host under DOMAIN on port 443 resolves to
127.0.0.1:PORT (the proxy under test, or a relay in front of it); any other name or port to
nothing. The driver's own code is untouched: the Host header stays the VM's host, the TLS
handshake is the driver's, the request goes out of this process over TCP to the proxy. The
alternatives were worse: a network namespace whose port 443 is the proxy needs a DNS answer and
a NAT rule on top, and patching the driver's Agent or context factory would change what is being
tested.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import region  # noqa: E402  (this directory: the rack stand-in's reactor, resolver and power command)

COMMANDS = {"on": "on", "off": "off", "cycle": "cycle", "query": "status"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="power.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument("--address", required=True, help="power_address: the bare host <vm>.<ns>.<domain>")
    parser.add_argument("--user", required=True, help="power_user")
    parser.add_argument("--node-id", default="1", help="node_id (kubevirtBMC's one system is 1)")
    parser.add_argument("--domain", required=True, help="hosts under it on port 443 go to 127.0.0.1:PORT")
    parser.add_argument("--port", type=int, required=True, help="the port on 127.0.0.1 that serves them")
    args = parser.parse_args(argv)
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("power.py: no password on stdin", file=sys.stderr)
        return 2

    os.environ[region.BMC_DOMAIN_ENV] = args.domain
    os.environ[region.BMC_PORT_ENV] = str(args.port)
    region.install_reactor()
    from twisted.internet import reactor

    from provisioningserver.drivers.power import get_error_message
    from provisioningserver.drivers.power.redfish import RedfishPowerDriver

    region.install_bmc_names()
    driver = RedfishPowerDriver()
    params = {"power_address": args.address, "power_user": args.user, "power_pass": password,
              "node_id": args.node_id}
    # As the rack stand-in builds it (region._power_workflow): each of the driver's settings, None
    # when not given.
    context = {setting["name"]: (params.get(setting["name"]) or None) for setting in driver.settings}
    outcome: dict = {}

    def done(state):
        outcome["state"] = state
        reactor.stop()

    def failed(failure):
        outcome["error"] = get_error_message(failure.value)
        reactor.stop()

    def start():
        region._maas_power(driver, COMMANDS[args.command], context).addCallbacks(done, failed)

    reactor.callWhenRunning(start)
    reactor.run(installSignalHandlers=False)
    if "error" in outcome:
        print(f"power.py: {args.command} {args.address}: {outcome['error']}", file=sys.stderr)
        return 1
    print(json.dumps({"state": outcome.get("state")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
