"""systemd notifications (sd_notify(3)), read as systemd would from a NOTIFY_SOCKET the test holds:
READY=1 only after the first cycle against the region, WATCHDOG=1 every cycle and while idle,
silent while a cycle is stuck in a MAAS request, STATUS= lines free of secrets, STOPPING=1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from conftest import require  # noqa: E402
from loop_process import TIMEOUT, LoopProcess  # noqa: E402
from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import derived, derived_user, secrets_of, write_values  # noqa: E402

from maas_kubevirt import notify  # noqa: E402
from maas_kubevirt.loop import WATCHDOG_MARGIN, _wait_held  # noqa: E402

# Wall-clock bounds: run after the parallel workers, with the machine to itself (tests/conftest.py).
pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[1]
WATCHDOG = 1.0   # seconds: WATCHDOG_USEC as the tests set it (the loop feeds every quarter)


class NotifySocket:
    """The service manager's end: an AF_UNIX datagram socket, each message kept as it came."""

    def __init__(self, address: str):
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.messages: list[tuple[float, list[str]]] = []

    def receive(self, timeout: float) -> list[str] | None:
        """The next message's lines, or None when none came within timeout."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return None
        lines = data.decode().split("\n")
        self.messages.append((time.monotonic(), lines))
        return lines

    def until(self, wanted: str, timeout: float = TIMEOUT) -> list[str]:
        """Messages until one has the line ``wanted`` (returned)."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            assert left > 0, f"no {wanted} within {timeout} s; got {self.messages}"
            lines = self.receive(left)
            if lines is not None and wanted in lines:
                return lines

    def drain(self) -> list[list[str]]:
        """Whatever is waiting now."""
        found = []
        while (lines := self.receive(0.01)) is not None:
            found.append(lines)
        return found

    def lines(self) -> list[str]:
        return [line for _, lines in self.messages for line in lines]

    def close(self) -> None:
        self.sock.close()
        if not self.address.startswith("@"):
            Path(self.address).unlink(missing_ok=True)


@pytest.fixture
def double():
    with MaasDouble() as running:
        yield running


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request, tmp_path):
    # A short path: sun_path holds 108 bytes, and tmp_path can be long.
    address = (f"@maas-kubevirt-test-{uuid.uuid4().hex}" if request.param == "abstract"
               else str(Path("/tmp") / f"mk-notify-{uuid.uuid4().hex[:12]}"))
    held = NotifySocket(address)
    yield held
    held.close()


def environment(held: NotifySocket, watchdog: float = WATCHDOG) -> dict[str, str]:
    return {"NOTIFY_SOCKET": held.address, "WATCHDOG_USEC": str(int(watchdog * 1e6))}


# --- the protocol -------------------------------------------------------------------------------


def test_the_messages_as_systemd_reads_them(notify_socket):
    notifier = notify.Notifier(environment(notify_socket), send=notify._datagram)
    assert notifier.watchdog == WATCHDOG and notifier.slice == WATCHDOG / 4
    notifier.extend_start(660)
    notifier.ready("cycle 1:\nok")
    notifier.ready("cycle 2: ok")
    notifier.alive()
    notifier.extend_watchdog(660)
    notifier.stopping()
    got = [notify_socket.receive(5) for _ in range(6)]
    assert got == [["EXTEND_TIMEOUT_USEC=660000000"], ["READY=1", "STATUS=cycle 1: ok", "WATCHDOG=1"],
                   ["STATUS=cycle 2: ok", "WATCHDOG=1"], ["WATCHDOG=1"], ["WATCHDOG_USEC=660000000"],
                   ["STOPPING=1", "STATUS=stopping"]]


def test_no_socket_no_watchdog_nothing_sent():
    sent = []
    notifier = notify.Notifier({}, send=lambda *a: sent.append(a) or True)
    notifier.ready("x")
    notifier.alive()
    notifier.stopping()
    assert sent == [] and notifier.watchdog is None and notifier.slice is None


def test_a_watchdog_meant_for_another_process_is_not_fed():
    notifier = notify.Notifier({"NOTIFY_SOCKET": "/nowhere", "WATCHDOG_USEC": "1000000",
                                "WATCHDOG_PID": str(os.getpid() + 1)}, send=lambda *a: True)
    assert notifier.watchdog is None


