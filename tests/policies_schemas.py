"""Validate rendered objects against their upstream schemas.

- Core kinds (Namespace, Secret, ClusterRole, Ingress): the kubernetes-validate package
  (strict: unknown fields are errors), plus the apimachinery name rules its JSON schemas do
  not carry (object names, label and annotation keys, Ingress hosts).
- ClusterPolicy: the CRD schema shipped in the Kyverno Go module (config/crds), read at test
  time from the Go module cache (downloaded with `go mod download` when missing); objects
  with declared properties are closed, as the API server's strict field validation does.
- VirtualMachineBMC: kubevirtBMC's Go module is not on the Go module proxy, so its CRD cannot
  be fetched at test time; VMBMC_SCHEMA states the v1beta1 spec fields the policy writes,
  as documented by kubevirtBMC's CRD (config/crd/bases/bmc.kubevirt.io_virtualmachinebmcs.yaml).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

from maas_kubevirt import upstream

KYVERNO_MODULE = "github.com/kyverno/kyverno"
# The release tools/build-kyverno builds: upstream.lock.yaml's, unless KYVERNO_VERSION says another.
KYVERNO_VERSION = os.environ.get("KYVERNO_VERSION") or upstream.proven(
    Path(__file__).resolve().parents[1] / upstream.LOCK_NAME)["kyverno"]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")

# kubernetes-validate re-reads its JSON schema files on every call; they never change.
kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)

CORE_API_VERSIONS = {"v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1"}

VMBMC_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "bmc.kubevirt.io/v1beta1"},
        "kind": {"const": "VirtualMachineBMC"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["virtualMachineRef", "authSecretRef"],
            "additionalProperties": False,
            "properties": {
                "virtualMachineRef": {
                    "type": "object", "additionalProperties": False, "required": ["name"],
                    "properties": {"name": {"type": "string", "minLength": 1}},
                },
                "authSecretRef": {
                    "type": "object", "additionalProperties": False, "required": ["name"],
                    "properties": {"name": {"type": "string", "minLength": 1}},
                },
                "service": {"type": "object"},
                "ipmi": {"type": "object"},
                "redfish": {"type": "object"},
            },
        },
    },
}


_VMBMC_VALIDATOR = jsonschema.Draft7Validator(VMBMC_SCHEMA)


class SchemaProblem(AssertionError):
    pass


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise SchemaProblem(message)


def check_dns_subdomain(value: str, what: str) -> None:
    _check(isinstance(value, str) and 0 < len(value) <= 253 and bool(_DNS_SUBDOMAIN.match(value)),
           f"{what}: {value!r} is not a DNS-1123 subdomain")


def check_dns_label(value: str, what: str) -> None:
    _check(isinstance(value, str) and 0 < len(value) <= 63 and bool(_DNS_LABEL.match(value)),
           f"{what}: {value!r} is not a DNS-1123 label")


def check_qualified_key(key: str, what: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash:
        check_dns_subdomain(prefix, f"{what} prefix")
    _check(0 < len(name) <= 63 and bool(_QUALIFIED_NAME.match(name)), f"{what}: {key!r} is not a qualified name")


def check_metadata(obj: dict) -> None:
    meta = obj.get("metadata", {})
    name = meta.get("name", "")
    if obj["kind"] == "Namespace":
        check_dns_label(name, "Namespace name")
    elif obj["kind"] == "ClusterRole":
        _check(bool(name) and "/" not in name and name not in (".", ".."), f"ClusterRole name {name!r}")
    else:
        check_dns_subdomain(name, f"{obj['kind']} name")
    if "namespace" in meta:
        check_dns_label(meta["namespace"], "metadata.namespace")
    for key, value in (meta.get("labels") or {}).items():
        check_qualified_key(key, "label key")
        _check(isinstance(value, str) and len(value) <= 63 and bool(_LABEL_VALUE.match(value)),
               f"label value {value!r} of {key!r}")
    annotations = meta.get("annotations") or {}
    for key, value in annotations.items():
        check_qualified_key(key, "annotation key")
        _check(isinstance(value, str), f"annotation value of {key!r} is not a string")
    _check(sum(len(k) + len(v) for k, v in annotations.items()) <= 256 * 1024, "annotations exceed 256 KiB")


def validate_core(obj: dict) -> None:
    try:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as error:
        raise SchemaProblem(f"{obj['kind']} {obj['metadata'].get('name')}: {error.message}") from None
    check_metadata(obj)
    if obj["kind"] == "Ingress":
        spec = obj["spec"]
        if "ingressClassName" in spec:
            check_dns_subdomain(spec["ingressClassName"], "ingressClassName")
        for tls in spec.get("tls", []):
            check_dns_subdomain(tls["secretName"], "tls.secretName")
            for host in tls.get("hosts", []):
                check_dns_subdomain(host, "tls host")
        for rule in spec["rules"]:
            check_dns_subdomain(rule["host"], "rule host")
            for path in rule["http"]["paths"]:
                check_dns_label(path["backend"]["service"]["name"], "backend Service name (DNS-1035)")
                _check(path["backend"]["service"]["name"][0].isalpha(), "backend Service name must start with a letter")


def validate_vmbmc(obj: dict) -> None:
    try:
        _VMBMC_VALIDATOR.validate(obj)
    except jsonschema.ValidationError as error:
        raise SchemaProblem(f"VirtualMachineBMC: {error.message}") from None
    check_metadata(obj)


def kyverno_module_dir() -> Path | None:
    """The Kyverno Go module directory at the pinned tag, downloading it when go is present."""
    go = shutil.which("go")
    if not go:
        return None
    result = subprocess.run(
        [go, "mod", "download", "-json", f"{KYVERNO_MODULE}@{KYVERNO_VERSION}"],
        capture_output=True, text=True, timeout=600, cwd="/", env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    if result.returncode != 0:
        return None
    directory = json.loads(result.stdout).get("Dir")
    return Path(directory) if directory else None


def _close(schema: dict) -> dict:
    """Make objects with declared properties reject unknown fields (strict field validation)."""
    if isinstance(schema, dict):
        schema = {k: _close(v) for k, v in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        if schema.get("nullable"):
            kind = schema.get("type")
            if isinstance(kind, str):
                schema["type"] = [kind, "null"]
    elif isinstance(schema, list):
        return [_close(v) for v in schema]
    return schema


@functools.cache
def crd_validator(module_dir: Path, relpath: str, version: str) -> jsonschema.protocols.Validator:
    schema = crd_schema(module_dir, relpath, version)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


def crd_schema(module_dir: Path, relpath: str, version: str) -> dict:
    crd = yaml.safe_load((module_dir / relpath).read_text(encoding="utf-8"))
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema = _close(entry["schema"]["openAPIV3Schema"])
            # metadata is validated by the API server, not by the CRD schema.
            schema.setdefault("properties", {})["metadata"] = {"type": "object"}
            return schema
    raise LookupError(f"{relpath} has no version {version}")


def validate_cluster_policy(obj: dict, module_dir: Path) -> None:
    _check(obj["apiVersion"] == "kyverno.io/v1", f"ClusterPolicy apiVersion {obj['apiVersion']}")
    validator = crd_validator(module_dir, "config/crds/kyverno/kyverno.io_clusterpolicies.yaml", "v1")
    try:
        validator.validate(obj)
    except jsonschema.ValidationError as error:
        path = ".".join(str(p) for p in error.absolute_path)
        raise SchemaProblem(f"ClusterPolicy {obj['metadata']['name']}: {path}: {error.message}") from None
    check_metadata(obj)
    annotations = obj["metadata"]["annotations"]
    for key in ("policies.kyverno.io/title", "policies.kyverno.io/category", "policies.kyverno.io/severity",
                "policies.kyverno.io/subject", "policies.kyverno.io/description", "kyverno.io/kyverno-version"):
        _check(bool(annotations.get(key)), f"ClusterPolicy {obj['metadata']['name']}: annotation {key} missing")
    _check(annotations["policies.kyverno.io/severity"] in ("low", "medium", "high", "critical"), "severity")


def validate_object(obj: dict, module_dir: Path | None) -> None:
    """Validate one rendered object; ClusterPolicies need the Kyverno module (else SchemaProblem)."""
    if obj.get("apiVersion") in CORE_API_VERSIONS:
        validate_core(obj)
    elif obj.get("kind") == "VirtualMachineBMC":
        validate_vmbmc(obj)
    elif obj.get("kind") == "ClusterPolicy":
        _check(module_dir is not None, "no Kyverno CRD schema available")
        validate_cluster_policy(obj, module_dir)
    else:
        raise SchemaProblem(f"no schema for {obj.get('apiVersion')} {obj.get('kind')}")


def generate_patterns(obj: dict) -> list[dict]:
    """The objects a ClusterPolicy generates, as written in its rules (variables unresolved)."""
    out = []
    for rule in obj["spec"]["rules"]:
        gen = rule.get("generate")
        if gen and "data" in gen:
            data = dict(gen["data"])
            metadata = {"name": gen["name"], "namespace": gen["namespace"], **data.pop("metadata", {})}
            out.append({"apiVersion": gen["apiVersion"], "kind": gen["kind"], "metadata": metadata, **data})
    return out


def resolve(value, variables: dict[str, str]):
    """Substitute the {{ request.object.metadata.name/namespace/uid }} variables of a generate pattern."""
    if isinstance(value, dict):
        return {resolve(k, variables): resolve(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, variables) for v in value]
    if isinstance(value, str):
        value = re.sub(r"\{\{\s*(request\.object\.metadata\.(?:name|namespace|uid))\s*\}\}", lambda m: variables[m.group(1)], value)
        # Any other expression (the password) stands for a base64 value the engine computes.
        return "cGxhY2Vob2xkZXI=" if "{{" in value else value
    return value
