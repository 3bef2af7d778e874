"""The Grafana dashboard (docs/grafana/maas-kubevirt.json): every PromQL query parses, and names only
metrics, labels and label values that a real scrape of a reconcile loop exports."""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from conftest import require  # noqa: E402
from loop_process import TIMEOUT, LoopProcess  # noqa: E402
from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import add_noise, write_values  # noqa: E402

from maas_kubevirt import metrics  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

try:
    import promql_parser
except ImportError:  # pragma: no cover - a test extra (pyproject.toml), installed by `make venv`
    promql_parser = None

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "grafana" / "maas-kubevirt.json"
# Grafana's own variables are not PromQL: replaced by what Grafana puts there before parsing.
GRAFANA = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
# Labels Prometheus adds to every target's series.
TARGET_LABELS = {"instance", "job"}
# The labels whose values come from fixed sets in metrics.py: a query may name only those.
FIXED = {
    "state": set(metrics.STATES),
    "kind": set(metrics.KINDS),
    "outcome": set(metrics.OUTCOMES) | set(metrics.CYCLE_OUTCOMES),
    "method": set(metrics.METHODS),
    "endpoint": {name for _, name in metrics.FAMILIES} | {"other"},
}


def expressions(node: object) -> list[str]:
    """Every ``expr`` in the dashboard, rows' panels included."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                found.append(value)
            else:
                found.extend(expressions(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(expressions(item))
    return found


def selectors(node: object) -> list[object]:
    """The VectorSelectors of a parsed query (promql_parser's AST)."""
    if type(node).__name__ == "VectorSelector":
        return [node]
    found = []
    for attribute in ("args", "expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        for item in child if isinstance(child, list) else [child]:
            if item is not None and type(item).__module__.startswith("promql_parser"):
                found.extend(selectors(item))
    return found


def grouping(node: object) -> set[str]:
    """Label names in ``by (...)`` clauses."""
    found = set()
    modifier = getattr(node, "modifier", None)
    if type(node).__name__ == "AggregateExpr" and modifier is not None and str(modifier).startswith("by"):
        found |= set(modifier.labels)
    for attribute in ("args", "expr", "lhs", "rhs"):
        child = getattr(node, attribute, None)
        for item in child if isinstance(child, list) else [child]:
            if item is not None and type(item).__module__.startswith("promql_parser"):
                found |= grouping(item)
    return found


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    """Sample name -> its label names, from a real scrape of a loop against the MAAS double, and
    the lease gauge (exported only with reconciler.lease) from the same Metrics class."""
    with MaasDouble() as double, pytest.MonkeyPatch.context() as patch:
        tmp = tmp_path_factory.mktemp("dashboard")
        patch.delenv("MAAS_API_KEY", raising=False)
        for i in range(2):
            double.add_vm(f"zebra{i}", "tenantq")
        add_noise(double)
        double.inject("500", method="GET", path=r"^version/")
        values = write_values(tmp, double, interval=1, metrics_address="127.0.0.1:0")
        with LoopProcess(values) as process:
            port = int(process.wait_line(r"metrics at http://127\.0\.0\.1:(\d+)/metrics")[1])
            end = time.monotonic() + TIMEOUT
            while True:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
                if re.search(r'^maas_kubevirt_cycles_total\{outcome="ok"\} [1-9]', text, re.M):
                    break
                assert time.monotonic() < end, text
                time.sleep(0.2)
            process.stop()
    lease = metrics.Metrics()
    lease.leader(lambda: True)
    text += generate_latest(lease.registry).decode()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def test_the_dashboard_is_grafana_json_with_its_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert 0 <= panel["gridPos"]["x"] and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("convergence", "errors", "latency", "waiting or refused"):
        assert topic in titles, f"no panel or row about {topic}"


def test_every_query_names_exported_metrics_labels_and_values(exported):
    require(promql_parser is not None, "promql-parser is not installed (pip install -e '.[test]')")
    queries = expressions(json.loads(DASHBOARD.read_text()))
    assert len(queries) >= 10
    for query in queries:
        text = query
        for variable, value in GRAFANA.items():
            text = text.replace(variable, value)
        parsed = promql_parser.parse(text)   # raises on a query Prometheus would refuse
        found = selectors(parsed)
        assert found, f"no metric in {query}"
        labels: set[str] = set()
        for selector in found:
            assert selector.name in exported, f"{selector.name} is not exported (query: {query})"
            labels |= exported[selector.name]
            for matcher in selector.matchers.matchers:
                assert matcher.name in exported[selector.name] | TARGET_LABELS, (matcher.name, query)
                if matcher.name in FIXED:
                    for part in matcher.value.split("|"):
                        assert part in FIXED[matcher.name], f"{matcher.name}={part!r} never exported: {query}"
        assert grouping(parsed) <= labels | TARGET_LABELS | {"le"}, query
    # The instance variable's own query, which is not a panel's.
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    for variable in variables:
        if variable["type"] == "query":
            name = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"])
            assert name and name[1] in exported and name[2] in TARGET_LABELS, variable["definition"]


def test_the_package_ships_the_dashboard():
    shipped = (ROOT / "debian" / "maas-kubevirt.docs").read_text().split()
    path = DASHBOARD.relative_to(ROOT)
    assert any(path == Path(entry) or Path(entry) in path.parents for entry in shipped), shipped
