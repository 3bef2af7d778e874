"""Read-only access to a Kubernetes cluster, through the official ``kubernetes`` client.

Only GET requests, by API path, answered as plain JSON (dicts and lists as the API server
sends them), so the checks in :mod:`maas_kubevirt.doctor` are pure functions over the
objects of the API and do not depend on the client's generated model classes, which lag
behind new API fields. Lists are paged (``limit``/``continue``).

Secrets: Secrets are listed as metadata only (``PartialObjectMetadataList``), so no Secret
value is ever fetched, except the seed, whose value :meth:`Cluster.secret_digest` turns into
a SHA-256 digest at once and never returns.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Iterator

import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

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

    def __init__(self, kubeconfig: str, context: str | None = None):
        try:
            with open(kubeconfig, encoding="utf-8") as handle:
                yaml.safe_load(handle)
        except OSError as error:
            raise KubeConfigError(f"--kubeconfig: cannot read {kubeconfig!r}: {error.strerror or error}") from None
        except (yaml.YAMLError, UnicodeDecodeError):
            raise KubeConfigError(f"--kubeconfig: {kubeconfig!r} is not a YAML kubeconfig") from None
        try:
            configuration = k8s_client.Configuration()
            k8s_config.load_kube_config(config_file=kubeconfig, context=context,
                                        client_configuration=configuration, persist_config=False)
        except (k8s_config.ConfigException, ValueError, KeyError, TypeError, OSError) as error:
            reason = " ".join(str(error).split())[:200] or type(error).__name__
            raise KubeConfigError(f"--kubeconfig: {kubeconfig!r} cannot be used: {reason}") from None
        configuration.retries = 1
        self.host = configuration.host
        self.api = k8s_client.ApiClient(configuration)

    def __repr__(self) -> str:
        return f"Cluster({self.host!r})"

    def close(self) -> None:
        self.api.close()

    # --- transport ------------------------------------------------------------------------
    def get(self, path: str, query: dict[str, Any] | None = None, *, metadata_only: bool = False,
            missing_ok: bool = True) -> Any:
        """The JSON object at path; None when it does not exist (404) and missing_ok."""
        headers = {"Accept": METADATA_ONLY if metadata_only else "application/json"}
        try:
            data, _, _ = self.api.call_api(
                path, "GET", query_params=list((query or {}).items()), header_params=headers,
                response_type="object", auth_settings=["BearerToken"], _request_timeout=TIMEOUT,
                _return_http_data_only=False,
            )
        except ApiException as error:
            if error.status == 404 and missing_ok:
                return None
            raise KubeError(path, error.status, _reason(error)) from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise KubeError(path, None, f"cannot reach the API server at {self.host} ({type(error).__name__})") from None
        return data

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

    def ingresses(self, namespace: str) -> list[dict]:
        return list(self.items(f"/apis/networking.k8s.io/v1/namespaces/{namespace}/ingresses"))

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


def _reason(error: ApiException) -> str:
    """The API server's Status message, or the HTTP reason; one line, short."""
    message = ""
    try:
        body = json.loads(error.body) if error.body else None
        if isinstance(body, dict):
            message = str(body.get("message") or "")
    except (TypeError, ValueError):
        message = ""
    message = message or str(error.reason or "")
    return " ".join(message.split())[:300] or "(no message)"
