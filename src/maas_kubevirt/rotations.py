"""The cluster side of credential rotation: each VM's generation in ConfigMap maas-kubevirt-rotations.

The ConfigMap (``identity.ROTATIONS_CONFIGMAP`` in the system namespace; the bundle's
credential-rotations.yaml creates it without data) maps a serial ``<vm>.<namespace>`` to the VM's
credential generation, a decimal without leading zeros (``identity.parse_generation``); a VM
without a key is at generation 0. Kyverno derives the ``<vm>-bmc`` Secret's user and password
with it (the BMC policy), and re-derives within seconds of a change (the rotations policy).

Written on the official client's ``CoreV1Api`` (``read_namespaced_config_map``,
``replace_namespaced_config_map``), which Debian's python3-kubernetes 22.6 and the current
release both have. The reconciler's Role grants exactly ``get`` and ``update`` on this one
ConfigMap: no list, no watch, no Secret. Every failure is a :class:`RotationsError` of one line
that names the fix; no request header or body is ever in it.
"""

from __future__ import annotations

from typing import Any, Callable

from maas_kubevirt import identity, unreachable

DEFAULT_NAMESPACE = "maas-kubevirt"   # values.yaml's kubernetes.system_namespace
CONFLICT_ATTEMPTS = 5                 # tries of one bump when another writer wins the race (409)
APPLY_FIX = "apply the bundle: kubectl apply -k <render output>/kubernetes"
ROLE_NAME = "maas-kubevirt-reconciler"   # policies.RECONCILER_ACCOUNT (its Role and RoleBinding)


class RotationsError(Exception):
    """Reading or bumping the generations failed; the message is one line and names the fix."""

    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


class Generations(dict):
    """``{(vm, namespace): generation}``, with ``malformed``: one line per entry that is not a
    serial and a generation (skipped, not fatal: the rotations policy refuses them, so one can only
    be there from before the policy), and the ``resource_version`` it was read at."""

    def __init__(self, entries: dict[tuple[str, str], int], malformed: list[str], resource_version: str):
        super().__init__(entries)
        self.malformed = malformed
        self.resource_version = resource_version


def _where(namespace: str) -> str:
    return f"ConfigMap {namespace}/{identity.ROTATIONS_CONFIGMAP}"


def _error(error: BaseException, action: str, namespace: str, api: Any = None) -> RotationsError:
    """The one-line RotationsError for a failed request (status, reason and the fix; no body)."""
    status = getattr(error, "status", None)
    where = _where(namespace)
    if not isinstance(status, int) or status <= 0:
        return RotationsError(f"{action} {where}: {unreachable.api_server(_host(api), error)}")
    reason = " ".join(str(getattr(error, "reason", "") or "").split())[:80]
    if status == 404:
        return RotationsError(f"{action} {where}: 404 {reason}: it does not exist; {APPLY_FIX}", status)
    if status == 403:
        return RotationsError(
            f"{action} {where}: 403 {reason}: the kubeconfig's account may not; the reconciler's Role "
            f"{ROLE_NAME} in {namespace} grants get and update on this one ConfigMap: apply the bundle's "
            "reconciler-rbac.yaml (kubectl apply -k <render output>/kubernetes) and use a token of "
            f"ServiceAccount {ROLE_NAME}", status)
    if status == 401:
        return RotationsError(f"{action} {where}: 401 {reason}: the kubeconfig's token was refused "
                              "(expired?); make a new one (kubectl create token --duration)", status)
    if status in (400, 422):
        # Kyverno's refusal (the rotations policy's validate rule) arrives as the message.
        message = _status_message(error)
        return RotationsError(f"{action} {where}: {status} {reason}: refused: {message}", status)
    return RotationsError(f"{action} {where}: {status} {reason}", status)


def _host(api: Any) -> str:
    """The API server's URL a CoreV1Api sends to ("" when it cannot say: a test's stand-in)."""
    host = getattr(getattr(getattr(api, "api_client", None), "configuration", None), "host", "")
    return host if isinstance(host, str) else ""


