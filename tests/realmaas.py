"""MAAS's own region on 127.0.0.1 for the real-MAAS tier: the `real_maas` fixture.

MAAS's region web application of each release the project is proven on (`maas-proven:` in
upstream.lock.yaml: the fixture is parametrized over them, ids `maas-<version>`, and a test that
branches on the release reads `real_maas.version`), built from its source by `tools/build-maas`
and cached under ~/.cache/maas-kubevirt/maas-<version>/: its Django URL conf, piston
handlers, forms, models, signals, OAuth and metadata API, on a private PostgreSQL cluster
copied from the cached template, served by MAAS's own request path (Twisted's WSGI resource in
MAAS's WebApplicationService) on a free port of 127.0.0.1. `tools/maas-region/region.py` is
the runner; it starts the region as regiond does, cut to the web application.

THE ONE STUB: `Node._power_control_node`, the point where MAAS, after a request commits, hands a
power action (power on to commission, a power query...) to a rack controller and its Temporal
workflow. MAAS's rack is a separate daemon (DHCP, TFTP, a Temporal worker, the Go agent), so none
runs here; the runner reads a flag file at every power action, and a test picks what answers:

- OFF, `set_stub(False)` (the default): MAAS's own code runs and finds no rack, as a region with
  no rack controller: `POST op=commission` answers 503 and MAAS reverts the machine to New.
- ON, `set_stub(True)`: the power action counts as handed off at once; commissioning proceeds
  (the machine stays in Commissioning, as while a real machine boots, until it signals). A power
  query handed off this way brings back no state, so MAAS logs that it could not update it.
- THE RACK, `set_rack(start_time=T, seed=SEED)`: a rack stand-in in the region process runs what
  the rack's power workflow runs: MAAS's own power driver from the built tree (for Redfish,
  `RedfishPowerDriver` with its waiting policy and retries), with the machine's power parameters,
  as the agent's `maas.power` runs it, under the workflow's retry policy (3 attempts); the
  Deferred then fires with the workflow's result, or fails with `PowerActionFail`, so MAAS's own
  success and failure handling run (on a failed power-on a commissioning machine is reverted,
  with MAAS's events). The driver reaches `self.bmc`, a `KubevirtBMC` (tests/kubevirt_bmc.py:
  kubevirtBMC's Redfish behind its Ingress, HTTPS with a self-signed certificate, per host, the
  credentials of each VM's `<vm>-bmc` Secret derived from SEED), whose VMs are ready T seconds
  after `On`. A commission then takes as long as the VM takes to start, as on a real site. Only
  inside the region process, and only for MAAS's Redfish driver, `<vm>.<ns>.` + BMC_DOMAIN on
  port 443 resolves to that BMC on 127.0.0.1 (region.py, install_bmc_names): no DNS, no
  /etc/hosts. `power_mode` says which of "off", "on" and "rack" is set.

Nothing else is stubbed. Import-only stand-ins exist for four libraries MAAS imports but never
calls here (simplestreams, curtin, tftp, seamicroclient) and for apt_pkg, which reports the
installed MAAS version (see tools/maas-region/standins.py). The region's record and a synced
ubuntu/noble amd64/generic boot resource (from MAAS's test factory) are made once in the
template, so MAAS accepts a new machine's architecture.

The build: REAL_MAAS names the built cache directories, space-separated (the Makefile's `test`
target builds each proven release with `tools/build-maas VERSION` and passes those that built);
a directory of a release not proven adds that release. Without REAL_MAAS the fixture runs
`tools/build-maas VERSION` itself (instant once cached). A proven release REAL_MAAS does not
name skips with the reason its build recorded (maas-<version>.failed beside the cache), and
fails under CI=true, as any other missing prerequisite, except where MAAS's source cannot be had
(MAAS_SOURCE, by default the upstream repository) and nothing is cached: then it skips even
under CI=true (the one tier that does), unless MAAS_SOURCE is set: then, as under .ci/run, it
fails.

REAL_MAAS_LOGS, when set, names a directory where the region's and PostgreSQL's logs are
copied (into maas-<version>/) when each release's region stops.

The object the fixture yields (`RealMaas`) offers:

- `url` (http://127.0.0.1:PORT/MAAS/), `api_key` (an administrator's consumer:token:secret);
- `enlist(power_parameters, mac, architecture)`: what maas_run_remote_scripts.py's enlist()
  does, then the machine's own metadata steps (op=get_preseed for its OAuth token, then
  `signal` OK, which ends enlistment's commissioning: Commissioning -> New);
- `admin_add_machine(mac, ...)`: an administrator's POST machines/ with commission=false;
- `set_stub(on)`, `set_rack(start_time, seed)`, `power_mode`, `bmc` (the KubevirtBMC);
  `api(method, path, params)` (as the administrator); `machine(system_id)`;
  `power_parameters(system_id)`; `events(system_id)`; `log_tail()`;
- `signal(system_id, status, **fields)`: an enlisted machine's own metadata signal (fields such
  as power_type and JSON power_parameters, as a commissioning script's BMC configuration sends);
  `finish_commissioning(scripts_passed)`: each enlisted machine in Commissioning signals OK (then
  Ready), its script results first PASSED with scripts_passed (`pass_commissioning_scripts`);
- `bmc_row(system_id)`: the machine's BMC row id (``maasserver_node.bmc_id``), read from the
  database: MAAS's API shows no machine's row, and the tier must see rows shared;
- `machine_ids()` (from the database) and `delete_machines(system_ids)`.

`TimingProxy(real_maas)` passes the region's API through another loopback port and records each
request's seconds, as a client waits them, whatever its HTTP library.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from conftest import IN_CI, require, require_tool
from controlplane import stop_process_group
from kubevirt_bmc import KubevirtBMC
from loopback import LoopbackServer

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "tools" / "build-maas"
RUNNER = ROOT / "tools" / "maas-region" / "region.py"
ENV = "REAL_MAAS"
STARTUP_TIMEOUT = 180
NO_SOURCE = 3  # tools/build-maas: MAAS's source could not be had
BMC_DOMAIN = "bmc.example.com"  # redfish.domain of the tier's sites: the region resolves it to self.bmc
RACK = "rack"  # the flag file's content for the rack stand-in (region.py)


def _lock_entry(name: str) -> str:
    for line in (ROOT / "upstream.lock.yaml").read_text(encoding="utf-8").splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].split("#")[0].strip()
    raise AssertionError(f"no {name}: in upstream.lock.yaml")


def maas_version() -> str:
    """The pinned release (`maas:`), tools/build-maas's default."""
    return _lock_entry("maas")


