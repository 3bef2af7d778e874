"""Prometheus metrics: a reconcile loop against the MAAS double, scraped over HTTP on 127.0.0.1 and
read with prometheus_client's own parser; labels bounded, no secret and no name in the text."""

from __future__ import annotations

import copy
import re
import sys
import time
import types
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from loop_process import TIMEOUT, LoopProcess  # noqa: E402
from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import (  # noqa: E402
    Args, add_noise, converged, derived_user, secrets_of, values_for, write_values,
)

from maas_kubevirt import loop, maas, metrics, notify  # noqa: E402
from maas_kubevirt.maas import RetryPolicy  # noqa: E402
from maas_kubevirt.values import ValuesError, load_values, validate  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

# Wall-clock bounds: run after the parallel workers, with the machine to itself (tests/conftest.py).
pytestmark = pytest.mark.timing

P = metrics.PREFIX
# Every family the service exports, and the label names each may carry.
LABELS = {
    P + "cycles": {"outcome"},
    P + "cycle_duration_seconds": set(),
    P + "maas_requests": {"method", "endpoint", "code"},
    P + "maas_request_duration_seconds": {"method", "endpoint"},
    P + "actions": {"kind", "outcome"},
    P + "machines": {"state"},
    P + "last_success_timestamp_seconds": set(),
    P + "last_cycle_timestamp_seconds": set(),
    P + "event_log_lag_seconds": set(),
    P + "full_resyncs": set(),
}
# The values each label may take: fixed sets, never a name from MAAS.
VALUES = {
    "outcome": set(metrics.CYCLE_OUTCOMES) | set(metrics.OUTCOMES) | {"other"},
    "method": set(metrics.METHODS) | {"other"},
    "endpoint": {name for _, name in metrics.FAMILIES} | {"other"},
    "kind": set(metrics.KINDS) | {"other"},
    "state": set(metrics.STATES),
    "le": None,   # histogram bucket bounds: numbers
}
CODE = re.compile(r"[1-5][0-9][0-9]|connection|timeout|too-large|other")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        return reply.read().decode()


def samples(text: str) -> dict[str, list]:
    """family name -> its samples, as the client's parser reads the exposition. The client adds a
    ``<counter>_created`` timestamp beside each counter and histogram: read as its own gauge
    family, with the labels of its parent, it is folded into the parent here."""
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        parent = family.name.removesuffix("_created")
        name = parent if family.name.endswith("_created") and parent in LABELS else family.name
        found.setdefault(name, []).extend(family.samples)
    return found


def value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no sample {name} {labels}")


def cycles(text: str) -> float:
    return sum(s.value for s in samples(text).get(P + "cycles", []) if s.name == P + "cycles_total")


def wait_for_cycles(port: int, count: int) -> str:
    end = time.monotonic() + TIMEOUT
    while True:
        text = scrape(port)
        if cycles(text) >= count:
            return text
        assert time.monotonic() < end, f"fewer than {count} cycles counted:\n{text}"
        time.sleep(0.2)


@pytest.fixture
def double():
    with MaasDouble() as running:
        yield running


def loop_with_metrics(tmp_path: Path, double: MaasDouble, **maas: object) -> tuple[LoopProcess, int]:
    values = write_values(tmp_path, double, interval=1, metrics_address="127.0.0.1:0", **maas)
    process = LoopProcess(values)
    port = int(process.wait_line(r"metrics at http://127\.0\.0\.1:(\d+)/metrics")[1])
    return process, port


def test_a_scrape_of_a_running_loop_counts_cycles_requests_actions_and_machines(tmp_path, double):
    vms = [double.add_vm(f"zebra{i}", "tenantq") for i in range(3)]
    # A duplicate claim (two machines, one address) and the look-alikes of add_noise (suspects).
    dup = [double.add_vm("twin7", "tenantq") for _ in range(2)]
    noise = add_noise(double)
    process, port = loop_with_metrics(tmp_path, double)
    with process:
        text = wait_for_cycles(port, 3)
        code = process.stop()
    assert code == 0, process.text("stderr")
    assert converged(double, vms)
    found = samples(text)
    assert set(found) == set(LABELS), set(found) ^ set(LABELS)
    for name, family in found.items():
        for sample in family:
            assert set(sample.labels) - {"le"} <= LABELS[name], (name, sample.labels)
            for label, given in sample.labels.items():
                if label == "code":
                    assert CODE.fullmatch(given), (name, sample.labels)
                elif VALUES[label] is not None:
                    assert given in VALUES[label], (name, sample.labels)
    assert value(text, P + "cycles_total", outcome="ok") >= 3
    assert value(text, P + "cycle_duration_seconds_count") >= 3
    assert value(text, P + "actions_total", kind="set-password", outcome="ok") == 3
    assert value(text, P + "actions_total", kind="duplicate-claim", outcome="refused") == 1
    assert value(text, P + "maas_requests_total", method="GET", endpoint="version", code="200") >= 1
    assert value(text, P + "maas_requests_total", method="PUT", endpoint="machine", code="200") >= 3
    assert value(text, P + "maas_request_duration_seconds_count", method="GET", endpoint="events") >= 2
    assert value(text, P + "machines", state="duplicate") == 2
    assert value(text, P + "machines", state="suspect") >= 1
    assert value(text, P + "machines", state="ours") >= 3 + 2
    assert value(text, P + "machines", state="converged") == 3
    assert value(text, P + "last_success_timestamp_seconds") > time.time() - 3600
    assert 0 <= value(text, P + "event_log_lag_seconds") < 3600
    # Nothing of any machine, and no secret: not the key, seed, passwords or derived users.
    names = [double.machines[sid]["hostname"] for sid in [*vms, *dup, *noise]]
    forbidden = [*secrets_of(double), *vms, *dup, *noise, *names, "zebra", "tenantq", "twin7",
                 derived_user("zebra0", "tenantq"), "bmc.example.com", "S3CRET"]
    for secret in forbidden:
        assert secret not in text, f"the scrape holds {secret[:6]}..."


