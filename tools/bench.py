#!/usr/bin/env python3
"""Benchmark the reconciler against the MAAS double (`make bench`).

For fleets of 100, 1,000 and 10,000 machines, 10 % of them KubeVirt VMs that have just
enlisted (New, default pool, random hostnames), it measures for two strategies:

- bulk (the reconciler as shipped): one GET machines/ per cycle, power parameters in bulk
  (GET machines/?op=power_parameters&id=...) only for redfish machines not seen before, whose
  status changed or that are ours and commissioning, and once more in bulk for the machines
  about to change;
- per-machine (the naive baseline): one GET machines/{id}/?op=power_parameters per redfish
  machine, twice per cycle (once to plan, once to re-check before applying), nothing remembered;

requests per idle cycle, requests and wall time to converge the batch (cycles until a plan has
no changes; the double finishes commissioning by the next cycle), and the peak Python memory
of the reconciler (tracemalloc, a separate run so it does not slow the timing). The double
runs in its own process so its work is neither timed as ours nor counted in our memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from maas_double import DEFAULT_KEY  # noqa: E402

from maas_kubevirt.maas import MAASClient, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.reconcile import Audit, Passwords, Reconciler, Settings  # noqa: E402

SIZES = [int(s) for s in os.environ.get("BENCH_SIZES", "100,1000,10000").split(",")]
VM_FRACTION = 0.1
MAX_CYCLES = 10


class QuietAudit(Audit):
    """Audit records are counted, not printed (the bench prints a table)."""

    def __init__(self) -> None:
        super().__init__("")
        self.records = 0

    def write(self, *args, **kw):  # noqa: ANN002, ANN003
        self.records += 1
        return {}


class PerMachine(Reconciler):
    """The baseline: per-machine power parameters, twice per cycle, nothing remembered."""

    def power_facts(self, machines):
        found = {}
        for machine in machines:
            if machine.get("power_type") == "redfish":
                system_id = machine["system_id"]
                self._read(system_id)                              # to plan
                found[system_id] = self._read(system_id)          # to re-check
        return found

    def refresh(self, machines, power, pools, actions):
        return actions  # re-checked above already

    def _read(self, system_id):
        parameters = self.client.call("GET", f"machines/{system_id}/", [("op", "power_parameters")],
                                      withhold_body=True)
        return self._judge(parameters if isinstance(parameters, dict) else {})


class Double:
    def __init__(self, machines: int):
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "maas_double.py"), "--machines", str(machines),
             "--vm-fraction", str(VM_FRACTION), "--auto-advance"],
            stdout=subprocess.PIPE, text=True,
        )
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise SystemExit("the MAAS double did not start")

    def requests(self) -> int:
        with urllib.request.urlopen(self.url.replace("/MAAS/", "/_double/stats")) as reply:
            return json.load(reply)["requests"]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def run(strategy: type[Reconciler], machines: int, measure_memory: bool) -> dict:
    double = Double(machines)
    try:
        client = MAASClient(double.url, Signer(*DEFAULT_KEY), timeout=60,
                            retry=RetryPolicy(attempts=2, backoff=0.1))
        audit = QuietAudit()
        reconciler = strategy(client, Settings(domain="bmc.example.com"), audit,
                              passwords=Passwords("be9c" * 16))
        if measure_memory:
            tracemalloc.start()
        start_requests = double.requests()
        started = time.perf_counter()
        cycles = 0
        while cycles < MAX_CYCLES:
            cycles += 1
            result = reconciler.cycle()
            if result.error:
                raise SystemExit(f"cycle failed: {result.error}")
            if not any(action.changes for action in result.actions):
                break
        elapsed = time.perf_counter() - started
        converge_requests = double.requests() - start_requests
        before_idle = double.requests()
        idle_started = time.perf_counter()
        idle = reconciler.cycle()
        idle_seconds = time.perf_counter() - idle_started
        assert not any(action.changes for action in idle.actions)
        idle_requests = double.requests() - before_idle
        peak = tracemalloc.get_traced_memory()[1] if measure_memory else 0
        if measure_memory:
            tracemalloc.stop()
        client.close()
        return {"cycles": cycles, "converge_requests": converge_requests, "seconds": elapsed,
                "idle_requests": idle_requests, "idle_seconds": idle_seconds, "changes": audit.records, "peak": peak}
    finally:
        double.close()


def main() -> int:
    print(f"maas-kubevirt reconciler benchmark: MAAS double in a separate process, "
          f"{int(VM_FRACTION * 100)} % of machines are new KubeVirt VMs\n")
    header = (f"{'machines':>8}  {'strategy':<11} {'idle req/cycle':>14} {'idle s':>6} {'converge req':>12} "
              f"{'converge s':>10} {'cycles':>6} {'changes':>7} {'peak MiB':>8}")
    print(header)
    print("-" * len(header))
    ratios = []
    total = time.perf_counter()
    for size in SIZES:
        rows = {}
        for name, strategy in (("bulk", Reconciler), ("per-machine", PerMachine)):
            timing = run(strategy, size, measure_memory=False)
            memory = run(strategy, size, measure_memory=True)
            timing["peak"] = memory["peak"]
            rows[name] = timing
            print(f"{size:>8}  {name:<11} {timing['idle_requests']:>14} {timing['idle_seconds']:>6.2f} "
                  f"{timing['converge_requests']:>12} "
                  f"{timing['seconds']:>10.2f} {timing['cycles']:>6} {timing['changes']:>7} "
                  f"{timing['peak'] / 2**20:>8.1f}", flush=True)
        bulk, naive = rows["bulk"], rows["per-machine"]
        ratios.append((size, naive["idle_requests"] / max(1, bulk["idle_requests"]),
                       naive["converge_requests"] / max(1, bulk["converge_requests"]),
                       naive["seconds"] / max(1e-9, bulk["seconds"])))
    print("\nper-machine / bulk:")
    for size, idle, converge, seconds in ratios:
        print(f"{size:>8} machines: idle requests x{idle:.0f}, converge requests x{converge:.1f}, "
              f"converge time x{seconds:.1f}")
    print(f"\nbench time {time.perf_counter() - total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
