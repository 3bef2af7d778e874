"""The warm pools as status and ``reconcile --dry-run`` report them: the pool stage's observe and
plan against the MAAS double and a cluster in memory, nothing written to either."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import DOMAIN, SEED, assert_no_secrets, write_values  # noqa: E402
from test_pools import FakeCluster  # noqa: E402

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_PENDING, cli  # noqa: E402
from maas_kubevirt.kube import KubeError  # noqa: E402
from maas_kubevirt.pools import access, observe, vm as pool_vm  # noqa: E402
from maas_kubevirt.pools.spec import from_values  # noqa: E402

NAMESPACE = "maas-pools"
POOL = {"name": "small", "namespace": NAMESPACE, "cores": 2, "memory": "4Gi", "disk": "20Gi",
        "storage_class": "standard", "network": "pxe", "ready": 3, "max": 6, "tags": ["web"]}


class PoolCluster(FakeCluster):
    """The pools' cluster in memory, closed like a kube.Cluster; ``broken`` answers every list with an error."""

    def __init__(self, broken: bool = False):
        super().__init__()
        self.broken = broken
        self.closed = False

    def items(self, path, label_selector=None):
        if self.broken:
            raise KubeError(path, 403, "virtualmachines is forbidden")
        return super().items(path, label_selector)

    def close(self):
        self.closed = True


@pytest.fixture
def double():
    with MaasDouble() as running:
        yield running


@pytest.fixture(autouse=True)
def no_credentials(monkeypatch):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)


def pool_values(tmp_path: Path, double: MaasDouble, kubeconfig: bool = True) -> Path:
    """The double's values with one pool (and the pools' kubeconfig path unless not wanted)."""
    path = write_values(tmp_path, double)
    values = yaml.safe_load(path.read_text())
    values["pools"] = [POOL]
    if kubeconfig:
        values["reconciler"] = {"pools": {"kubeconfig": str(tmp_path / "pools.kubeconfig")}}
    path.write_text(yaml.safe_dump(values))
    return path


def add_pool_vm(cluster: PoolCluster, double: MaasDouble, name: str, mac: str, status: str | None,
                tags: tuple[str, ...] = ("small", "web")) -> str | None:
    """A VM the pool made, with KubeMacPool's MAC, and (unless status is None) its enlisted machine."""
    (pool,) = from_values({"pools": [POOL]})
    made = pool_vm.manifest(pool, name, SEED)
    made["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["macAddress"] = mac
    cluster.objects[f"{observe.vms_path(NAMESPACE)}/{name}"] = made
    if status is None:
        return None
    return double.add_vm(name, NAMESPACE, DOMAIN, hostname=name, status=status, mac_addresses=[mac],
                         tag_names=list(tags))


@pytest.fixture
def site(tmp_path, double, monkeypatch):
    """One pool of five VMs: Ready without its tag web, Ready again after a user had it, Deployed,
    not enlisted yet, failed; a hand-made VM beside them."""
    cluster = PoolCluster()
    monkeypatch.setattr(access, "cluster", lambda values: cluster)
    ids = {"ready": add_pool_vm(cluster, double, "small-bcdfg", "02:00:00:00:00:01", "Ready", ("small",)),
           "released": add_pool_vm(cluster, double, "small-cdfgh", "02:00:00:00:00:05", "Ready"),
           "deployed": add_pool_vm(cluster, double, "small-hjklm", "02:00:00:00:00:02", "Deployed"),
           "failed": add_pool_vm(cluster, double, "small-npqrs", "02:00:00:00:00:04", "Failed commissioning")}
    add_pool_vm(cluster, double, "small-tvwxz", "02:00:00:00:00:03", None)
    double.machines[ids["released"]]["current_installation_result_id"] = 7   # it was deployed
    hand_made = pool_vm.manifest(from_values({"pools": [POOL]})[0], "small-zzzzz", "another seed")
    cluster.objects[f"{observe.vms_path(NAMESPACE)}/small-zzzzz"] = hand_made
    double.writes.clear()
    return cluster, ids, pool_values(tmp_path, double)


def test_status_shows_each_pool_after_the_machines_and_writes_nothing(site, double, capsys):
    cluster, ids, path = site
    assert cli.main(["--values", str(path), "status"]) == EXIT_OK
    out, err = capsys.readouterr()
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("POOL "))
    assert lines[at].split() == ["POOL", "NAMESPACE", "READY", "ON_THE_WAY", "ALLOCATED", "FAILED", "RETIRING",
                                 "TOTAL/MAX", "WANTED"]
    assert lines[at + 1].split() == ["small", NAMESPACE, "1", "1", "1", "1", "1", "5/6", "3"]
    assert any(ids["ready"] in line for line in lines[:at])          # the machines come first
    assert double.writes == [] and len(cluster.objects) == 6 and cluster.closed
    assert_no_secrets(double, out, err)