def _status_message(error: BaseException) -> str:
    """The Status message of an ApiException's body (an admission refusal), one line.

    Kyverno puts about 220 characters (the webhook, the object, the policy) before the rule's own message.
    """
    import json

    body = getattr(error, "body", None)
    try:
        message = json.loads(body).get("message", "") if body else ""
    except (ValueError, TypeError, AttributeError):
        message = ""
    return " ".join(str(message).split())[:600] or "(no message)"


def _get(api: Any, namespace: str, action: str) -> Any:
    try:
        return api.read_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, namespace)
    except Exception as error:  # ApiException, urllib3 and socket errors: one line, no traceback
        raise _error(error, action, namespace, api) from None


def _data(configmap: Any) -> dict:
    data = configmap.data if hasattr(configmap, "data") else (configmap or {}).get("data")
    return dict(data or {})


def _resource_version(configmap: Any) -> str:
    metadata = configmap.metadata
    version = metadata.resource_version if hasattr(metadata, "resource_version") else metadata.get("resourceVersion")
    return version or ""


def parse(data: dict) -> tuple[dict[tuple[str, str], int], list[str]]:
    """The generations of a ConfigMap's data, and one line per malformed entry (skipped)."""
    entries: dict[tuple[str, str], int] = {}
    malformed: list[str] = []
    for key in sorted(data):
        try:
            vm, namespace = identity.parse_serial(key)
            entries[(vm, namespace)] = identity.parse_generation(data[key])
        except identity.IdentityError as error:
            malformed.append(f"{identity.ROTATIONS_CONFIGMAP}[{key!r}]: skipped: {error}")
    return entries, malformed


def read(api: Any, namespace: str = DEFAULT_NAMESPACE, *,
         report: Callable[[str], None] | None = None) -> Generations:
    """Every VM's generation other than 0, as ``{(vm, namespace): generation}`` (a :class:`Generations`).

    ``api`` is a ``CoreV1Api``; ``namespace`` the system namespace. Malformed entries are left
    out, listed in ``.malformed`` and passed to ``report`` one line each. Raises RotationsError.
    """
    configmap = _get(api, namespace, "read")
    entries, malformed = parse(_data(configmap))
    for line in malformed:
        if report is not None:
            report(line)
    return Generations(entries, malformed, _resource_version(configmap))


def bump(api: Any, vm: str, namespace: str, *, system_namespace: str = DEFAULT_NAMESPACE,
         attempts: int = CONFLICT_ATTEMPTS) -> int:
    """Increment one VM's generation (absent counts as 0) and return the new one.

    An optimistic-concurrency update: the replace names the resourceVersion it read, and on 409
    Conflict (another writer in between) it reads again, up to ``attempts`` times. A malformed
    current value is not guessed at: RotationsError. So is a refusal by the rotations policy.
    """
    try:
        key = identity.format_serial(vm, namespace)
    except identity.IdentityError as error:
        raise RotationsError(f"rotate: {error}") from None
    for attempt in range(attempts):
        configmap = _get(api, system_namespace, "read")
        data = _data(configmap)
        current = data.get(key, "0")
        try:
            generation = identity.parse_generation(current) + 1
        except identity.IdentityError as error:
            raise RotationsError(
                f"bump {_where(system_namespace)}: {key}: {error}; correct it by hand first "
                "(the value the BMC Secret was last derived with is its maas-kubevirt/credential-generation)"
            ) from None
        if generation > identity.GENERATION_MAX:
            raise RotationsError(f"bump {_where(system_namespace)}: {key} is at {generation - 1}, "
                                 f"the largest generation ({identity.GENERATION_MAX}); rotate the site seed instead")
        data[key] = str(generation)
        if hasattr(configmap, "data"):
            configmap.data = data        # a V1ConfigMap: its metadata keeps the resourceVersion read
        else:
            configmap = {**configmap, "data": data}
        try:
            api.replace_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system_namespace, configmap)
            return generation
        except Exception as error:
            if getattr(error, "status", None) == 409 and attempt + 1 < attempts:
                continue
            if getattr(error, "status", None) == 409:
                raise RotationsError(f"bump {_where(system_namespace)}: 409 Conflict {attempts} times: "
                                     "another writer keeps changing it; try again", 409) from None
            raise _error(error, "update", system_namespace, api) from None
    raise AssertionError("unreachable")  # pragma: no cover
