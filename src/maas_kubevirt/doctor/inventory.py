"""What doctor's cluster, exposure and BMC proxy rows share of what they read: an opted-in
namespace's objects, a list the API server may forbid, label selectors and Ingress classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from maas_kubevirt import policies


@dataclass
class Inventory:
    """One opted-in namespace as the API server lists it."""
    namespace: str
    vms: list[Mapping[str, Any]]
    secrets: set[str]
    bmcs: set[str]
    ingresses: list[Mapping[str, Any]]


def _listed_or_none(read: Callable[[], list[dict]]) -> list[dict] | None:
    """What read returns, or None when the API server forbids it (a narrower kubeconfig)."""
    from maas_kubevirt.kube import KubeError

    try:
        return read()
    except KubeError as error:
        if error.status != 403:
            raise
        return None


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector matching labels (matchLabels and matchExpressions)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def ingress_classes(ingress: Mapping[str, Any]) -> set[str]:
    """The classes an Ingress names: spec.ingressClassName and the older kubernetes.io/ingress.class
    annotation. The policy refuses a catch-all when either names the BMC class, and so does doctor."""
    spec = ingress.get("spec") or {}
    annotations = (ingress.get("metadata") or {}).get("annotations") or {}
    return {str(name) for name in (spec.get("ingressClassName"), annotations.get(policies.LEGACY_INGRESS_CLASS_ANNOTATION))
            if name}