def test_status_json_has_a_pools_list(site, capsys):
    _, _, path = site
    assert cli.main(["--values", str(path), "status", "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["pools_unread"] is None
    assert report["pools"] == [{"pool": "small", "namespace": NAMESPACE, "ready": 1, "on_the_way": 1, "allocated": 1,
                                "failed": 1, "retiring": 1, "total": 5, "max": 6, "wanted": 3, "creating": 1,
                                "waiting": ["small-npqrs: Failed commissioning"]}]


def test_status_says_why_without_the_pools_kubeconfig_and_still_shows_the_machines(tmp_path, double, capsys):
    sid = double.add_vm("web1", "vms")
    path = pool_values(tmp_path, double, kubeconfig=False)
    assert cli.main(["--values", str(path), "status"]) == EXIT_OK
    out = capsys.readouterr().out
    assert sid in out and f"pools: {access.NEEDS_KUBECONFIG}" in out.splitlines()
    assert cli.main(["--values", str(path), "status", "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["pools"] == [] and report["pools_unread"] == access.NEEDS_KUBECONFIG
    assert [row["system_id"] for row in report["rows"]] == [sid]


def test_status_says_why_when_the_cluster_cannot_be_read(tmp_path, double, capsys, monkeypatch):
    sid = double.add_vm("web1", "vms")
    cluster = PoolCluster(broken=True)
    monkeypatch.setattr(access, "cluster", lambda values: cluster)
    assert cli.main(["--values", str(pool_values(tmp_path, double)), "status"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert any(sid in line for line in lines)
    assert [line for line in lines if line.startswith("pools:")] == [
        "pools: the pools cannot be read: " + str(KubeError(observe.vms_path(NAMESPACE), 403,
                                                            "virtualmachines is forbidden"))]
    assert cluster.closed


def test_status_without_pools_has_no_pool_line(tmp_path, double, capsys):
    double.add_vm("web1", "vms")
    path = write_values(tmp_path, double)
    assert cli.main(["--values", str(path), "status"]) == EXIT_OK
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith(("POOL ", "pools:"))]
    assert cli.main(["--values", str(path), "status", "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["pools"] == [] and report["pools_unread"] is None


# --- reconcile --dry-run -------------------------------------------------------------------------

def test_the_dry_run_shows_the_pool_actions_and_writes_nothing(site, double, capsys):
    cluster, ids, path = site
    assert cli.main(["--values", str(path), "reconcile", "--dry-run"]) == EXIT_OK
    out, err = capsys.readouterr()
    rows = {line.split()[0] + " " + line.split()[1]: line for line in out.splitlines()[1:-1]}
    assert rows[f"tag-machine {ids['ready']}"].split()[2:5] == ["small-bcdfg", "small-bcdfg", NAMESPACE]
    assert rows[f"tag-machine {ids['ready']}"].rstrip().endswith("pool small: tags web")
    assert "pool small: MAAS released small-cdfgh" in rows[f"retire-vm {ids['released']}"]
    assert rows["create-vm -"].split()[:5] == ["create-vm", "-", "-", "-", NAMESPACE]
    assert out.splitlines()[-1].endswith(", 3 for the pools; dry run: nothing changed")
    assert double.writes == [] and len(cluster.objects) == 6
    assert_no_secrets(double, out, err)


def test_the_dry_run_json_lists_the_pool_actions_and_they_are_pending(site, capsys):
    _, ids, path = site
    assert cli.main(["--values", str(path), "reconcile", "--dry-run", "--json", "--detailed-exitcode"]) == EXIT_PENDING
    plan = json.loads(capsys.readouterr().out)
    assert plan["summary"]["pool_actions"] == 3
    retire, tag, create = plan["pool_actions"]
    assert (retire["action"], retire["pool"], retire["namespace"], retire["vm"], retire["system_id"]) == (
        "retire-vm", "small", NAMESPACE, "small-cdfgh", ids["released"])
    assert retire["reason"].startswith("MAAS released small-cdfgh")
    assert tag == {"action": "tag-machine", "pool": "small", "namespace": NAMESPACE, "vm": "small-bcdfg",
                   "system_id": ids["ready"], "hostname": "small-bcdfg", "tags": ["web"], "reason": ""}
    assert create == {"action": "create-vm", "pool": "small", "namespace": NAMESPACE, "vm": None, "system_id": None,
                      "hostname": None, "tags": [], "reason": ""}


def test_pool_actions_alone_are_pending_and_unreadable_pools_fail_the_dry_run(tmp_path, double, capsys, monkeypatch):
    cluster = PoolCluster()
    monkeypatch.setattr(access, "cluster", lambda values: cluster)
    path = pool_values(tmp_path, double)
    assert cli.main(["--values", str(path), "reconcile", "--dry-run", "--detailed-exitcode"]) == EXIT_PENDING
    out = capsys.readouterr().out
    assert out.count("create-vm") == 3 and "0 change(s) planned for 0 machine(s), 3 for the pools" in out
    cluster.broken = True
    assert cli.main(["--values", str(path), "reconcile", "--dry-run", "--detailed-exitcode"]) == EXIT_FAILED
    assert "pools: " in capsys.readouterr().err