def test_a_maas_that_answers_errors_is_counted_by_status_and_cycles_by_outcome(tmp_path, double):
    double.add_vm("zebra1", "tenantq")
    double.inject("500", method="GET", path=r"^version/", count=1)
    process, port = loop_with_metrics(tmp_path, double)
    with process:
        text = wait_for_cycles(port, 2)
        process.stop()
    assert value(text, P + "maas_requests_total", method="GET", endpoint="version", code="500") == 1
    assert value(text, P + "cycles_total", outcome="error") == 1
    assert value(text, P + "cycles_total", outcome="ok") >= 1


def test_no_address_no_listener(tmp_path, double):
    double.add_vm("zebra1", "tenantq")
    values = write_values(tmp_path, double, interval=1)
    with LoopProcess(values) as process:
        process.wait_line(r"^\{", stream="stdout")   # an audit record: a cycle ran
        code = process.stop()
    assert code == 0
    assert "metrics at" not in process.text("stderr")


def test_an_address_in_use_is_a_configuration_error(tmp_path, double):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        values = write_values(tmp_path, double, metrics_address=f"127.0.0.1:{taken.getsockname()[1]}")
        with LoopProcess(values) as process:
            code = process.process.wait(TIMEOUT)
            for reader in process.readers:
                reader.join(TIMEOUT)
    assert code == 2
    assert re.search(r"error: maas\.metrics_address 127\.0\.0\.1:\d+: cannot listen: ", process.text("stderr"))
    assert double.request_count == 0


@pytest.mark.parametrize("url, expected", [
    ("http://m:5240/MAAS/api/2.0/machines/", "machines"),
    ("http://m:5240/MAAS/api/2.0/machines/?id=abc123&id=def456", "machines"),
    ("http://m:5240/MAAS/api/2.0/machines/?op=power_parameters&id=abc123", "machines"),
    ("http://m:5240/MAAS/api/2.0/machines/abc123/", "machine"),
    ("http://m:5240/MAAS/api/2.0/machines/abc123/?op=commission", "machine"),
    ("http://m:5240/MAAS/api/2.0/version/", "version"),
    ("http://m:5240/MAAS/api/2.0/users/?op=whoami", "users"),
    ("http://m:5240/MAAS/api/2.0/events/?op=query&level=DEBUG", "events"),
    ("http://m:5240/MAAS/api/2.0/resourcepools/", "pools"),
    ("http://m:5240/MAAS/api/2.0/scripts/31-kubevirt-bmc-config", "scripts"),
    ("http://m:5240/MAAS/api/2.0/nodes/?hostname=web1-vms", "nodes"),
    ("http://m:5240/MAAS/api/2.0/maas/?op=get_config&name=x", "config"),
    ("http://m:5240/MAAS/api/2.0/tags/secret-name/", "other"),
    ("http://m:5240/elsewhere/machines/", "other"),
])
def test_endpoint_family_never_names_an_object(url, expected):
    assert metrics.family(url) == expected


def test_labels_outside_the_fixed_sets_are_other():
    found = metrics.Metrics()
    found.maas_request("PATCH", "http://m/MAAS/api/2.0/machines/abc/", 999, None, 0.1)
    found.maas_request("get", "http://m/MAAS/api/2.0/machines/", None, "weird kind", -1)
    found.action("a-new-kind", "a-new-outcome")
    text = generate_latest(found.registry).decode()
    assert value(text, P + "maas_requests_total", method="other", endpoint="machine", code="other") == 1
    assert value(text, P + "maas_requests_total", method="GET", endpoint="machines", code="other") == 1
    assert value(text, P + "actions_total", kind="other", outcome="other") == 1
    assert "abc" not in text and "weird" not in text and "new" not in text


def test_the_leader_gauge_follows_the_lease_at_each_scrape():
    found = metrics.Metrics()
    held = [False]
    found.leader(lambda: held[0])
    assert value(generate_latest(found.registry).decode(), P + "lease_leader") == 0
    held[0] = True
    assert value(generate_latest(found.registry).decode(), P + "lease_leader") == 1


