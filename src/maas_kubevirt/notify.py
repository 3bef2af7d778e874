"""Telling systemd the service's state: READY=1, WATCHDOG=1, STATUS=, STOPPING=1 (sd_notify(3)).

python3-systemd's ``systemd.daemon.notify`` is used when it can be imported (the Debian package
may have it). Otherwise this module speaks the protocol itself: one AF_UNIX datagram of
newline-separated ``KEY=value`` lines to $NOTIFY_SOCKET, a path or, starting with '@', an
abstract socket name. That fallback is the one the tests and a pip install use, because pip's
systemd-python must be compiled against libsystemd-dev, which would make the virtualenv depend
on a C toolchain for some twenty lines of protocol.

Without $NOTIFY_SOCKET (not run by a Type=notify unit) every call does nothing.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Callable, Mapping

try:
    from systemd import daemon as _daemon  # python3-systemd
except ImportError:  # pragma: no cover - depends on what is installed
    _daemon = None


def _datagram(address: str, message: str) -> bool:
    """Send one notification datagram as sd_notify(3) does; False when it could not be sent."""
    if address.startswith("@"):
        address = "\0" + address[1:]   # an abstract socket (sd_notify(3): "@" is a NUL byte)
    elif not address.startswith("/"):
        return False   # vsock: and other transports are not spoken here
    try:
        # Non-blocking: a service manager that does not read its queue must not stall the loop
        # (a lost WATCHDOG=1 only brings the restart a watchdog is for).
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
            sock.connect(address)
            sock.send(message.encode())
    except OSError:
        return False
    return True


def _one_line(text: str) -> str:
    """A STATUS= value: one line (a newline would start another KEY=value)."""
    return " ".join(text.split())


class Notifier:
    """The notifications of one process. ``watchdog`` is WATCHDOG_USEC in seconds when systemd
    expects WATCHDOG=1 from this process (WATCHDOG_PID, when set, names it), else None."""

    def __init__(self, environ: Mapping[str, str] | None = None,
                 send: Callable[[str, str], bool] | None = None):
        environ = os.environ if environ is None else environ
        self.address = environ.get("NOTIFY_SOCKET", "")
        # The library reads $NOTIFY_SOCKET itself: only when these are the process's own.
        self._send = send or (_library if _daemon is not None and environ is os.environ else _datagram)
        self.watchdog: float | None = None
        usec, pid = environ.get("WATCHDOG_USEC", ""), environ.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog = int(usec) / 1e6
        self.readied = False

    def notify(self, *lines: str) -> bool:
        if not self.address:
            return False
        return self._send(self.address, "\n".join(lines))

    def ready(self, status: str) -> None:
        """READY=1 the first time (start-up is complete), with the status line."""
        lines = [f"STATUS={_one_line(status)}"]
        if not self.readied:
            self.readied = True
            lines.insert(0, "READY=1")
        self.notify(*lines, *(["WATCHDOG=1"] if self.watchdog else []))

    def alive(self) -> None:
        """WATCHDOG=1: the loop thread is not stuck."""
        if self.watchdog:
            self.notify("WATCHDOG=1")

    def extend_watchdog(self, seconds: float) -> None:
        """WATCHDOG_USEC=: systemd's watchdog timeout for the rest of this run (systemd 236+). The
        loop keeps feeding at the pace of the unit's own WatchdogSec (sooner is harmless)."""
        if self.watchdog and seconds > self.watchdog:
            self.notify(f"WATCHDOG_USEC={int(seconds * 1e6)}")

    def extend_start(self, seconds: float) -> None:
        """EXTEND_TIMEOUT_USEC=: the next message (READY=1) comes within this many seconds, though
        longer than TimeoutStartSec= (systemd 236+): the first cycle may take maas.cycle_deadline."""
        if not self.readied:
            self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def stopping(self) -> None:
        self.notify("STOPPING=1", "STATUS=stopping")

    @property
    def slice(self) -> float | None:
        """How long to wait between two WATCHDOG=1: a quarter of the timeout, well inside the half
        sd_watchdog_enabled(3) recommends; None without a watchdog."""
        return None if not self.watchdog else self.watchdog / 4

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """stop.wait(seconds), sending WATCHDOG=1 every slice meanwhile; True when stop was set."""
        if self.slice is None:
            return stop.wait(seconds)
        remaining = seconds
        while remaining > 0:
            step = min(self.slice, remaining)
            if stop.wait(step):
                return True
            remaining -= step
            self.alive()
        return stop.is_set()


def _library(address: str, message: str) -> bool:
    return bool(_daemon.notify(message))