def proven_releases() -> list[str]:
    """Every release the tier runs (`maas-proven:`), oldest first."""
    return _lock_entry("maas-proven").split()


def master_releases() -> set[str]:
    """The pre-releases of MAAS's default branch the tier runs, which upstream.lock.yaml pins by
    commit (`maas-commits:`, release=commit) since upstream has not tagged them."""
    return {entry.split("=", 1)[0] for entry in _lock_entry("maas-commits").split() if "=" in entry}


def release_of(cache: Path) -> str:
    """The MAAS release a cache directory holds (tools/build-maas names it maas-<version>)."""
    return cache.name.removeprefix("maas-")


def given_regions() -> dict[str, Path]:
    """REAL_MAAS's built regions by release: a space-separated list of cache directories."""
    return {release_of(Path(entry)): Path(entry) for entry in os.environ.get(ENV, "").split()}


def releases() -> list[str]:
    """The releases the `real_maas` fixture runs on: the proven ones, and any other that
    REAL_MAAS names (a release being tried)."""
    proven = proven_releases()
    return proven + [version for version in given_regions() if version not in proven]


def _failed_file(version: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "maas-kubevirt" / f"maas-{version}.failed"


def unavailable(status: int, reason: str) -> None:
    """Skip; fail under CI=true, unless what is missing is MAAS's source (nothing cached) and
    no MAAS_SOURCE was given: a source named and not built is a failure like any other."""
    if status == NO_SOURCE and not os.environ.get("MAAS_SOURCE"):
        pytest.skip(f"real-MAAS tier: {reason}")
    require(False, f"real-MAAS tier: {reason}")


def cache_dir(version: str | None = None) -> Path:
    """The built region of a release (default the pinned one) from REAL_MAAS, or from running
    tools/build-maas; or skip with why."""
    version = version or maas_version()
    if os.environ.get(ENV) is None:
        done = subprocess.run([str(BUILD), version], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return Path(done.stdout.strip())
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        unavailable(done.returncode, lines[-1] if lines else f"tools/build-maas exited {done.returncode}")
    path = given_regions().get(version)
    if path is None:
        failed = _failed_file(version)
        if failed.exists():  # make test passes no directory for a release whose build failed
            status, _, reason = failed.read_text(encoding="utf-8").strip().partition("\t")
            unavailable(int(status) if status.isdigit() else 1, reason)
        unavailable(1, f"MAAS {version}'s region is not built: {ENV} names no maas-{version} directory "
                       f"(tools/build-maas {version} builds it)")
    require((path / ".built").exists(), f"{ENV} names {path}, which is not a built MAAS region "
                                        f"(run tools/build-maas {version})")
    return path


def _die_with_parent() -> None:
    """In a child, before exec: SIGTERM when this test process ends."""
    import ctypes

    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def oauth_header(key: str) -> str:
    """OAuth 1.0 PLAINTEXT, as MAAS's clients sign (the consumer secret is empty)."""
    consumer, token, secret = key.split(":")
    fields = {
        "oauth_version": "1.0",
        "oauth_signature_method": "PLAINTEXT",
        "oauth_consumer_key": consumer,
        "oauth_token": token,
        "oauth_signature": "&" + urllib.parse.quote(secret, safe=""),
        "oauth_nonce": secrets.token_hex(8),
        "oauth_timestamp": str(int(time.time())),
    }
    return "OAuth realm=\"\", " + ", ".join(f'{name}="{value}"' for name, value in fields.items())


@dataclass
class Enlisted:
    """One enlistment: the anonymous POST's answer, and the machine it made (on 200)."""

    status: int
    body: str
    system_id: str | None = None
    preseed_status: int | None = None
    signal_status: int | None = None
    machine: dict = field(default_factory=dict)


@dataclass
class RealMaas:
    cache: Path
    work: Path
    port: int = 0
    api_key: str = ""
    region: subprocess.Popen | None = None
    postgres: subprocess.Popen | None = None
    bmc: KubevirtBMC | None = None
    # system_id -> the machine's own OAuth key (from its preseed), for its metadata signals
    machine_keys: dict = field(default_factory=dict)

    @property
    def version(self) -> str:
        """The MAAS release this region is (tests that differ by release branch on it)."""
        return release_of(self.cache)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/MAAS/"

    @property
    def api_url(self) -> str:
        return self.url + "api/2.0/"

    @property
    def log(self) -> Path:
        return self.work / "region.log"

    @property
    def stub_flag(self) -> Path:
        return self.work / "power-stub-on"

    # --- life -----------------------------------------------------------------------------

    def _postgres_command(self, *args: str) -> list[str]:
        """PostgreSQL refuses to run as root: then as the postgres user. Either way it gets
        SIGTERM if this process ends without stopping it (a killed test session)."""
        if os.geteuid() == 0:
            return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--pdeathsig", "TERM",
                    "--", *args]
        return list(args)

    def start(self) -> None:
        pgbin = Path((self.cache / "pgbin").read_text().strip())
        template = self.cache / "template"
        sock = self.work / "sock"
        sock.mkdir()
        subprocess.run(["cp", "-a", str(template / "pgdata"), str(self.work / "pgdata")], check=True)
        subprocess.run(["cp", "-a", str(template / "root"), str(self.work / "root")], check=True)
        if os.geteuid() == 0:
            shutil.chown(sock, "postgres")
            os.chmod(self.work, 0o755)
        with open(sock / "postgres.log", "wb") as log:
            self.postgres = subprocess.Popen(
                self._postgres_command(str(pgbin / "postgres"), "-D", str(self.work / "pgdata"),
                                       "-c", "listen_addresses=", "-k", str(sock), "-c", "fsync=off",
                                       "-c", "full_page_writes=off", "-c", "log_connections=on",
                                       "-c", "log_disconnections=on"),
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 60
        while subprocess.run([str(pgbin / "pg_isready"), "-q", "-h", str(sock)], check=False).returncode != 0:
            if self.postgres.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start:\n{self._tail('sock/postgres.log')}")
            time.sleep(0.2)
        self.bmc = KubevirtBMC(BMC_DOMAIN, self._certificate()).start()
        self.port = free_port()
        (self.work / "regiond.conf").write_text(yaml.safe_dump({
            "maas_url": self.url.rstrip("/"), "database_host": str(sock), "database_name": "maasdb",
            "database_user": "maas", "database_pass": ""}))
        root = self.work / "root"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.work), "LANG": "C.UTF-8",
            "MAAS_REGION_CONFIG": str(self.work / "regiond.conf"),
            "MAAS_CLUSTER_CONFIG": str(self.work / "rackd.conf"),
            "MAAS_ROOT": str(root), "MAAS_DATA": str(root / "data"), "MAAS_CACHE": str(root / "cache"),
            "DJANGO_SETTINGS_MODULE": "maasserver.djangosettings.settings",
            "MAAS_KUBEVIRT_POWER_STUB": str(self.stub_flag),
            "MAAS_KUBEVIRT_BMC_DOMAIN": BMC_DOMAIN, "MAAS_KUBEVIRT_BMC_PORT": str(self.bmc.port),
        }
        ready = root / "data" / "ready"
        with open(self.log, "wb") as log:
            self.region = subprocess.Popen(
                [str(self.cache / "venv" / "bin" / "python"), str(RUNNER), "serve", "--port", str(self.port)],
                cwd=self.work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.region.poll() is not None:
                raise RuntimeError(f"MAAS's region exited {self.region.returncode}:\n{self.log_tail()}")
            if ready.exists():
                try:
                    answer = requests.get(self.api_url + "version/", timeout=10)
                    if answer.status_code == 200:
                        break
                except requests.RequestException:
                    pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"MAAS's region did not answer within {STARTUP_TIMEOUT} s:\n{self.log_tail()}")
        self.api_key = (root / "data" / "admin.key").read_text().strip()

    def _certificate(self) -> tuple[str, str]:
        """A self-signed certificate for the BMC, as any: MAAS's Redfish driver verifies none."""
        openssl = require_tool("openssl", "openssl makes the self-signed certificate of the tier's BMC")
        cert, key = self.work / "bmc-cert.pem", self.work / "bmc-key.pem"
        subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", f"/CN=*.{BMC_DOMAIN}", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True)
        return str(cert), str(key)

    def stop(self) -> None:
        if self.bmc is not None:
            self.bmc.stop()
        if self.region is not None:
            stop_process_group(self.region, kill_wait=None)
        if self.postgres is not None and self.postgres.poll() is None:
            self.postgres.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                self.postgres.wait(30)
            except subprocess.TimeoutExpired:
                self.postgres.kill()
                self.postgres.wait()

    def _tail(self, name: str, lines: int = 40) -> str:
        path = self.work / name
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def log_tail(self, lines: int = 60) -> str:
        return self._tail("region.log", lines)

    # --- the one stub ---------------------------------------------------------------------

    def set_stub(self, on: bool) -> None:
        """ON: a power action counts as handed off to a rack. OFF: MAAS finds no rack."""
        if on:
            self.stub_flag.write_text("on\n")
        else:
            self.stub_flag.unlink(missing_ok=True)

    def set_rack(self, start_time: float, seed: str) -> None:
        """The rack stand-in: MAAS's own power driver against self.bmc, whose VMs are ready
        start_time seconds after On and hold the credentials derived from seed."""
        assert self.bmc is not None
        self.bmc.start_time = float(start_time)
        self.bmc.seed = seed
        self.stub_flag.write_text(RACK + "\n")

    @property
    def power_mode(self) -> str:
        """"off", "on" or "rack": what answers MAAS's power actions now."""
        if not self.stub_flag.exists():
            return "off"
        return RACK if self.stub_flag.read_text().strip() == RACK else "on"

    # --- requests -------------------------------------------------------------------------

    def api(self, method: str, path: str, params: Any = None, *, key: str | None = None,
            anonymous: bool = False) -> requests.Response:
        """One request to api/2.0/<path>, as the administrator (or with key, or anonymously).
        GET params go in the query string, others in a form body."""
        headers = {} if anonymous else {"Authorization": oauth_header(key or self.api_key)}
        url = self.api_url + path
        if method == "GET":
            return requests.get(url, params=params, headers=headers, timeout=60)
        return requests.request(method, url, data=params, headers=headers, timeout=60)

    def machine(self, system_id: str) -> dict:
        answer = self.api("GET", f"machines/{system_id}/")
        assert answer.status_code == 200, (answer.status_code, answer.text)
        return answer.json()

    def machines(self) -> list[dict]:
        answer = self.api("GET", "machines/")
        assert answer.status_code == 200, (answer.status_code, answer.text)
        return answer.json()

    def power_parameters(self, system_id: str) -> dict:
        answer = self.api("GET", f"machines/{system_id}/", {"op": "power_parameters"})
        assert answer.status_code == 200, (answer.status_code, answer.text)
        return answer.json()

    def events(self, system_id: str | None = None, level: str = "DEBUG", limit: int = 1000) -> list[dict]:
        params: dict[str, Any] = {"op": "query", "level": level, "limit": limit}
        if system_id:
            params["id"] = system_id
        answer = self.api("GET", "events/", params)
        assert answer.status_code == 200, (answer.status_code, answer.text)
        return answer.json()["events"]

    def enlist(self, power_parameters: dict | None, mac: str, architecture: str = "amd64/generic",
               power_type: str = "redfish", finish: bool = True) -> Enlisted:
        """What maas_run_remote_scripts.py enlist() sends: an anonymous POST machines/ with
        architecture, mac_addresses, commission=True, power_type and JSON power_parameters
        (urlencoded), then, when MAAS made the machine, its preseed (op=get_preseed: the OAuth
        token) and its metadata `signal` OK, the end of enlistment's commissioning (unless not
        ``finish``: the machine then stays in Commissioning, its scripts still running)."""
        post = {"architecture": architecture, "mac_addresses": mac, "commission": True}
        if power_type:
            post["power_type"] = power_type
        if power_parameters:
            post["power_parameters"] = json.dumps(power_parameters)
        answer = requests.post(self.api_url + "machines/", data=urllib.parse.urlencode(post),
                               headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=60)
        result = Enlisted(answer.status_code, answer.text)
        if answer.status_code != 200:
            return result
        result.system_id = answer.json()["system_id"]
        result.preseed_status = self.fetch_machine_key(result.system_id)
        if finish:
            signalled = self.signal(result.system_id, "OK")
            result.signal_status = signalled.status_code
            assert signalled.status_code == 200, (signalled.status_code, signalled.text)
        result.machine = self.machine(result.system_id)
        return result

    def fetch_machine_key(self, system_id: str) -> int:
        """The machine's preseed (anonymous op=get_preseed, as enlist() asks for it): it holds
        the machine's OAuth token, which MAAS makes anew each time it starts commissioning."""
        preseed = requests.get(f"{self.url}metadata/latest/by-id/{system_id}/", params={"op": "get_preseed"},
                               timeout=60)
        assert preseed.status_code == 200, (preseed.status_code, preseed.text)
        config = yaml.safe_load(preseed.text)
        if "datasource" in config:
            config = config["datasource"]["MAAS"]
        self.machine_keys[system_id] = f"{config['consumer_key']}:{config['token_key']}:{config['token_secret']}"
        return preseed.status_code

    def signal(self, system_id: str, status: str = "OK", **fields: str) -> requests.Response:
        """The machine's own metadata signal (multipart POST op=signal, its OAuth token), as
        maas_run_remote_scripts sends when its scripts are done, or with power_type and
        power_parameters as after a BMC configuration script (src/metadataserver/api.py,
        store_node_power_parameters)."""
        form = {"op": (None, "signal"), "status": (None, status), **{k: (None, v) for k, v in fields.items()}}
        return requests.post(f"{self.url}metadata/2012-03-01/", files=form,
                             headers={"Authorization": oauth_header(self.machine_keys[system_id])}, timeout=60)

    def _query(self, sql: str) -> list[str]:
        """One SQL query on the region's database (psql, as the API shows neither); its rows."""
        pgbin = Path((self.cache / "pgbin").read_text().strip())
        done = subprocess.run(
            self._postgres_command(str(pgbin / "psql"), "-h", str(self.work / "sock"), "-U", "maas", "-d", "maasdb",
                                   "-At", "-c", sql),
            capture_output=True, text=True, timeout=60, check=True)
        return done.stdout.splitlines()

    def bmc_row(self, system_id: str) -> int | None:
        """The machine's BMC row (maasserver_node.bmc_id), from the database: the API shows none."""
        if not system_id.isalnum():
            raise ValueError(f"not a system_id: {system_id!r}")
        rows = self._query(f"SELECT bmc_id FROM maasserver_node WHERE system_id = '{system_id}'")
        value = rows[0].strip() if rows else ""
        return int(value) if value else None

    def machine_ids(self) -> set[str]:
        """Every machine's system_id (node_type 0), from the database: cheaper than listing them."""
        return set(self._query("SELECT system_id FROM maasserver_node WHERE node_type = 0"))

    def delete_machines(self, system_ids: set[str]) -> None:
        """DELETE machines/{id}/ as the administrator, each; forgotten here too."""
        for system_id in sorted(system_ids):
            answer = self.api("DELETE", f"machines/{system_id}/")
            assert answer.status_code == 204, (system_id, answer.status_code, answer.text)
            self.machine_keys.pop(system_id, None)

    def finish_commissioning(self, scripts_passed: bool = False) -> list[str]:
        """Every machine enlisted here that is in Commissioning signals OK, as at the end of its
        commissioning scripts: MAAS makes it Ready. The system_ids that did. With scripts_passed,
        its script results are PASSED first, as the scripts' own signals leave them on a site: a
        release then ends in Ready, not New (Node._finalize_release, src/maasserver/models/node.py,
        asks that the commissioning script set passed)."""
        done = []
        present = self.machine_ids()   # a machine deleted meanwhile (a pool retired it) is skipped
        for system_id in [key for key in self.machine_keys if key in present]:
            if self.machine(system_id)["status_name"] == "Commissioning":
                if scripts_passed:
                    self.pass_commissioning_scripts(system_id)
                self.fetch_machine_key(system_id)
                answer = self.signal(system_id, "OK")
                assert answer.status_code == 200, (system_id, answer.status_code, answer.text)
                done.append(system_id)
        return done

    def pass_commissioning_scripts(self, system_id: str) -> None:
        """The machine's current commissioning script results PASSED (SCRIPT_STATUS.PASSED, 2, in
        src/maascommon/enums/scriptresult.py), in the database: what each script's own result
        signal would leave, without the output its post-processing hooks parse."""
        if not system_id.isalnum():
            raise ValueError(f"not a system_id: {system_id!r}")
        self._query("UPDATE maasserver_scriptresult SET status = 2, exit_status = 0 WHERE script_set_id = "
                    f"(SELECT current_commissioning_script_set_id FROM maasserver_node WHERE system_id = '{system_id}')")

    def admin_add_machine(self, mac: str, power_type: str = "", power_parameters: dict | None = None,
                          architecture: str = "amd64/generic", hostname: str | None = None) -> dict:
        """An administrator's POST machines/ with commission=false (and no power_type when
        power_type is empty)."""
        params: dict[str, Any] = {"architecture": architecture, "mac_addresses": mac, "commission": "false"}
        if power_type:
            params["power_type"] = power_type
        if hostname:
            params["hostname"] = hostname
        for name, value in (power_parameters or {}).items():
            params[f"power_parameters_{name}"] = value
        answer = self.api("POST", "machines/", params)
        assert answer.status_code == 200, (answer.status_code, answer.text)
        return answer.json()


