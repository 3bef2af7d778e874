"""A live Kubernetes control plane on 127.0.0.1 for the tests: the `control_plane` fixture.

etcd, kube-apiserver (RBAC, service-account tokens), kube-controller-manager (ClusterRole
aggregation, garbage collector, namespace, service-account and PVC-protection controllers) and Kyverno's
admission and background controllers, out of cluster, each as its own ServiceAccount. The
binaries and Kyverno's install manifest come from `tools/build-controlplane`, through the
`CONTROLPLANE_BIN` environment variable (the Makefile's `test` target sets it); without it
the tests that use the fixture skip, and fail under CI=true.

Any test file may ask for the `control_plane` fixture: conftest.py offers it (session scope: one
control plane for the whole run). The object it yields has:

- `kubeconfig`: path of an admin kubeconfig (client certificate in `system:masters`), for
  `kubectl --kubeconfig` or `kubernetes.config.load_kube_config(config_file=...)`;
- `server`: the API server's URL; `logs`: the directory of every component's log;
- `kubectl(*args, input=None, check=True)`: run kubectl as admin, return the
  `subprocess.CompletedProcess` (text); `check` raises `KubectlError` with its stderr;
- `get(kind, name=None, namespace=None)`: `kubectl get -o json`, parsed;
- `apply_bundle(output)`: `kubectl apply -k <output>/kubernetes/`, exactly as README.md says;
- `log_tail(name, lines)`: the end of one component's log (etcd, kube-apiserver,
  kube-controller-manager, kyverno-admission-controller, kyverno-background-controller).

CRDs installed besides Kyverno's: kubevirtBMC's `VirtualMachineBMC`, KubeVirt's
`VirtualMachine`, `VirtualMachineInstance`, `VirtualMachineInstanceReplicaSet` and
`VirtualMachinePool`, and CDI's `DataVolume`. kubevirtBMC's and KubeVirt's CRD texts are not on
the Go module proxy (kubevirtBMC is not published there; KubeVirt generates its CRDs in code), so
all of them are written below from the upstream contracts, kubevirtBMC's with the structural
schema of the fields the bundle sets.

With `TRAEFIK` set (the directory `tools/build-traefik` prints; the Makefile's `test` target sets
it), the CRDs of its `crds/` are installed too, before Kyverno starts (Kyverno, run without
--crdWatcher, refuses policies on kinds it did not know when it started): Gateway API's at the
version Traefik serves, Traefik's traefik.io group and Envoy Gateway's SecurityPolicy. `traefik`
is then that directory (the traffic tier, tests/test_traffic_tier.py, runs its binary), else
None with the reason in `traefik_missing`: the traffic tier alone skips. Under CI=true a missing
TRAEFIK fails the start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import yaml

from conftest import IN_CI, require

BIN_ENV = "CONTROLPLANE_BIN"
TRAEFIK_ENV = "TRAEFIK"
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
    "kyverno-admission-controller",
    "kyverno-background-controller",
)
KYVERNO_MANIFEST = "kyverno-install.yaml"
KYVERNO_NAMESPACE = "kyverno"
# The two Kyverno Deployments run here as processes; the others (cleanup, reports) not at all.
KYVERNO_CONTROLLERS = ("kyverno-admission-controller", "kyverno-background-controller")
STARTUP_TIMEOUT = 180


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its command line and stderr."""

    def __init__(self, args: list[str], result: subprocess.CompletedProcess):
        self.result = result
        self.stderr = result.stderr
        super().__init__(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check: Callable[[], object], timeout: float, what: str, interval: float = 0.5):
    """Poll check() until it returns a true value; on timeout raise with the last error."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as error:  # the last failure is the useful part of the report
            last = error
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def stop_process_group(process: subprocess.Popen, grace: float = 15, kill_wait: float | None = 15) -> None:
    """SIGTERM to the group of a process started with start_new_session, SIGKILL after ``grace`` s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(kill_wait)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_certificates(pki: Path) -> None:
    """A CA, the API server's serving certificate and the two client certificates."""
    pki.mkdir(mode=0o700)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=maas-kubevirt-test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=pki)
    certificates = {
        "apiserver": ("/CN=kube-apiserver", "serverAuth", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        "admin": ("/O=system:masters/CN=maas-kubevirt-test-admin", "clientAuth", None),
        "controller-manager": ("/CN=system:kube-controller-manager", "clientAuth", None),
    }
    for name, (subject, usage, san) in certificates.items():
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=pki)
        (pki / f"{name}.ext").write_text(f"extendedKeyUsage={usage}\n" + (f"{san}\n" if san else ""))
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=pki)
    _openssl("genrsa", "-out", "service-account.key", "2048", cwd=pki)