def test_a_socket_that_is_gone_or_full_is_not_an_error(tmp_path, notify_socket):
    assert notify._datagram(str(tmp_path / "gone"), "READY=1") is False
    assert notify._datagram("vsock:2:1234", "READY=1") is False
    # A manager that reads nothing: the queue fills, and sending never blocks the loop.
    sent = [notify._datagram(notify_socket.address, "WATCHDOG=1") for _ in range(5000)]
    assert sent[0] is True and sent[-1] is False


def test_waiting_feeds_the_watchdog_and_ends_at_stop(notify_socket):
    notifier = notify.Notifier(environment(notify_socket, 0.2), send=notify._datagram)
    stop = threading.Event()
    assert notifier.wait(stop, 0.5) is False
    assert len(notify_socket.drain()) >= 2   # every 0.05 s over 0.5 s; at least two is certain
    threading.Timer(0.2, stop.set).start()
    assert notifier.wait(stop, 3600) is True


def test_standing_by_for_the_lease_feeds_the_watchdog(notify_socket):
    class Candidate:
        def __init__(self):
            self.calls = 0

        def wait_held(self, stop, timeout):
            self.calls += 1
            stop.wait(timeout)
            return self.calls >= 4

    notifier = notify.Notifier(environment(notify_socket, 0.2), send=notify._datagram)
    assert _wait_held(Candidate(), threading.Event(), None, notifier) is True
    assert notify_socket.drain() == [["WATCHDOG=1"]] * 3


def test_the_library_path_speaks_the_same_protocol(notify_socket):
    """Debian's python3-systemd, when installed, sends the same message (its own sd_notify)."""
    python = "/usr/bin/python3"
    probe = subprocess.run([python, "-c", "import systemd.daemon"], capture_output=True) \
        if os.path.exists(python) else None
    require(probe is not None and probe.returncode == 0,
            "Debian's python3-systemd is not installed (apt-get install python3-systemd)")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from maas_kubevirt import notify; "
            "n = notify.Notifier(); assert n._send is notify._library; n.ready('via libsystemd')")
    subprocess.run([python, "-c", code, str(ROOT / "src")], check=True, timeout=60,
                   env={**os.environ, **environment(notify_socket)})
    assert notify_socket.receive(5) == ["READY=1", "STATUS=via libsystemd", "WATCHDOG=1"]


# --- the loop -----------------------------------------------------------------------------------


def test_ready_comes_after_the_first_cycle_and_watchdog_every_cycle(tmp_path, double, notify_socket):
    a = double.add_vm("zebra1", "tenantq")
    # The region is slow to answer the first request: READY=1 must wait for it and the cycle.
    double.inject("hang", method="GET", path=r"^version/", hang=2)
    values = write_values(tmp_path, double, interval=1, cycle_deadline=30)
    with LoopProcess(values, environment(notify_socket)) as process:
        ready = notify_socket.until("READY=1")
        # The whole first cycle reached MAAS before READY=1: the password is already in place.
        assert double.counts[("GET", "version/")] >= 2
        assert double.power[a]["power_pass"] == derived("zebra1", "tenantq")
        before = [lines for _, lines in notify_socket.messages[:-1]]
        assert all(not line.startswith(("READY", "WATCHDOG=", "STATUS")) for lines in before for line in lines)
        assert f"WATCHDOG_USEC={int((30 + WATCHDOG_MARGIN) * 1e6)}" in [x for m in before for x in m]
        assert "WATCHDOG=1" in ready and any(line.startswith("STATUS=cycle 1 ") for line in ready)
        for number in (2, 3):
            lines = notify_socket.until("WATCHDOG=1")
            while not any(line.startswith(f"STATUS=cycle {number} ") for line in lines):
                lines = notify_socket.until("WATCHDOG=1")
        code = process.stop()
        notify_socket.until("STOPPING=1", timeout=10)
    assert code == 0, process.text("stderr")
    statuses = [line for line in notify_socket.lines() if line.startswith("STATUS=")]
    assert any("cycle 1 " in s and ": ok in " in s and "1 ours" in s for s in statuses), statuses
    assert "READY=1" not in [x for _, m in notify_socket.messages[notify_socket.messages.index(
        next(item for item in notify_socket.messages if "READY=1" in item[1])) + 1:] for x in m]
    text = "\n".join(notify_socket.lines())
    for secret in [*secrets_of(double), a, "zebra1", "tenantq", derived_user("zebra1", "tenantq"),
                   double.machines[a]["hostname"], "bmc.example.com"]:
        assert secret not in text, f"a notification holds {secret[:6]}..."


