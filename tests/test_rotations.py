"""rotations.py against a fake CoreV1Api: parsing, the optimistic-concurrency bump, the error lines.

The same module against a real API server, RBAC and Kyverno is in test_rotation_tier.py."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from maas_kubevirt import identity, rotations


class FakeCore:
    """read/replace_namespaced_config_map on one stored ConfigMap, with resourceVersion checks."""

    def __init__(self, data: dict | None = None, exists: bool = True, conflicts: int = 0, fail: int | None = None):
        self.data, self.exists, self.conflicts, self.fail = data, exists, conflicts, fail
        self.version = 1
        self.replaces = 0

    def read_namespaced_config_map(self, name, namespace):
        if self.fail:
            raise ApiException(status=self.fail, reason="Forbidden" if self.fail == 403 else "Error")
        if not self.exists or name != identity.ROTATIONS_CONFIGMAP:
            raise ApiException(status=404, reason="Not Found")
        return k8s_client.V1ConfigMap(metadata=k8s_client.V1ObjectMeta(
            name=name, namespace=namespace, resource_version=str(self.version)), data=dict(self.data) if self.data is not None else None)

    def replace_namespaced_config_map(self, name, namespace, body):
        self.replaces += 1
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1          # another writer got there first
            raise ApiException(status=409, reason="Conflict")
        assert body.metadata.resource_version == str(self.version)
        self.data, self.version = dict(body.data), self.version + 1
        return body


def test_read_returns_the_generations_and_reports_malformed_entries():
    said = []
    api = FakeCore({"web1.tenant-a": "3", "db.primary.tenant-b": "0", "web1": "1", "web2.tenant-a": "01"})
    got = rotations.read(api, report=said.append)
    assert got == {("web1", "tenant-a"): 3, ("db.primary", "tenant-b"): 0}
    assert len(got.malformed) == 2 and said == got.malformed
    assert all(identity.ROTATIONS_CONFIGMAP in line for line in said)
    assert got.resource_version == "1"
    assert rotations.read(FakeCore(None)) == {}


def test_bump_increments_one_vm_and_leaves_the_others():
    api = FakeCore({"web1.tenant-a": "3", "web2.tenant-a": "1"})
    assert rotations.bump(api, "web2", "tenant-a") == 2
    assert rotations.bump(api, "web9", "tenant-b") == 1       # absent: 0 -> 1
    assert api.data == {"web1.tenant-a": "3", "web2.tenant-a": "2", "web9.tenant-b": "1"}
    assert rotations.bump(FakeCore(None), "web1", "tenant-a") == 1  # no data at all (as rendered)



def test_bump_reaches_the_largest_generation_and_goes_no_further():
    """identity.GENERATION_MAX is the last generation a bump writes (the policy admits it); the
    next bump is refused before any write, naming the seed rotation."""
    api = FakeCore({"web1.tenant-a": str(identity.GENERATION_MAX - 1)})
    assert rotations.bump(api, "web1", "tenant-a") == identity.GENERATION_MAX
    assert api.data == {"web1.tenant-a": str(identity.GENERATION_MAX)} and api.replaces == 1
    assert identity.parse_generation(api.data["web1.tenant-a"]) == identity.GENERATION_MAX
    with pytest.raises(rotations.RotationsError, match=f"at {identity.GENERATION_MAX}, the largest generation"):
        rotations.bump(api, "web1", "tenant-a")
    assert api.data == {"web1.tenant-a": str(identity.GENERATION_MAX)} and api.replaces == 1
    with pytest.raises(identity.IdentityError):
        identity.parse_generation(str(identity.GENERATION_MAX + 1))   # what a bump beyond would write

def test_bump_retries_on_conflict_and_gives_up_after_the_attempts():
    api = FakeCore({"web1.tenant-a": "3"}, conflicts=2)
    assert rotations.bump(api, "web1", "tenant-a") == 4 and api.replaces == 3
    stuck = FakeCore({"web1.tenant-a": "3"}, conflicts=99)
    with pytest.raises(rotations.RotationsError, match="409 Conflict 5 times"):
        rotations.bump(stuck, "web1", "tenant-a")
    assert stuck.data == {"web1.tenant-a": "3"}


def test_errors_are_one_line_and_name_the_fix():
    with pytest.raises(rotations.RotationsError) as missing:
        rotations.bump(FakeCore(exists=False), "web1", "tenant-a")
    assert "does not exist" in str(missing.value) and "kubectl apply -k" in str(missing.value)
    with pytest.raises(rotations.RotationsError) as forbidden:
        rotations.read(FakeCore(fail=403))
    assert "403" in str(forbidden.value) and "Role maas-kubevirt-reconciler" in str(forbidden.value)
    for error in (missing.value, forbidden.value):
        assert "\n" not in str(error)
    with pytest.raises(rotations.RotationsError, match="correct it by hand"):
        rotations.bump(FakeCore({"web1.tenant-a": "01"}), "web1", "tenant-a")
    with pytest.raises(rotations.RotationsError, match="rotate the site seed"):
        rotations.bump(FakeCore({"web1.tenant-a": str(identity.GENERATION_MAX)}), "web1", "tenant-a")
    with pytest.raises(rotations.RotationsError, match="not a DNS-1123"):
        rotations.bump(FakeCore({}), "Web1", "tenant-a")


def test_a_refusal_by_the_policy_carries_its_message():
    class Refusing(FakeCore):
        def replace_namespaced_config_map(self, name, namespace, body):
            error = ApiException(status=400, reason="Bad Request")
            error.body = json.dumps({"message": "admission webhook denied the request: generations-are-canonical: ..."})
            raise error

    with pytest.raises(rotations.RotationsError, match="refused: admission webhook denied"):
        rotations.bump(Refusing({}), "web1", "tenant-a")


def _kubeconfig(tmp_path, server: str):
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "token-secret-value"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_rotate_names_the_api_server_it_cannot_reach_not_an_exception(tmp_path, capsys):
    """As doctor says it: `cannot reach the API server at URL (why)`, no credential of the URL."""
    import socket

    from maas_kubevirt import cli

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    kubeconfig = _kubeconfig(tmp_path, f"https://someone:password-secret@127.0.0.1:{port}")
    values = tmp_path / "values.yaml"
    values.write_text(f"reconciler:\n  lease:\n    kubeconfig: {kubeconfig}\n")
    assert cli.main(["--values", str(values), "rotate", "web1.vms"]) == 1
    err = capsys.readouterr().err
    assert err == (f"maas-kubevirt: error: rotate web1.vms: read ConfigMap maas-kubevirt/"
                   f"{identity.ROTATIONS_CONFIGMAP}: cannot reach the API server at https://127.0.0.1:{port} "
                   "(connection refused); check the kubeconfig's server\n")
    assert "MaxRetryError" not in err and "secret" not in err


def test_an_api_server_whose_certificate_is_not_trusted_names_the_fix():
    import ssl

    import urllib3

    from maas_kubevirt import unreachable

    error = urllib3.exceptions.MaxRetryError(None, "/api", reason=urllib3.exceptions.SSLError(
        ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] self-signed certificate")))
    assert unreachable.api_server("https://10.0.0.1:6443", error) == (
        "cannot reach the API server at https://10.0.0.1:6443 (TLS error, certificate not trusted); the "
        "kubeconfig's certificate-authority-data must hold the CA that signed it")


def test_rotate_reads_kubeconfig_as_kubectl_when_the_lease_kubeconfig_is_not_here(tmp_path, capsys, monkeypatch):
    """On a workstation: reconciler.lease.kubeconfig names the region host's file; rotate then
    reads $KUBECONFIG (every file of the list merged, a missing one skipped) and says so."""
    import socket

    from maas_kubevirt import cli, kubeconfigs

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    clusters = tmp_path / "clusters"
    clusters.write_text(json.dumps({"apiVersion": "v1", "kind": "Config",
                                    "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}]}))
    rest = tmp_path / "rest"
    rest.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "x",
                                "users": [{"name": "u", "user": {"token": "t"}}],
                                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", f"{clusters}:{tmp_path / 'missing'}:{rest}")
    values = tmp_path / "values.yaml"
    values.write_text("reconciler:\n  lease:\n    kubeconfig: /nonexistent/kubeconfig\n")
    assert cli.main(["--values", str(values), "rotate", "web1.vms"]) == 1
    err = capsys.readouterr().err
    assert "reconciler.lease.kubeconfig /nonexistent/kubeconfig is not on this host: using $KUBECONFIG" in err
    assert f"cannot reach the API server at http://127.0.0.1:{port} (connection refused)" in err
    monkeypatch.delenv("KUBECONFIG")
    assert cli.main(["--values", str(values), "rotate", "web1.vms"]) == 2
    assert ("reconciler.lease.kubeconfig /nonexistent/kubeconfig is not on this host, and no $KUBECONFIG is set "
            f"and {kubeconfigs.HOME_CONFIG} does not exist: give --kubeconfig FILE, or set $KUBECONFIG"
            ) in capsys.readouterr().err
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert cli.main(["--values", str(values), "rotate", "web1.vms"]) == 2
    assert (f"is not on this host, and $KUBECONFIG names a file that does not exist ({tmp_path / 'missing'}), and "
            f"{kubeconfigs.HOME_CONFIG} is then not read, as by kubectl: point $KUBECONFIG at an existing kubeconfig (or unset "
            f"it to read {kubeconfigs.HOME_CONFIG}), or give --kubeconfig FILE") in capsys.readouterr().err
