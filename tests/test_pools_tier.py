"""The pools' ServiceAccount on the live control plane (issue 42 items 4 and 8): the rendered RBAC
and policy-pools, Kyverno's own webhook, and requests sent with a token of that account
(TokenRequest, as the reconciler's kubeconfig holds one).

Proven with that token: it creates exactly the VM pools.vm.manifest makes, in its pool's labelled
namespace, and Kyverno stamps its identity as for any VM; every deviation in pools_fixtures is
refused by the pool's rule; nothing is created in a pool namespace without the pools label, nor
where no RoleBinding is; it reads no Secret, updates and patches no VM, creates no DataVolume,
RoleBinding or other object; it deletes its pool VM, and Kyverno refuses its delete of a hand-made
one. An administrator's hand-made VM in a pool namespace is admitted as before.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from controlplane import ControlPlane, _kubeconfig, wait_for
from maas_kubevirt import identity, policies
import pools_fixtures as pf
from test_controlplane import (  # noqa: F401  (fixtures: bundle, site)
    apply, bundle, firmware_of, get, render_bundle, site, wait_policies_ready,
)

# Bounded waits on Kyverno's webhook: run alone, as `timing`, as the other control-plane tiers.
pytestmark = [pytest.mark.usefixtures("bundle"), pytest.mark.timing]

NAMESPACE, UNLABELLED = "pools-tier", "pools-tier-unlabelled"
# A namespace labelled for pools and opted in, but in no pool of the values: no RoleBinding there.
UNBOUND = "pools-tier-unbound"
TIER_POOLS = [{**pf.POOLS[0], "namespace": NAMESPACE}, {**pf.POOLS[1], "namespace": UNLABELLED}]


class Account:
    """kubectl with a token of the pools' ServiceAccount."""

    def __init__(self, cp: ControlPlane, kubeconfig: Path):
        self.cp, self.kubeconfig = cp, kubeconfig

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.cp.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
                              input=input, capture_output=True, text=True, timeout=120)

    def create(self, obj: dict) -> subprocess.CompletedProcess:
        return self.kubectl("create", "-f", "-", input=json.dumps(obj))

    def can(self, verb: str, resource: str, namespace: str) -> bool:
        return self.kubectl("auth", "can-i", verb, resource, "-n", namespace).stdout.strip() == "yes"


def _namespace(cp: ControlPlane, values: dict, name: str, pools_label: bool) -> None:
    labels = {values["kubernetes"]["opt_in_label"]: values["kubernetes"]["opt_in_value"]}
    if pools_label:
        labels.update(pf.POOLS_ENABLED)
    apply(cp, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})


@pytest.fixture(scope="module")
def pools_site(control_plane, site, tmp_path_factory):
    """The site's render with two pools (one namespace labelled for pools, one not), applied; the
    pools' objects and namespaces removed afterwards."""
    cp = control_plane
    directory, values, seed = site
    settings = pf.values(values, TIER_POOLS)
    for name, labelled in ((NAMESPACE, True), (UNLABELLED, False), (UNBOUND, True)):
        _namespace(cp, settings, name, labelled)
    rendered = render_bundle(directory, settings, seed, name="build-pools")
    cp.apply_bundle(rendered.output)
    wait_policies_ready(cp)
    home = settings["reconciler"]["lease"]["namespace"] or settings["kubernetes"]["system_namespace"]
    token = cp.kubectl("create", "token", policies.POOLS_ACCOUNT, "-n", home, "--duration", "1h").stdout.strip()
    kubeconfig = _kubeconfig(tmp_path_factory.mktemp("pools") / "kubeconfig", cp.server, cp.ca, {"token": token})
    yield rendered, Account(cp, kubeconfig)
    cp.kubectl("delete", "clusterpolicy", policies.POOLS_POLICY, "--ignore-not-found", "--wait=true")
    cp.kubectl("delete", "clusterrole", policies.POOLS_ACCOUNT, "--ignore-not-found")
    cp.kubectl("delete", "serviceaccount", policies.POOLS_ACCOUNT, "-n", home, "--ignore-not-found")
    for name in (NAMESPACE, UNLABELLED, UNBOUND):
        cp.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def exact_vm(rendered, suffix: str, pool: str = "small") -> dict:
    return pf.pool_vm(rendered.values, pool=pool, suffix=suffix, seed=rendered.seed)