def test_the_watchdog_is_fed_while_idle_and_not_while_a_request_never_answers(tmp_path, double, notify_socket):
    double.add_vm("zebra1", "tenantq")
    # Requests wait up to 60 s; the cycle is given up at its deadline (10 s, the smallest).
    values = write_values(tmp_path, double, interval=2, timeout=60, cycle_deadline=10)
    with LoopProcess(values, environment(notify_socket)) as process:
        notify_socket.until("READY=1")
        # Idle between cycles (2 s): WATCHDOG=1 every quarter of WATCHDOG_USEC, not once a cycle.
        lines = notify_socket.until("WATCHDOG=1")
        idle = 0
        while not any(line.startswith("STATUS=cycle 2 ") for line in lines):
            idle += 1
            lines = notify_socket.until("WATCHDOG=1")
        assert idle >= 2, notify_socket.messages
        # Now the event log never answers: the loop thread is stuck in that request.
        double.inject("hang", method="GET", path=r"^events/", hang=3600)
        end = time.monotonic() + TIMEOUT
        while double.faults:
            assert time.monotonic() < end, "the stuck request never came"
            time.sleep(0.05)
        notify_socket.drain()   # sent before the request went out
        silent_for = 3.0         # twelve times the idle feeding period
        end = time.monotonic() + silent_for
        while (left := end - time.monotonic()) > 0:
            lines = notify_socket.receive(left)
            assert lines is None or "WATCHDOG=1" not in lines, "fed while stuck in a MAAS request"
        # The cycle's deadline ends the request; the next WATCHDOG=1 says the cycle gave up.
        lines = notify_socket.until("WATCHDOG=1", timeout=TIMEOUT)
        assert any(line.startswith("STATUS=cycle ") and ": error in " in line for line in lines), lines
        code = process.stop()
    assert code == 0, process.text("stderr")


def test_the_units_watchdog_outlasts_the_longest_legitimate_cycle():
    """WatchdogSec and TimeoutStartSec fit maas.cycle_deadline's default and the margin after it."""
    from maas_kubevirt.values import load_values

    unit = (ROOT / "debian" / "maas-kubevirt.service").read_text().splitlines()
    settings = dict(line.split("=", 1) for line in unit if line and not line.startswith(("#", "[")))
    longest = load_values(None)["maas"]["cycle_deadline"] + WATCHDOG_MARGIN
    for key in ("WatchdogSec", "TimeoutStartSec"):
        minutes = settings[key]
        assert minutes.endswith("min"), f"{key}={minutes}: written in minutes"
        assert int(minutes[:-3]) * 60 >= longest, f"{key}={minutes} is shorter than {longest} s"


class StandbyCandidate:
    """A lease candidate that never gets the Lease (another host holds it)."""
    where, duration, retry_period, terms = "maas-kubevirt/maas-kubevirt-reconciler", 0.4, 0.1, 0

    def held(self):
        return False

    def may_write(self, seconds=None):
        return False

    def wait_held(self, stop, timeout):
        stop.wait(timeout)
        return False

    def holder(self):
        return None

    def start(self):
        pass

    def close(self, release):
        pass


def test_ready_comes_at_the_first_standby_wait_without_a_maas_request(tmp_path, double, notify_socket,
                                                                       monkeypatch, capsys):
    from maas_kubevirt import lease, loop
    from reconcile_helpers import Args, values_for

    double.add_vm("zebra1", "tenantq")
    monkeypatch.setattr(lease, "candidate_from_values", lambda values: StandbyCandidate())
    for key, value in environment(notify_socket, 0.2).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    reader = threading.Thread(target=notify_socket.until, args=("STOPPING=1",), daemon=True)
    reader.start()
    assert loop.main(values_for(tmp_path, double), Args(once=True)) == 0
    reader.join(TIMEOUT)
    capsys.readouterr()
    messages = [lines for _, lines in notify_socket.messages]
    ready = next(m for m in messages if "READY=1" in m)
    assert any(line.startswith("STATUS=standby") for line in ready)
    assert ["WATCHDOG=1"] in messages[messages.index(ready) + 1:]   # fed while standing by
    assert messages[-1] == ["STOPPING=1", "STATUS=stopping"]
    assert double.request_count == 0
