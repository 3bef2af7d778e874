"""`maas-kubevirt reconcile` run as a process, its output read line by line as it comes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

# Generous: a loaded test machine may take seconds to start Python and run a cycle.
TIMEOUT = 60.0


class LoopProcess:
    """The reconcile loop in a child process; stop() sends SIGTERM and waits for it."""

    def __init__(self, values: Path, env: Mapping[str, str] | None = None, args: Sequence[str] = ()):
        environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        environ.pop("MAAS_API_KEY", None)
        environ.pop("CREDENTIALS_DIRECTORY", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "maas_kubevirt", "--values", str(values), "reconcile", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.changed = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(name,), daemon=True)
                        for name in self.lines]
        for reader in self.readers:
            reader.start()

    def _read(self, name: str) -> None:
        for line in getattr(self.process, name):
            with self.changed:
                self.lines[name].append(line)
                self.changed.notify_all()

    def wait_line(self, pattern: str, stream: str = "stderr", timeout: float = TIMEOUT) -> re.Match:
        """The first line of that stream matching pattern, waiting for it."""
        end = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines[stream]:
                    found = re.search(pattern, line)
                    if found:
                        return found
                left = end - time.monotonic()
                ended = self.process.poll() is not None and not any(r.is_alive() for r in self.readers)
                assert left > 0 and not ended, (
                    f"no line matching {pattern!r}; {stream} so far:\n{''.join(self.lines[stream])}")
                self.changed.wait(min(left, 0.5))

    def text(self, stream: str) -> str:
        with self.changed:
            return "".join(self.lines[stream])

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(TIMEOUT)
        for reader in self.readers:
            reader.join(TIMEOUT)
        return code

    def __enter__(self) -> "LoopProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(TIMEOUT)