def refused(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode != 0, result.stdout
    for word in words:
        assert word in result.stderr, result.stderr
    return result.stderr


def test_the_account_creates_exactly_a_pool_vm_and_kyverno_stamps_it(control_plane, pools_site):
    rendered, account = pools_site
    vm = exact_vm(rendered, "bcd24")
    # Kyverno registers the policy's webhooks shortly after the policy turns Ready (a probe that
    # got through before is left behind under its own name).
    probes = itertools.count()
    wait_for(lambda: refused(account.create(pf.hand_made(f"probe-{next(probes)}", NAMESPACE)), "pool-vms-only"), 60,
             "Kyverno to hold the pools' account")
    result = account.create(vm)
    assert result.returncode == 0, result.stderr
    stored = get(control_plane, "virtualmachine", vm["metadata"]["name"], NAMESPACE)
    name = vm["metadata"]["name"]
    assert firmware_of(stored) == {"serial": identity.format_serial(name, NAMESPACE),
                                   "uuid": identity.smbios_uuid(name, NAMESPACE)}
    assert stored["metadata"]["labels"] == vm["metadata"]["labels"]
    assert stored["spec"]["dataVolumeTemplates"] == vm["spec"]["dataVolumeTemplates"]
    # It reads what it made, and the DataVolumes (KubeVirt, absent here, would make them).
    assert account.kubectl("get", "virtualmachine", name, "-n", NAMESPACE).returncode == 0
    listed = account.kubectl("get", "datavolumes", "-n", NAMESPACE, "-o", "json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["items"] == [], listed.stderr
    # And deletes it.
    deleted = account.kubectl("delete", "virtualmachine", name, "-n", NAMESPACE, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr


@pytest.mark.parametrize("case", [case for case, _ in pf.DEVIATIONS])
def test_every_deviation_is_refused(control_plane, pools_site, case):
    rendered, account = pools_site
    index = [c for c, _ in pf.DEVIATIONS].index(case)
    change = dict(pf.DEVIATIONS)[case]
    vm = change(exact_vm(rendered, pf.deviant_suffix(index)))
    refused(account.create(vm), "pool-vm-small")
    assert get(control_plane, "virtualmachine", vm["metadata"]["name"], NAMESPACE) is None


def test_no_vm_in_a_namespace_without_the_pools_label_or_without_the_binding(control_plane, pools_site):
    rendered, account = pools_site
    # large's own namespace, bound but not labelled for pools: Kyverno refuses its exact VM.
    refused(account.create(exact_vm(rendered, "bcd24", pool="large")), "pool-namespaces-only")
    # Labelled, but in no pool of the values: RBAC refuses before any webhook.
    refused(account.create(pf.pool_vm(rendered.values, suffix="bcd25", seed=rendered.seed, namespace=UNBOUND)),
            "forbidden")
    assert not account.can("create", "virtualmachines", UNBOUND)
    assert not account.can("get", "virtualmachines", UNBOUND)


def test_the_account_holds_no_other_right(control_plane, pools_site):
    rendered, account = pools_site
    assert account.can("create", "virtualmachines", NAMESPACE)
    assert account.can("list", "datavolumes.cdi.kubevirt.io", NAMESPACE)
    for verb, resource in (("get", "secrets"), ("list", "secrets"), ("update", "virtualmachines"),
                           ("patch", "virtualmachines"), ("watch", "virtualmachines"),
                           ("deletecollection", "virtualmachines"), ("create", "datavolumes.cdi.kubevirt.io"),
                           ("delete", "datavolumes.cdi.kubevirt.io"), ("create", "rolebindings"),
                           ("create", "pods"), ("create", "configmaps"), ("create", "virtualmachineinstances"),
                           ("update", "virtualmachines/status"), ("create", "persistentvolumeclaims")):
        assert not account.can(verb, resource, NAMESPACE), (verb, resource)
    # The requests themselves, not only the review.
    vm = exact_vm(rendered, "bcd26")
    assert account.create(vm).returncode == 0
    name = vm["metadata"]["name"]
    refused(account.kubectl("patch", "virtualmachine", name, "-n", NAMESPACE, "--type", "merge",
                            "-p", '{"spec": {"runStrategy": "Always"}}'), "forbidden")
    stored = get(control_plane, "virtualmachine", name, NAMESPACE)
    stored["spec"]["template"]["spec"]["domain"]["cpu"]["cores"] = 64
    refused(account.kubectl("replace", "-f", "-", input=json.dumps(stored)), "forbidden")
    refused(account.kubectl("get", "secrets", "-n", NAMESPACE), "forbidden")
    refused(account.create({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                            "metadata": {"name": "stolen", "namespace": NAMESPACE},
                            "spec": {"source": {"pvc": {"namespace": "default", "name": "data"}},
                                     "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}), "forbidden")
    refused(account.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                            "metadata": {"name": "escalate", "namespace": NAMESPACE},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
                            "subjects": [{"kind": "ServiceAccount", "name": policies.POOLS_ACCOUNT,
                                          "namespace": "maas-kubevirt"}]}), "forbidden")
    refused(account.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": NAMESPACE}}),
            "forbidden")
    assert account.kubectl("delete", "virtualmachine", name, "-n", NAMESPACE, "--wait=false").returncode == 0


def test_it_deletes_pool_vms_alone_and_others_are_unaffected(control_plane, pools_site):
    rendered, account = pools_site
    cp = control_plane
    # An administrator's hand-made VMs in the pool namespace: admitted as before.
    for vm in (pf.hand_made("hand", NAMESPACE),
               pf.hand_made("database", NAMESPACE, {"maas-kubevirt.io/pool": "small"})):
        cp.kubectl("create", "-f", "-", input=json.dumps(vm))
    for name in ("hand", "database"):
        refused(account.kubectl("delete", "virtualmachine", name, "-n", NAMESPACE, "--wait=false"),
                "pool-vms-only-on-delete")
        assert get(cp, "virtualmachine", name, NAMESPACE) is not None
    vm = exact_vm(rendered, "bcd27")
    assert account.create(vm).returncode == 0
    deleted = account.kubectl("delete", "virtualmachine", vm["metadata"]["name"], "-n", NAMESPACE, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    # The administrator deletes hand-made VMs as before.
    for name in ("hand", "database"):
        cp.kubectl("delete", "virtualmachine", name, "-n", NAMESPACE, "--wait=false")


def test_the_rendered_policy_is_the_one_applied(control_plane, pools_site):
    rendered, _ = pools_site
    applied = control_plane.get("clusterpolicy", policies.POOLS_POLICY)
    written = yaml.safe_load((rendered.output / "kubernetes" / policies.POOLS_POLICY_FILE).read_text())
    assert [r["name"] for r in applied["spec"]["rules"]] == [r["name"] for r in written["spec"]["rules"]]