def _kubeconfig(path: Path, server: str, ca: Path, user: dict) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _crd(group: str, kind: str, plural: str, versions: tuple[str, ...], spec_schema: dict, short_names=(),
         status_subresource: bool = True, singular: str | None = None) -> dict:
    """A namespaced CustomResourceDefinition, the first version stored, with a status subresource
    unless status_subresource is False."""
    names = {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": singular or kind.lower()}
    if short_names:
        names["shortNames"] = list(short_names)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": names,
            "scope": "Namespaced",
            "versions": [{
                "name": version,
                "served": True,
                "storage": version == versions[0],
                **({"subresources": {"status": {}}} if status_subresource else {}),
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": spec_schema,
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
                }},
            } for version in versions],
        },
    }


def _reference(description: str) -> dict:
    return {"type": "object", "description": description, "x-kubernetes-map-type": "atomic",
            "properties": {"name": {"type": "string", "default": ""}}}


# Contracts: kubevirtBMC config/crd/bases/bmc.kubevirt.io_virtualmachinebmcs.yaml (group, kind,
# short names, spec.virtualMachineRef and spec.authSecretRef required, unknown fields pruned);
# KubeVirt staging/src/kubevirt.io/api (kubevirt.io/v1 VM, VMI, VMIRS; pool.kubevirt.io
# VMPool, served as v1alpha1 and as v1beta1, which newer KubeVirt releases add).
TEST_CRDS = (
    _crd("bmc.kubevirt.io", "VirtualMachineBMC", "virtualmachinebmcs", ("v1beta1",), {
        "type": "object",
        "required": ["authSecretRef", "virtualMachineRef"],
        "properties": {
            "virtualMachineRef": _reference("the VirtualMachine this BMC drives"),
            "authSecretRef": _reference("the Secret with keys username and password"),
            "ipmi": {"type": "object", "properties": {"enabled": {"type": "boolean"}}},
            "service": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "redfish": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }, short_names=("vmbmc", "vmbmcs")),
    _crd("kubevirt.io", "VirtualMachine", "virtualmachines", ("v1",),
         {"type": "object", "x-kubernetes-preserve-unknown-fields": True}, short_names=("vm", "vms")),
    # No status subresource: KubeVirt's NewVirtualMachineInstanceCrd
    # (pkg/virt-operator/resource/generate/components/crds.go) declares none, so virt-handler writes
    # an instance's phase with an update of the instance itself, and admission sees that update.
    _crd("kubevirt.io", "VirtualMachineInstance", "virtualmachineinstances", ("v1",),
         {"type": "object", "x-kubernetes-preserve-unknown-fields": True}, short_names=("vmi", "vmis"),
         status_subresource=False),
    _crd("kubevirt.io", "VirtualMachineInstanceReplicaSet", "virtualmachineinstancereplicasets", ("v1",),
         {"type": "object", "x-kubernetes-preserve-unknown-fields": True}, short_names=("vmirs", "vmirss")),
    _crd("pool.kubevirt.io", "VirtualMachinePool", "virtualmachinepools", ("v1beta1", "v1alpha1"),
         {"type": "object", "x-kubernetes-preserve-unknown-fields": True}, short_names=("vmpool", "vmpools")),
    # CDI's DataVolume (cdi.kubevirt.io/v1beta1, short names dv and dvs: the DataVolume type in
    # staging/src/kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1/types.go of
    # kubevirt/containerized-data-importer), which a pool VM's disk is; the pools' account reads them.
    _crd("cdi.kubevirt.io", "DataVolume", "datavolumes", ("v1beta1",),
         {"type": "object", "x-kubernetes-preserve-unknown-fields": True}, short_names=("dv", "dvs")),
    # Multus's NetworkAttachmentDefinition, as the CRD of deployments/multus-daemonset.yml in
    # github.com/k8snetworkplumbingwg/multus-cni declares it (plural network-attachment-definitions,
    # short names nad and net-attach-def, spec.config a string holding the CNI configuration as
    # JSON, no status subresource), so that examples/pxe-nad.yaml is admitted here as in a cluster.
    _crd("k8s.cni.cncf.io", "NetworkAttachmentDefinition", "network-attachment-definitions", ("v1",),
         {"type": "object", "properties": {"config": {"type": "string"}}}, short_names=("nad", "net-attach-def"),
         status_subresource=False, singular="network-attachment-definition"),
)


@dataclass
class ControlPlane:
    """The running control plane: see the module docstring."""

    bin_dir: Path
    work: Path
    kubeconfig: Path = None  # type: ignore[assignment]
    server: str = ""
    logs: Path = None  # type: ignore[assignment]
    processes: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    traefik: Path | None = None     # tools/build-traefik's directory, its CRDs installed
    traefik_missing: str = ""       # why traefik is None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise KubectlError(list(args), result)
        return result

    def get(self, kind: str, name: str | None = None, namespace: str | None = None) -> dict:
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        return json.loads(self.kubectl(*args).stdout)

    def apply_bundle(self, output: str | Path) -> subprocess.CompletedProcess:
        """Install a rendered bundle the README's way: kubectl apply -k <output>/kubernetes/."""
        return self.kubectl("apply", "-k", f"{output}/kubernetes/")

    def log_tail(self, name: str, lines: int = 60) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # Start-up, in order.

    def _start(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, cwd=self.work, start_new_session=True,
        )
        log.close()
        self.processes.append((name, process))
        return process

    def _alive(self, name: str) -> bool:
        for started, process in self.processes:
            if started == name and process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.log_tail(name, 30)}")
        return True

    def start(self) -> None:
        self.logs = self.work / "logs"
        self.logs.mkdir()
        pki = self.work / "pki"
        _make_certificates(pki)
        self._start_etcd()
        self._start_apiserver(pki)
        self._start_controller_manager(pki)
        self._install_kyverno()
        self._install_test_crds()
        self._start_kyverno()

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._start("etcd", [
            str(self.bin_dir / "etcd"), "--name", "test", "--data-dir", str(self.work / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"test=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ])

        def healthy() -> bool:
            self._alive("etcd")
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:
                return json.load(response).get("health") == "true"

        wait_for(healthy, 60, "etcd to be healthy")

    def _start_apiserver(self, pki: Path, port: int | None = None) -> None:
        port = port or free_port()
        self.server = f"https://127.0.0.1:{port}"
        self.ca = pki / "ca.crt"
        self._start("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(port),
            "--cert-dir", str(pki),
            "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(self.ca),
            "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(pki / "service-account.key"),
            "--service-account-signing-key-file", str(pki / "service-account.key"),
            "--service-cluster-ip-range", "10.0.0.0/24", "--endpoint-reconciler-type", "none",
        ])
        self.kubeconfig = _kubeconfig(self.work / "admin.kubeconfig", self.server, self.ca, {
            "client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key"),
        })

        def ready() -> bool:
            self._alive("kube-apiserver")
            return self.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"

        wait_for(ready, STARTUP_TIMEOUT, "kube-apiserver /readyz")

    def _start_controller_manager(self, pki: Path) -> None:
        kubeconfig = _kubeconfig(self.work / "controller-manager.kubeconfig", self.server, self.ca, {
            "client-certificate": str(pki / "controller-manager.crt"),
            "client-key": str(pki / "controller-manager.key"),
        })
        self._start("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), "--kubeconfig", str(kubeconfig),
            "--secure-port", "0", "--leader-elect=false", "--use-service-account-credentials=true",
            "--controllers", "clusterrole-aggregation-controller,garbage-collector-controller,"
            "namespace-controller,serviceaccount-controller,"
            # A PersistentVolumeClaim (examples/pxe-vm.yaml's) carries a finalizer only this removes.
            "persistentvolumeclaim-protection-controller",
        ])

        def default_account() -> bool:
            self._alive("kube-controller-manager")
            return self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0

        wait_for(default_account, STARTUP_TIMEOUT, "kube-controller-manager to create default/default")

    def _install_kyverno(self) -> None:
        """Kyverno's CRDs, namespace, ConfigMaps and RBAC from its install manifest; no workloads."""
        documents = [d for d in yaml.safe_load_all((self.bin_dir / KYVERNO_MANIFEST).read_text()) if d]
        self.kyverno_deployments = {
            d["metadata"]["name"]: d for d in documents if d["kind"] == "Deployment"
        }
        kept = [d for d in documents if d["kind"] not in ("Deployment", "Job", "CronJob", "Pod")]
        # Server-side: the CRDs are too large for the last-applied annotation.
        self.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(kept))
        self.kubectl("wait", "--for", "condition=Established", "crd", "--all", "--timeout", "120s")

    def _install_test_crds(self) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(TEST_CRDS))
        names = [crd["metadata"]["name"] for crd in TEST_CRDS]
        self.traefik, self.traefik_missing = traefik_dir()
        if self.traefik is not None:
            crds = gateway_crds(self.traefik)
            self.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
            names += [crd["metadata"]["name"] for crd in crds]
        self.kubectl("wait", "--for", "condition=Established", *(f"crd/{name}" for name in names),
                     "--timeout", "60s")

    def _controller_command(self, deployment: str) -> tuple[list[str], dict]:
        """The Deployment's container args and env, as a process here: its flags, minus the in-cluster ones."""
        container = self.kyverno_deployments[deployment]["spec"]["template"]["spec"]["containers"][0]
        env = {}
        for variable in container.get("env", []):
            if "value" in variable:
                env[variable["name"]] = variable["value"]
            elif variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                env[variable["name"]] = KYVERNO_NAMESPACE
            elif variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[variable["name"]] = f"{deployment}-local"
        env.pop("TUF_ROOT", None)
        return list(container.get("args", [])), env

    def _start_kyverno(self) -> None:
        for deployment in KYVERNO_CONTROLLERS:
            account = deployment  # each Deployment runs as the ServiceAccount of the same name
            token = self.kubectl("create", "token", account, "-n", KYVERNO_NAMESPACE, "--duration", "48h").stdout.strip()
            kubeconfig = _kubeconfig(self.work / f"{deployment}.kubeconfig", self.server, self.ca, {"token": token})
            args, env = self._controller_command(deployment)
            overrides = {
                "kubeconfig": str(kubeconfig),
                # Two controllers on one host: no default ports (:8000, :8080) may collide.
                "metricsHost": "127.0.0.1",
                "metricsPort": str(free_port()),
                "controllerRuntimeMetricsAddress": "0",
                "loggingFormat": "json",  # one JSON object a line, so tests can pick out errors
            }
            if deployment == "kyverno-admission-controller":
                webhook_port = free_port()
                overrides.update({
                    "serverIP": f"127.0.0.1:{webhook_port}",  # webhooks by URL, not by Service
                    "webhookServerHost": "127.0.0.1",
                    "webhookServerPort": str(webhook_port),
                })
            kept = [a for a in args if a.lstrip("-").split("=", 1)[0] not in overrides]
            binary = self.bin_dir / deployment
            self._start(deployment, [str(binary), *kept, *(f"--{k}={v}" for k, v in overrides.items())], env)

        def webhooks_registered() -> bool:
            for deployment in KYVERNO_CONTROLLERS:
                self._alive(deployment)
            # The webhook answers TLS handshakes only once its certificate Secret exists.
            return all(self.kubectl(*query, check=False).returncode == 0 for query in (
                ("get", "validatingwebhookconfiguration", "kyverno-policy-validating-webhook-cfg"),
                ("-n", KYVERNO_NAMESPACE, "get", "secret", "kyverno-svc.kyverno.svc.kyverno-tls-pair"),
            ))

        wait_for(webhooks_registered, STARTUP_TIMEOUT, "Kyverno to register its policy webhook and certificate")

    def stop(self) -> None:
        """Stop every process, last started first, each before the next (etcd last)."""
        for _, process in reversed(self.processes):
            stop_process_group(process)


