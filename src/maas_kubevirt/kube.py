"""Access to a Kubernetes cluster: the official ``kubernetes`` client reads the kubeconfig.

The kubeconfig is loaded by ``kubernetes.config`` (contexts, client certificates, tokens,
exec and auth-provider plugins, exactly as kubectl reads them); the requests are plain
GETs by API path with requests, answered as the API server's JSON; the pools stage alone also
creates and deletes VirtualMachines (``create``, ``delete``). The generated API classes are not
used: their calling conventions changed completely between the release Debian ships
(python3-kubernetes 22.6) and the current one on PyPI. Lists are paged (``limit``/``continue``).

Secrets: Secrets are listed as metadata only (``PartialObjectMetadataList``), so no Secret
value is ever fetched, except the seed, whose value :meth:`Cluster.secret_digest` turns into
a SHA-256 digest at once and never returns.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Iterator

import warnings

import requests
import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from maas_kubevirt import kubeconfigs, unreachable

PAGE = 500
# connect, read (seconds) for each request
TIMEOUT = (5, 30)
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class KubeConfigError(Exception):
    """The kubeconfig cannot be used (a usage error: exit 2)."""


class KubeError(Exception):
    """A request the API server refused or never answered; the message is one line."""

    def __init__(self, path: str, status: int | None, message: str):
        self.path = path
        self.status = status
        super().__init__(f"GET {path}: {status if status is not None else 'no answer'}: {message}")


class Cluster:
    """One cluster, from a kubeconfig file (and optionally one of its contexts)."""

    def __init__(self, kubeconfig: str, context: str | None = None, source: str = "--kubeconfig"):
        """kubeconfig: one file, or several joined by ':' (merged as kubectl merges $KUBECONFIG);
        source names where it came from in errors."""
        for path in kubeconfigs.files(kubeconfig):
            try:
                with open(path, encoding="utf-8") as handle:
                    yaml.safe_load(handle)
            except OSError as error:
                raise KubeConfigError(f"{source}: cannot read {path!r}: {error.strerror or error}") from None
            except (yaml.YAMLError, UnicodeDecodeError):
                raise KubeConfigError(f"{source}: {path!r} is not a YAML kubeconfig") from None
        try:
            configuration = k8s_client.Configuration()
            k8s_config.load_kube_config(config_file=kubeconfig, context=context,
                                        client_configuration=configuration, persist_config=False)
        except (k8s_config.ConfigException, ValueError, KeyError, TypeError, OSError) as error:
            reason = " ".join(str(error).split())[:200] or type(error).__name__
            raise KubeConfigError(f"{source}: {kubeconfig!r} cannot be used: {reason}") from None
        self.host = configuration.host.rstrip("/")
        self._configuration = configuration
        self.session = requests.Session()
        self.session.trust_env = False
        # insecure-skip-tls-verify: the operator's choice; doctor says so once (not per request).
        self.insecure = not configuration.verify_ssl
        self.session.verify = False if self.insecure else (configuration.ssl_ca_cert or True)
        if configuration.cert_file:
            self.session.cert = (configuration.cert_file, configuration.key_file)
        if configuration.proxy:
            self.session.proxies = {"http": configuration.proxy, "https": configuration.proxy}

    def __repr__(self) -> str:
        return f"Cluster({self.host!r})"

    def close(self) -> None:
        self.session.close()

    def _authorization(self) -> str | None:
        # The key is "BearerToken" in current clients and "authorization" in Debian's 22.6;
        # either call runs the refresh hook of exec and auth-provider plugins.
        conf = self._configuration
        return conf.get_api_key_with_prefix("BearerToken") or conf.get_api_key_with_prefix("authorization")

    # --- transport ------------------------------------------------------------------------
    def _send(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None,
              accept: str = "application/json") -> requests.Response:
        headers = {"Accept": accept, "User-Agent": "maas-kubevirt"}
        token = self._authorization()
        if token:
            headers["Authorization"] = token
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
                return self.session.request(method, self.host + path, params=query or {}, json=body,
                                            headers=headers, timeout=TIMEOUT, allow_redirects=False)
        except requests.RequestException as error:
            raise KubeError(path, None, unreachable.api_server(self.host, error)) from None

    def get(self, path: str, query: dict[str, Any] | None = None, *, metadata_only: bool = False,
            missing_ok: bool = True) -> Any:
        """The JSON object at path; None when it does not exist (404) and missing_ok."""
        reply = self._send("GET", path, query, accept=METADATA_ONLY if metadata_only else "application/json")
        if reply.status_code == 404 and missing_ok:
            return None
        if reply.status_code != 200:
            raise KubeError(path, reply.status_code, _reason(reply))
        try:
            return reply.json()
        except ValueError:
            raise KubeError(path, 200, "the answer is not JSON") from None

    def create(self, path: str, body: dict) -> dict:
        """POST body to the collection at path; the object the API server made."""
        reply = self._send("POST", path, body=body)
        if reply.status_code not in (200, 201, 202):
            raise KubeError(path, reply.status_code, _reason(reply))
        try:
            return reply.json()
        except ValueError:
            raise KubeError(path, reply.status_code, "the answer is not JSON") from None

    def delete(self, path: str) -> bool:
        """DELETE the object at path, its dependents by the garbage collector in the background;
        False when it was already gone."""
        reply = self._send("DELETE", path, body={"kind": "DeleteOptions", "apiVersion": "v1",
                                                   "propagationPolicy": "Background"})
        if reply.status_code == 404:
            return False
        if reply.status_code not in (200, 202):
            raise KubeError(path, reply.status_code, _reason(reply))
        return True

    def items(self, path: str, label_selector: str | None = None, *,
              metadata_only: bool = False) -> Iterator[dict]:
        """Every object of a list, page by page; nothing when the resource does not exist."""
        query: dict[str, Any] = {"limit": PAGE}
        if label_selector:
            query["labelSelector"] = label_selector
        while True:
            page = self.get(path, query, metadata_only=metadata_only)
            if not isinstance(page, dict):
                return
            yield from (item for item in page.get("items") or [] if isinstance(item, dict))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            query["continue"] = token

    # --- what doctor reads ----------------------------------------------------------------
    def crd(self, name: str) -> dict | None:
        return self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")

    def cluster_roles(self) -> list[dict]:
        return list(self.items("/apis/rbac.authorization.k8s.io/v1/clusterroles"))

    def deployments(self, label_selector: str) -> list[dict]:
        """Deployments in every namespace matching the selector."""
        return list(self.items("/apis/apps/v1/deployments", label_selector))

    def cluster_policies(self) -> list[dict]:
        return list(self.items("/apis/kyverno.io/v1/clusterpolicies"))

    def namespaces(self, label_selector: str | None = None) -> list[dict]:
        return list(self.items("/api/v1/namespaces", label_selector))

    def virtual_machines(self, namespace: str) -> list[dict]:
        return list(self.items(f"/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines"))

    def virtual_machine_bmcs(self, namespace: str) -> list[dict]:
        return list(self.items(f"/apis/bmc.kubevirt.io/v1beta1/namespaces/{namespace}/virtualmachinebmcs"))

    def ingresses(self, namespace: str | None) -> list[dict]:
        """The Ingresses of one namespace, or of every namespace (None)."""
        where = f"/namespaces/{namespace}" if namespace is not None else ""
        return list(self.items(f"/apis/networking.k8s.io/v1{where}/ingresses"))

    def network_policies(self, namespace: str) -> list[dict]:
        return list(self.items(f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"))

    # The exposure's objects. A CRD that is not installed answers 404, so its reader returns
    # None or [] like the readers above: the checks say which CRD is missing.
    def gateway(self, namespace: str, name: str) -> dict | None:
        """One Gateway API Gateway (gateway.networking.k8s.io/v1), None when absent."""
        found = self.get(f"/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/gateways/{name}")
        return found if isinstance(found, dict) else None

    def gateways(self) -> list[dict]:
        """The Gateways of every namespace."""
        return list(self.items("/apis/gateway.networking.k8s.io/v1/gateways"))

    def configmap(self, namespace: str, name: str) -> dict | None:
        found = self.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        return found if isinstance(found, dict) else None

    def httproutes(self, namespace: str) -> list[dict]:
        return list(self.items(f"/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/httproutes"))

    def securitypolicies(self, namespace: str) -> list[dict]:
        """Envoy Gateway's SecurityPolicies (gateway.envoyproxy.io/v1alpha1) of one namespace."""
        return list(self.items(f"/apis/gateway.envoyproxy.io/v1alpha1/namespaces/{namespace}/securitypolicies"))

    def daemonsets(self) -> list[dict]:
        """DaemonSets in every namespace (a CNI runs its node agent as one)."""
        return list(self.items("/apis/apps/v1/daemonsets"))

    def secret_names(self, namespace: str) -> set[str]:
        """The names of a namespace's Secrets, listed as metadata only (no value is fetched)."""
        return {
            str((item.get("metadata") or {}).get("name"))
            for item in self.items(f"/api/v1/namespaces/{namespace}/secrets", metadata_only=True)
        }

    def secret_digest(self, namespace: str, name: str, key: str) -> str | None:
        """SHA-256 hex digest of one Secret key's value; None when the Secret or the key is missing."""
        secret = self.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if not isinstance(secret, dict):
            return None
        data = secret.get("data") or {}
        encoded = data.get(key) if isinstance(data, dict) else None
        del secret, data
        if not isinstance(encoded, str):
            return None
        # The API server stores data as base64 of bytes, so the value always decodes.
        return hashlib.sha256(base64.b64decode(encoded)).hexdigest()


def _reason(reply: requests.Response) -> str:
    """The API server's Status message, or the HTTP reason; one line, short."""
    message = ""
    try:
        body = reply.json()
        if isinstance(body, dict):
            message = str(body.get("message") or "")
    except ValueError:
        message = ""
    message = message or str(reply.reason or "")
    return " ".join(message.split())[:300] or "(no message)"
