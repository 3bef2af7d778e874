"""values -> the Kubernetes side of the bundle: Kyverno policies, their RBAC, the seed Secret.

Rendered from the Jinja templates in templates/ (StrictUndefined). Every value from the values
file reaches the YAML through the ``q`` filter, a JSON string (JSON is YAML), so no value can
change the shape of a document; every rendered file is parsed back before it is returned.

The policies compute the identity rules of :mod:`maas_kubevirt.identity` in Kyverno's JMESPath
(``sha256``, ``truncate``, ``regex_replace_all``, ``join``); tests run them through the Kyverno
engine and compare with the identity module.

``python -m maas_kubevirt.policies DIR`` writes the reference render of the default values
(without the seed Secret) to DIR; the repository keeps it in kyverno/.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

import jinja2
import yaml

from maas_kubevirt.paths import data_dir, write_atomic
from maas_kubevirt.values import ValuesError

# Oldest Kyverno the policies are written for (rule-level generateExisting, failureAction,
# mutateExistingOnPolicyUpdate); tests run them with the CLI built by tools/build-kyverno.
KYVERNO_MIN_VERSION = "1.13.0"
KUBERNETES_MIN_VERSION = "1.28"
CATEGORY = "MAAS, KubeVirt"
EXAMPLE_NAMESPACE = "maas-vms"
KUBEMACPOOL_LABEL = "mutatevirtualmachines.kubemacpool.io"
ALLOWLIST_ANNOTATION = "nginx.ingress.kubernetes.io/whitelist-source-range"
CLUSTER_ISSUER_ANNOTATION = "cert-manager.io/cluster-issuer"

POLICY_NAMES = {
    "identity": "maas-kubevirt-vm-identity",
    "serial": "maas-kubevirt-require-own-serial",
    "audit": "maas-kubevirt-audit-vm",
    "bmc": "maas-kubevirt-vm-bmc",
}

SEED_SECRET_FILE = "seed-secret.yaml"
KUSTOMIZATION_FILE = "kustomization.yaml"
# Output files in apply order: namespace, RBAC and seed before the policies.
FILES = [
    "system-namespace.yaml",
    "rbac.yaml",
    SEED_SECRET_FILE,
    "policy-vm-identity.yaml",
    "policy-vm-serial.yaml",
    "policy-vm-audit.yaml",
    "policy-vm-bmc.yaml",
    "example-namespace.yaml",
]

_VM = "request.object.metadata.name"
_NS = "request.object.metadata.namespace"
# identity.smbios_uuid: sha256_hex("<namespace>/<vm>") cut into a version-8, variant-10 UUID.
UUID_JMESPATH = (
    "regex_replace_all('^(.{8})(.{4}).(.{3}).(.{3})(.{12}).*$', "
    f"sha256(join('/', [{_NS}, {_VM}])), "
    "'${1}-${2}-8${3}-8${4}-${5}')"
)
# identity.bmc_password: sha256_hex(seed + ":" + serial)[0:32], serial = "<vm>.<namespace>".
PASSWORD_JMESPATH = f"truncate(sha256(join('', [seed, ':', {_VM}, '.', {_NS}])), `32`)"
# kubevirtBMC names its Service <vm>-virtbmc: a DNS-1035 label, so <vm> is one of <= 55 chars.
BMC_NAME_REGEX = "^[a-z]([-a-z0-9]{0,53}[a-z0-9])?$"

# Characters PyYAML refuses in a stream, or reads as line breaks inside a quoted scalar.
_YAML_UNSAFE = re.compile("[^\x09\x0a\x0d\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")
_KYVERNO_SYNTAX = ("{{", "$(")


def _yaml_escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def quote(value: Any) -> str:
    """A YAML double-quoted scalar that reads back as exactly ``value`` (a string)."""
    if not isinstance(value, str):
        raise TypeError(f"only strings are quoted into templates, not {type(value).__name__}")
    return _YAML_UNSAFE.sub(_yaml_escape, json.dumps(value, ensure_ascii=False))


def _b64(value: str) -> str:
    return base64.b64encode(value.encode("utf-8")).decode("ascii")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir() / "templates")),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["q"] = quote
    env.filters["b64"] = _b64
    return env


def check_values(values: dict) -> None:
    """Object-level checks beyond values.py: raise ValuesError for values giving invalid objects."""
    problems: list[str] = []
    ingress = values["ingress"]
    if ingress["tls_secret"] and ingress["cluster_issuer"]:
        problems.append(
            "ingress.cluster_issuer: expected an empty string when ingress.tls_secret is set "
            f"(one source of TLS certificates), found {ingress['cluster_issuer']!r}"
        )
    managed = {ALLOWLIST_ANNOTATION, CLUSTER_ISSUER_ANNOTATION}
    for key, value in ingress["annotations"].items():
        if key in managed:
            problems.append(
                f"ingress.annotations[{key!r}]: expected an annotation maas-kubevirt does not set itself "
                "(use ingress.source_ranges / ingress.cluster_issuer), found it set"
            )
        for text, what in ((key, "key"), (value, "value")):
            if isinstance(text, str) and any(token in text for token in _KYVERNO_SYNTAX):
                problems.append(
                    f"ingress.annotations[{key!r}]: expected a {what} without '{{{{' or '$(' "
                    f"(Kyverno would read it as a variable), found {text!r}"
                )
    if values["kubernetes"]["opt_in_label"] == KUBEMACPOOL_LABEL:
        problems.append(
            f"kubernetes.opt_in_label: expected a label other than KubeMacPool's {KUBEMACPOOL_LABEL}, "
            f"found {KUBEMACPOOL_LABEL!r}"
        )
    if problems:
        raise ValuesError(problems)


def _context(values: dict, seed: str | None) -> dict[str, Any]:
    redfish, kubernetes, ingress = values["redfish"], values["kubernetes"], values["ingress"]
    annotations: dict[str, str] = {}
    if ingress["source_ranges"]:
        annotations[ALLOWLIST_ANNOTATION] = ",".join(ingress["source_ranges"])
    tls_secret_name = ingress["tls_secret"]
    if ingress["cluster_issuer"]:
        annotations[CLUSTER_ISSUER_ANNOTATION] = ingress["cluster_issuer"]
        tls_secret_name = "{{ " + _VM + " }}-bmc-tls"
    annotations.update(ingress["annotations"])
    files = [name for name in FILES if seed is not None or name != SEED_SECRET_FILE]
    return {
        **values,
        "seed": seed,
        "category": CATEGORY,
        "kyverno_version": KYVERNO_MIN_VERSION,
        "kubernetes_version": KUBERNETES_MIN_VERSION,
        "policy_names": POLICY_NAMES,
        "example_namespace": EXAMPLE_NAMESPACE,
        "uuid_jmespath": UUID_JMESPATH,
        "password_jmespath": "{{ base64_encode(" + PASSWORD_JMESPATH + ") }}",
        "bmc_name_check": "{{ regex_match('" + BMC_NAME_REGEX + "', " + _VM + ") }}",
        "host_length_check": "{{ length(join('.', [" + _VM + ", " + _NS + ", '" + redfish["domain"] + "'])) }}",
        "host_template": "{{ " + _VM + " }}.{{ " + _NS + " }}." + redfish["domain"],
        "seed_url_path": f"/api/v1/namespaces/{kubernetes['system_namespace']}/secrets/{kubernetes['seed_secret']}",
        "ingress_annotations": annotations,
        "tls_secret_name": tls_secret_name,
        "files": {"ordered": files, "seed": seed is not None},
    }


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses duplicate mapping keys (a template bug, not a value problem)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    keys = [loader.construct_object(key, deep=True) for key, _ in node.value]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {sorted(map(str, duplicates))}", node.start_mark)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def parse(text: str) -> list[Any]:
    """The documents of a rendered file (duplicate keys refused); None documents dropped."""
    return [doc for doc in yaml.load_all(text, Loader=_StrictLoader) if doc is not None]


def render_kubernetes(values: dict, seed: str | None) -> dict[str, str]:
    """Kubernetes manifests by file name, in apply order, kustomization.yaml last.

    ``seed=None`` renders the reference tree (kyverno/): everything but the seed Secret.
    Raises ValuesError for values that would give invalid objects.
    """
    check_values(values)
    if seed is not None and (not isinstance(seed, str) or not seed):
        raise ValuesError(["seed.file: expected a non-empty seed, found an empty one"])
    env = _environment()
    context = _context(values, seed)
    rendered: dict[str, str] = {}
    for name in context["files"]["ordered"] + [KUSTOMIZATION_FILE]:
        text = env.get_template(name + ".j2").render(context)
        try:
            documents = parse(text)
        except yaml.YAMLError as error:  # a template bug: values cannot cause it
            raise RuntimeError(f"rendered {name} is not valid YAML: {error.__class__.__name__}") from None
        if not documents or not all(isinstance(doc, dict) for doc in documents):
            raise RuntimeError(f"rendered {name} does not hold YAML mappings")
        rendered[name] = text
    return rendered


def objects(manifests: dict[str, str]) -> list[dict]:
    """Every Kubernetes object of a render (kustomization.yaml excluded)."""
    return [doc for name, text in manifests.items() if name != KUSTOMIZATION_FILE for doc in parse(text)]


def write_reference(directory: str | Path, values: dict | None = None) -> list[Path]:
    """Write the reference render (no seed Secret) of values (default: the defaults) to directory."""
    from maas_kubevirt.values import load_values

    manifests = render_kubernetes(values if values is not None else load_values(None), None)
    directory = Path(directory)
    for stale in directory.glob("*.yaml"):
        if stale.name not in manifests:
            stale.unlink()
    return [write_atomic(directory / name, text) for name, text in manifests.items()]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m maas_kubevirt.policies DIRECTORY", file=sys.stderr)
        return 2
    for path in write_reference(args[0]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
