"""kube.Cluster against a small API-server stand-in on 127.0.0.1: the requests it makes.

What is pinned here is the client's side of the contract: bearer-token auth from the
kubeconfig, GET only, paging with limit/continue, Secrets listed as metadata only, the seed
reduced to a digest, 404 as absent and other refusals as one-line errors. The real API
server is exercised by tests/test_doctor_cluster.py on the control plane tier.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from maas_kubevirt import kube

TOKEN = "t0k3n-for-the-stand-in"
SEED = "seed-value-never-leaves-kube-0123456789"


class StandIn:
    def __init__(self):
        self.requests: list[tuple[str, str, dict, str]] = []
        self.objects: dict[str, dict] = {}      # path -> what a GET of it answers
        server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        server.daemon_threads = True
        self.server = server
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self):
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                split = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(split.query).items()}
                accept = self.headers.get("Accept", "")
                stand_in.requests.append(("GET", split.path, query, accept))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self.send(401, status("Unauthorized", 401))
                self.send(*stand_in.answer(split.path, query, accept))

            def do_POST(self):
                stand_in.requests.append(("POST", self.path, {}, ""))
                self.send(405, status("no writes", 405))

            do_PUT = do_DELETE = do_PATCH = do_POST

            def send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def answer(self, path: str, query: dict, accept: str):
        if path in self.objects:
            return 200, self.objects[path]
        if path == "/api/v1/namespaces":
            assert query["limit"] == str(kube.PAGE)
            if "continue" not in query:
                return 200, {"kind": "NamespaceList", "metadata": {"continue": "page2"},
                             "items": [{"metadata": {"name": "a"}}]}
            assert query["continue"] == "page2"
            return 200, {"kind": "NamespaceList", "metadata": {}, "items": [{"metadata": {"name": "b"}}]}
        if path == "/api/v1/namespaces/vms/secrets":
            if "as=PartialObjectMetadataList" not in accept:
                return 400, status("test stand-in: Secrets must be listed as metadata only", 400)
            return 200, {"kind": "PartialObjectMetadataList", "metadata": {},
                         "items": [{"metadata": {"name": "web1-bmc"}}, {"metadata": {"name": "web2-bmc"}}]}
        if path == "/api/v1/namespaces/maas-kubevirt/secrets/maas-kubevirt-seed":
            return 200, {"kind": "Secret", "data": {"seed": base64.b64encode(SEED.encode()).decode()}}
        if path == "/apis/apps/v1/deployments":
            return 403, status('deployments.apps is forbidden: User "doctor" cannot list resource', 403)
        return 404, status("not found", 404)


def status(message: str, code: int) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.server.shutdown()
    server.server.server_close()


def kubeconfig(tmp_path: Path, server: str, token: str = TOKEN) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


def test_reads_page_by_page_and_never_writes(stand_in, tmp_path):
    cluster = kube.Cluster(str(kubeconfig(tmp_path, stand_in.url)))
    assert [n["metadata"]["name"] for n in cluster.namespaces()] == ["a", "b"]
    assert cluster.crd("virtualmachines.kubevirt.io") is None
    assert cluster.virtual_machines("vms") == []
    cluster.close()
    assert {method for method, *_ in stand_in.requests} == {"GET"}


def test_what_the_isolation_checks_read(stand_in, tmp_path):
    cluster = kube.Cluster(str(kubeconfig(tmp_path, stand_in.url)))
    assert cluster.network_policies("vms") == cluster.daemonsets() == []
    assert cluster.ingresses("vms") == cluster.ingresses(None) == []
    cluster.close()
    assert [path for _, path, *_ in stand_in.requests] == [
        "/apis/networking.k8s.io/v1/namespaces/vms/networkpolicies", "/apis/apps/v1/daemonsets",
        "/apis/networking.k8s.io/v1/namespaces/vms/ingresses", "/apis/networking.k8s.io/v1/ingresses"]


def test_what_the_exposure_checks_read(stand_in, tmp_path):
    """The Gateway, its routes and the allowlist objects; an absent CRD answers 404: None or []."""
    cluster = kube.Cluster(str(kubeconfig(tmp_path, stand_in.url)))
    assert cluster.gateway("gw", "bmc") is None
    assert cluster.httproutes("vms") == cluster.securitypolicies("vms") == []
    stand_in.objects["/apis/gateway.networking.k8s.io/v1/namespaces/gw/gateways/bmc"] = {"kind": "Gateway"}
    stand_in.objects["/apis/gateway.envoyproxy.io/v1alpha1/namespaces/vms/securitypolicies"] = {
        "kind": "SecurityPolicyList", "metadata": {}, "items": [{"metadata": {"name": "web1-bmc-allowlist"}}]}
    assert cluster.gateway("gw", "bmc") == {"kind": "Gateway"}
    assert [p["metadata"]["name"] for p in cluster.securitypolicies("vms")] == ["web1-bmc-allowlist"]
    cluster.close()
    assert [path for _, path, *_ in stand_in.requests] == [
        "/apis/gateway.networking.k8s.io/v1/namespaces/gw/gateways/bmc",
        "/apis/gateway.networking.k8s.io/v1/namespaces/vms/httproutes",
        "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/vms/securitypolicies",
        "/apis/gateway.networking.k8s.io/v1/namespaces/gw/gateways/bmc",
        "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/vms/securitypolicies"]
    assert {method for method, *_ in stand_in.requests} == {"GET"}


def test_secrets_are_listed_as_metadata_and_the_seed_as_a_digest(stand_in, tmp_path):
    cluster = kube.Cluster(str(kubeconfig(tmp_path, stand_in.url)))
    assert cluster.secret_names("vms") == {"web1-bmc", "web2-bmc"}
    digest = cluster.secret_digest("maas-kubevirt", "maas-kubevirt-seed", "seed")
    assert digest == hashlib.sha256(SEED.encode()).hexdigest()
    assert cluster.secret_digest("maas-kubevirt", "maas-kubevirt-seed", "other") is None
    assert cluster.secret_digest("maas-kubevirt", "absent", "seed") is None


def test_refusals_are_one_line_errors(stand_in, tmp_path):
    cluster = kube.Cluster(str(kubeconfig(tmp_path, stand_in.url)))
    with pytest.raises(kube.KubeError) as refused:
        cluster.deployments("app=x")
    assert refused.value.status == 403 and "forbidden" in str(refused.value) and "\n" not in str(refused.value)
    bad = kube.Cluster(str(kubeconfig(tmp_path, stand_in.url, token="wrong")))
    with pytest.raises(kube.KubeError) as unauthorised:
        bad.namespaces()
    assert unauthorised.value.status == 401 and "wrong" not in str(unauthorised.value)


def test_an_api_server_that_does_not_answer(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cluster = kube.Cluster(str(kubeconfig(tmp_path, f"http://127.0.0.1:{port}")))
    with pytest.raises(kube.KubeError) as failed:
        cluster.namespaces()
    assert failed.value.status is None and "cannot reach the API server" in str(failed.value)


@pytest.mark.parametrize("text, problem", [
    (None, "cannot read"), ("{not yaml", "not a YAML kubeconfig"), ("apiVersion: v1\nkind: Config\n", "cannot be used"),
])
def test_unusable_kubeconfigs(tmp_path, text, problem):
    path = tmp_path / "kubeconfig"
    if text is not None:
        path.write_text(text)
    with pytest.raises(kube.KubeConfigError) as error:
        kube.Cluster(str(path))
    assert problem in str(error.value) and str(error.value).startswith("--kubeconfig:")


def test_a_kubeconfig_that_skips_tls_verification_is_flagged(stand_in, tmp_path):
    path = kubeconfig(tmp_path, stand_in.url)
    config = yaml.safe_load(path.read_text())
    assert kube.Cluster(str(path)).insecure is False
    config["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    path.write_text(yaml.safe_dump(config))
    assert kube.Cluster(str(path)).insecure is True