@dataclass
class APIServerOnly(ControlPlane):
    """etcd and kube-apiserver alone (RBAC, ServiceAccount tokens: all a Lease needs), for tests that
    stop the API server: ``stop_apiserver()`` kills it (SIGKILL, at once), ``start_apiserver()``
    starts it again on the same port with the same certificates, etcd keeping every object."""

    def start(self) -> None:
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.pki = self.work / "pki"
        _make_certificates(self.pki)
        self._start_etcd()
        self._start_apiserver(self.pki)
        self.port = int(self.server.rsplit(":", 1)[1])

    def stop_apiserver(self) -> None:
        for entry in [e for e in self.processes if e[0] == "kube-apiserver"]:
            if entry[1].poll() is None:
                os.killpg(entry[1].pid, signal.SIGKILL)
            entry[1].wait(timeout=15)
            self.processes.remove(entry)

    def start_apiserver(self) -> None:
        self._start_apiserver(self.pki, self.port)


def traefik_dir() -> tuple[Path | None, str]:
    """TRAEFIK's directory (tools/build-traefik: `traefik` and `crds/`), or None and why. Under
    CI=true a missing one fails (conftest.require): CI runs every tier."""
    value = os.environ.get(TRAEFIK_ENV, "")
    reason = ""
    if not value:
        reason = f"{TRAEFIK_ENV} is not set: run `make test`, or {TRAEFIK_ENV}=$(tools/build-traefik)"
    else:
        directory = Path(value)
        if not (directory / "traefik").is_file() or not (directory / "crds" / ".done").is_file():
            reason = f"{TRAEFIK_ENV}={directory} lacks traefik or crds/: run tools/build-traefik"
    require(not (reason and IN_CI), reason)
    return (None, reason) if reason else (Path(value), "")