def test_the_registry_is_private():
    from prometheus_client import REGISTRY

    metrics.Metrics()
    assert not any(name.startswith(P) for name in REGISTRY._names_to_collectors)


@pytest.mark.parametrize("address, ok", [
    ("", True), ("127.0.0.1:9639", True), ("[::1]:9639", True), ("localhost:0", True),
    ("0.0.0.0:9639", True), ("127.0.0.1", False), ("127.0.0.1:65536", False), ("[::1]", False),
    (":9639", False), ("[nope]:9639", False), ("http://127.0.0.1:9639/", False), (9639, False),
])
def test_metrics_address_is_validated(address, ok):
    values = copy.deepcopy(load_values(None))
    values["maas"]["metrics_address"] = address
    if ok:
        validate(values)
        assert metrics.split_address(address) if address else True
        return
    with pytest.raises(ValuesError) as raised:
        validate(values)
    assert str(raised.value).startswith("maas.metrics_address: expected \"\" (off) or host:port")
    assert "\n" not in str(raised.value)


def test_metrics_are_off_by_default():
    assert load_values(None)["maas"]["metrics_address"] == ""


def test_every_audit_record_is_counted_once_the_reconcilers_rotations_too():
    """The loop's audit log counts at write, which records of actions and rotations both reach."""
    from maas_kubevirt import loop
    from maas_kubevirt.reconcile import Action

    found = metrics.Metrics()
    audit = loop._CountedAudit("", found.action)
    audit.record(Action("set-password", "abc", "web1-vms", "web1", "vms"), "ok")
    audit.write("rotate", "abc", None, "0", "1", "ok", identity="web1.vms")
    text = generate_latest(found.registry).decode()
    assert value(text, P + "actions_total", kind="set-password", outcome="ok") == 1
    assert value(text, P + "actions_total", kind="rotate", outcome="ok") == 1


def machine_gauges(text: str) -> dict[str, float]:
    return {state: value(text, P + "machines", state=state) for state in metrics.STATES}


def test_a_cycle_that_gave_up_leaves_the_lag_and_the_machine_gauges_as_they_were():
    """Only a cycle that made its plan read MAAS to the end of its log."""
    now = [1000.0]
    found = metrics.Metrics(clock=lambda: now[0])
    found.cycle("ok", 1000.0, 2.0, {"ours": 3, "converged": 2, "pending": 1}, resyncs=1)
    now[0] = 1060.0
    kept = machine_gauges(generate_latest(found.registry).decode())
    for outcome in ("error", "interrupted"):
        found.cycle(outcome, 1050.0, 1.0, {}, resyncs=1)
        text = generate_latest(found.registry).decode()
        assert value(text, P + "event_log_lag_seconds") == 60.0, outcome
        assert machine_gauges(text) == kept == {**dict.fromkeys(metrics.STATES, 0.0), "ours": 3.0,
                                                "converged": 2.0, "pending": 1.0}, outcome
    # One whose actions failed did read MAAS: the lag and the gauges follow it.
    found.cycle("failed", 1055.0, 1.0, {"ours": 4}, resyncs=1)
    text = generate_latest(found.registry).decode()
    assert value(text, P + "event_log_lag_seconds") == 5.0
    assert machine_gauges(text) == {**dict.fromkeys(metrics.STATES, 0.0), "ours": 4.0}


def test_a_loop_cycle_that_cannot_reach_maas_leaves_the_lag_and_the_machine_gauges_as_they_were(
        tmp_path, double, monkeypatch, capsys):
    double.add_vm("zebra1", "tenantq")
    double.add_vm("zebra2", "tenantq")
    now = [1000.0]
    clock = types.SimpleNamespace(monotonic=lambda: now[0], strftime=time.strftime, gmtime=time.gmtime)
    found = metrics.Metrics(clock=clock.monotonic)
    scrapes: list[str] = []

    class TwoCycles(notify.Notifier):
        def wait(self, stop, seconds):
            now[0] += 30
            scrapes.append(generate_latest(found.registry).decode())
            # Unreachable from the second cycle on: no listener, and the open connection reset.
            double.inject("reset", count=1000)
            double.stop()
            return len(scrapes) == 2

    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(loop, "_serve_metrics", lambda values, dry_run: found)
    monkeypatch.setattr(loop, "Notifier", TwoCycles)
    monkeypatch.setattr(maas, "RETRY", RetryPolicy(attempts=2, backoff=0.01, max_backoff=0.01, max_retry_after=0.01))
    assert loop.main(values_for(tmp_path, double), Args(interval=1)) == 0
    first, second = scrapes
    assert value(first, P + "cycles_total", outcome="ok") == value(second, P + "cycles_total", outcome="error") == 1
    assert value(first, P + "event_log_lag_seconds") == 30.0
    assert value(second, P + "event_log_lag_seconds") == 60.0, "the lag counts from the last cycle that read MAAS"
    assert machine_gauges(second) == machine_gauges(first) and machine_gauges(first)["ours"] == 2
    assert re.search(r"cycle failed: .*: connection refused", capsys.readouterr().err)