@dataclass
class Timed:
    method: str
    path: str       # with its query
    body: bytes
    status: int
    seconds: float
    wire: int = 0   # bytes on the client's connection, both ways, request line and headers included
    started: float = 0.0   # time.monotonic() when it was passed on: overlapping requests are told apart


class _Counted:
    """A handler's rfile or wfile, counting the bytes that pass."""

    def __init__(self, stream):
        self._stream, self.count = stream, 0

    def _counted(self, data):
        self.count += len(data)
        return data

    def read(self, *args):
        return self._counted(self._stream.read(*args))

    def readline(self, *args):
        return self._counted(self._stream.readline(*args))

    def write(self, data):
        self.count += len(data)
        return self._stream.write(data)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class TimingProxy(LoopbackServer):
    """The region's API on another port of 127.0.0.1, passed through; each request timed, and its
    bytes on the wire counted (as the client sends and receives them)."""

    def __init__(self, real_maas: RealMaas):
        self.target = f"http://127.0.0.1:{real_maas.port}"
        self.timed: list[Timed] = []
        self.in_flight = 0
        self.lock = threading.Condition()

    def stop(self, wait: float = 120.0) -> None:
        """After the requests in flight have their answer (a client that gave up leaves one)."""
        with self.lock:
            self.lock.wait_for(lambda: self.in_flight == 0, wait)
        super().stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/MAAS/"

    def start(self) -> "TimingProxy":
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                self.rfile, self.wfile = _Counted(self.rfile), _Counted(self.wfile)
                self.counted = 0  # both ways, up to the end of the last answer

            def forward(self) -> None:
                with proxy.lock:
                    proxy.in_flight += 1
                try:
                    self.pass_through()
                finally:  # recorded before it counts as answered
                    with proxy.lock:
                        proxy.in_flight -= 1
                        proxy.lock.notify_all()

            def pass_through(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {name: value for name, value in self.headers.items()
                           if name.lower() not in ("host", "connection", "content-length", "accept-encoding")}
                started = time.monotonic()
                try:
                    reply = requests.request(self.command, proxy.target + self.path, data=body, headers=headers,
                                             allow_redirects=False, timeout=900)
                except requests.RequestException:
                    self.close_connection = True
                    return
                timed = Timed(self.command, self.path, body, reply.status_code, time.monotonic() - started,
                              started=started)
                try:
                    self.send_response(reply.status_code)
                    for name, value in reply.headers.items():
                        if name.lower() not in ("connection", "content-length", "transfer-encoding",
                                                "content-encoding", "date", "server"):
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.content)))
                    self.end_headers()
                    self.wfile.write(reply.content)
                    self.wfile.flush()
                except OSError:
                    pass  # the client gave up waiting (its own timeout)
                total = self.rfile.count + self.wfile.count
                timed.wire, self.counted = total - self.counted, total
                proxy.timed.append(timed)

            do_GET = do_POST = do_PUT = do_DELETE = forward

        self.serve(ThreadingHTTPServer(("127.0.0.1", 0), Handler), "maas-timing-proxy")
        return self


@pytest.fixture(scope="session", params=releases(), ids=lambda version: f"maas-{version}")
def real_maas(request):
    """MAAS's region of each release of the matrix in turn (one up at a time: pytest groups the
    tests by release and stops one region before it starts the next)."""
    cache = cache_dir(request.param)
    work = Path(tempfile.mkdtemp(prefix=f"maas-kubevirt-realmaas-{request.param}-"))
    maas = RealMaas(cache, work)
    try:
        try:
            maas.start()
        except Exception as failure:  # noqa: BLE001 (shown whole)
            maas.stop()
            if IN_CI:
                raise
            pytest.fail(str(failure), pytrace=False)
        yield maas
    finally:
        maas.stop()
        keep = os.environ.get("REAL_MAAS_LOGS")
        if keep:  # a directory to keep the region's and PostgreSQL's logs in, one folder per release
            folder = Path(keep) / f"maas-{request.param}"
            folder.mkdir(parents=True, exist_ok=True)
            for log in (work / "region.log", work / "sock" / "postgres.log"):
                if log.exists():
                    shutil.copy(log, folder)
        shutil.rmtree(work, ignore_errors=True)