def gateway_crds(directory: Path) -> list[dict]:
    """The CustomResourceDefinitions in <TRAEFIK>/crds/ (every *.yaml and *.yml, every document)."""
    documents = []
    for path in sorted([*(directory / "crds").glob("*.yaml"), *(directory / "crds").glob("*.yml")]):
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "CustomResourceDefinition"]
    return documents


def binaries_dir() -> Path:
    """The CONTROLPLANE_BIN directory with every binary; skip (fail under CI=true) when absent."""
    value = os.environ.get(BIN_ENV, "")
    require(bool(value), f"{BIN_ENV} is not set: run `make test`, or {BIN_ENV}=$(tools/build-controlplane)")
    directory = Path(value)
    missing = [name for name in (*BINARIES, KYVERNO_MANIFEST) if not (directory / name).is_file()]
    require(not missing, f"{BIN_ENV}={directory} lacks {', '.join(missing)}: run tools/build-controlplane")
    require(shutil.which("openssl") is not None, "openssl is not installed (the tier makes its certificates)")
    return directory


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory, request):
    """One live control plane for the session; stopped, and its logs summarised on failure, at the end."""
    plane = ControlPlane(bin_dir=binaries_dir(), work=tmp_path_factory.mktemp("controlplane"))
    failed_before = request.session.testsfailed
    try:
        plane.start()
    except BaseException as error:
        plane.stop()
        tails = "\n".join(f"--- {name} (last lines) ---\n{plane.log_tail(name, 25)}" for name, _ in plane.processes)
        pytest.fail(f"the control plane did not start: {error}\nlogs in {plane.logs}\n{tails}", pytrace=False)
    yield plane
    plane.stop()
    if request.session.testsfailed > failed_before:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"\ncontrol plane logs: {plane.logs}")
            for name, _ in plane.processes:
                reporter.write_line(f"--- {name} (last 40 lines) ---\n{plane.log_tail(name, 40)}")
