"""The one place for every name maas-kubevirt derives from a VM (docs/explanation/design.md, "Identity").

The commissioning script carries a copy of the serial and host rules and of the placeholder
password; a test proves the copies equal. The Kyverno templates compute the UUID and password
with JMESPath (sha256, join, truncate, regex_replace_all), so both rules are spelled in those terms.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import unicodedata
import urllib.parse

LABEL_MAX = 63
SUBDOMAIN_MAX = 253
HOST_MAX = 253
HASH_SUFFIX = 8
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DOMAIN_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


class IdentityError(ValueError):
    """A name that breaks one of the identity rules; the message names the rule."""


def _sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_label(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise IdentityError(f"{what} {value!r}: must be a non-empty string")
    if len(value) > LABEL_MAX:
        raise IdentityError(f"{what} {value!r}: longer than {LABEL_MAX} characters (DNS-1123 label)")
    if not _LABEL.match(value):
        raise IdentityError(
            f"{what} {value!r}: not a DNS-1123 label "
            "(lower-case letters, digits and '-', starting and ending with a letter or digit)"
        )
    return value


def is_label(value: object) -> bool:
    """Whether value is a DNS-1123 label, as a namespace or a pool's name must be."""
    return isinstance(value, str) and 0 < len(value) <= LABEL_MAX and bool(_LABEL.match(value))


def validate_namespace(namespace: object) -> str:
    """Return the namespace if it is a DNS-1123 label, as Kubernetes requires."""
    return _check_label(namespace, "namespace")


def validate_vm_name(vm: object) -> str:
    """Return the VM name if it is a DNS-1123 subdomain, as Kubernetes requires."""
    if not isinstance(vm, str) or not vm:
        raise IdentityError(f"VM name {vm!r}: must be a non-empty string")
    if len(vm) > SUBDOMAIN_MAX:
        raise IdentityError(f"VM name {vm!r}: longer than {SUBDOMAIN_MAX} characters (DNS-1123 subdomain)")
    for label in vm.split("."):
        if not label or len(label) > LABEL_MAX or not _LABEL.match(label):
            raise IdentityError(
                f"VM name {vm!r}: not a DNS-1123 subdomain (dot-separated labels of 1-63 "
                "lower-case letters, digits and '-', each starting and ending with a letter or digit)"
            )
    return vm


def validate_domain(domain: object) -> str:
    """Return the Redfish domain, lower-cased, if it is a DNS name."""
    if not isinstance(domain, str) or not domain:
        raise IdentityError(f"domain {domain!r}: must be a non-empty DNS name")
    name = domain.lower().rstrip(".")
    if len(name) > HOST_MAX - 4:
        raise IdentityError(f"domain {domain!r}: too long to leave room for <vm>.<namespace>")
    labels = name.split(".")
    if len(labels) < 2 or any(len(l) > LABEL_MAX or not _DOMAIN_LABEL.match(l) for l in labels):
        raise IdentityError(
            f"domain {domain!r}: not a DNS name of two or more labels "
            "(letters, digits and '-', 1-63 characters each)"
        )
    return name


def format_serial(vm: str, namespace: str) -> str:
    """The SMBIOS serial KubeVirt is given: ``<vm>.<namespace>``."""
    return f"{validate_vm_name(vm)}.{validate_namespace(namespace)}"


def parse_serial(serial: object) -> tuple[str, str]:
    """Split a serial on its last dot into (vm, namespace), validating both parts."""
    if not isinstance(serial, str):
        raise IdentityError(f"serial {serial!r}: must be a string")
    vm, dot, namespace = serial.rpartition(".")
    if not dot:
        raise IdentityError(f"serial {serial!r}: not of the form <vm>.<namespace> (no dot)")
    return validate_vm_name(vm), validate_namespace(namespace)


def redfish_host(vm: str, namespace: str, domain: str) -> str:
    """The BMC host name ``<vm>.<namespace>.<domain>``; reported when it cannot be a DNS name."""
    host = f"{format_serial(vm, namespace)}.{validate_domain(domain)}"
    if len(host) > HOST_MAX:
        raise IdentityError(
            f"Redfish host for VM {vm!r} in {namespace!r}: {len(host)} characters, "
            f"longer than the {HOST_MAX} a DNS name allows; shorten the VM name or the domain"
        )
    return host


def claimed_host(vm: str, namespace: str, domain: str) -> str:
    """``<vm>.<namespace>.<domain>`` as a suspect names it, even past the 253 characters of a DNS name."""
    return f"{vm}.{namespace}.{domain.lower().rstrip('.')}"


def parse_redfish_address(address: object, domain: str) -> tuple[str, str] | None:
    """(vm, namespace) when a MAAS power_address is exactly the bare host ``<vm>.<namespace>.<domain>``.

    ASCII only, compared case-insensitively, with no scheme, userinfo, port, path, query,
    fragment, trailing dot or space: the one form MAAS stores for Redfish (its driver adds
    ``https://``), and so the only address trusted with a password (docs/explanation/security.md).
    """
    if not isinstance(address, str) or not address.isascii() or len(address) > HOST_MAX:
        return None
    suffix = "." + validate_domain(domain)
    host = address.lower()
    if not host.endswith(suffix):
        return None
    try:
        vm, namespace = parse_serial(host[: -len(suffix)])
    except IdentityError:
        return None
    return vm, namespace


# After folding, anything that cannot be part of a host name ends one: a scheme, userinfo, port,
# path, a comma or semicolon list, spaces, control and zero-width characters. An underscore
# stays: a name holding one imitates no identity.
_HOST_BOUNDARY = re.compile(r"[^a-z0-9._-]+")
# Letters of other scripts drawn like Latin ones, and the dots of other scripts that IDNA reads
# as "." (UTS 46): what NFKC leaves as it is but a reader, or a resolver, takes for the host.
_LOOKALIKES = str.maketrans({
    "\u0430": "a", "\u0441": "c", "\u0501": "d", "\u0435": "e", "\u0261": "g", "\u04bb": "h",
    "\u0456": "i", "\u0458": "j", "\u043a": "k", "\u04cf": "l", "\u043e": "o", "\u0440": "p",
    "\u051b": "q", "\u0455": "s", "\u0442": "t", "\u0443": "y", "\u0445": "x", "\u03bf": "o",
    "\u03b1": "a", "\u03bd": "v", "\u03c1": "p", "\u03b9": "i", "\u0131": "i",
    "\u3002": ".", "\uff0e": ".", "\uff61": ".",
})


def _fold(text: str) -> str:
    """An address as a reader would take it: NFKC, case folded, look-alike letters and dots made
    plain, and punycode labels (xn--) decoded."""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_LOOKALIKES)
    labels = []
    for label in text.split("."):
        if label.startswith("xn--"):
            try:
                label = unicodedata.normalize("NFKC", label[4:].encode("ascii").decode("punycode"))
                label = label.casefold().translate(_LOOKALIKES)
            except (UnicodeError, ValueError):
                pass
        labels.append(label)
    return ".".join(labels)


def suspect_identity(address: object, domain: str) -> tuple[str, str] | None:
    """(vm, namespace) that an address which is not canonical still names, else None.

    Undoes what an attacker would use to make a look-alike (Unicode compatibility forms such
    as KELVIN SIGN, letters and dots of other scripts, punycode, case, percent-encoding, a
    scheme, userinfo, port, path, a list, trailing dots, spaces, invisible characters) and
    finds ``<vm>.<namespace>.<domain>`` in what is left.
    """
    if not isinstance(address, str) or parse_redfish_address(address, domain) is not None:
        return None
    text = _fold(urllib.parse.unquote(address))
    suffix = "." + validate_domain(domain)
    for part in _HOST_BOUNDARY.split(text):
        part = part.strip(".")
        at = part.rfind(suffix)
        while at > 0:
            rest = part[at + len(suffix):]
            if rest == "" or rest.startswith("."):
                try:
                    return parse_serial(part[:at])
                except IdentityError:
                    pass
            at = part.rfind(suffix, 0, at)
    return None


def smbios_uuid(vm: str, namespace: str) -> str:
    """A name-based UUID (RFC 9562 version 8) from ``<namespace>/<vm>``.

    Kyverno: regex_replace_all('^(.{8})(.{4}).(.{3}).(.{3})(.{12}).*$',
    sha256(join('/', [ns, vm])), '${1}-${2}-8${3}-8${4}-${5}').
    """
    h = _sha256_hex(f"{validate_namespace(namespace)}/{validate_vm_name(vm)}")
    return f"{h[0:8]}-{h[8:12]}-8{h[13:16]}-8{h[17:20]}-{h[20:32]}"


def maas_hostname(vm: str, namespace: str) -> str:
    """``<vm>-<namespace>`` (dots become '-') when it fits one DNS label, else the hashed form."""
    plain = f"{validate_vm_name(vm).replace('.', '-')}-{validate_namespace(namespace)}"
    if len(plain) <= LABEL_MAX:
        return plain
    return fallback_hostname(vm, namespace)


def fallback_hostname(vm: str, namespace: str) -> str:
    """The deterministic hashed hostname: a cut ``<vm>-<namespace>`` plus a hash of the serial."""
    serial = format_serial(vm, namespace)
    base = f"{vm.replace('.', '-')}-{namespace}"[: LABEL_MAX - HASH_SUFFIX - 1].rstrip("-")
    return f"{base}-{_sha256_hex(serial)[:HASH_SUFFIX]}"


def pool_name(namespace: str) -> str:
    """The MAAS resource pool for a namespace: the namespace itself."""
    return validate_namespace(namespace)


# A pool VM's name: <pool>-<suffix>, the suffix drawn from the alphabet Kubernetes' generateName
# uses (k8s.io/apimachinery/pkg/util/rand/rand.go: no vowels, so no word is spelt by chance).
POOL_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
POOL_SUFFIX_LENGTH = 5


def pool_vm_name(pool: str, suffix: str) -> str:
    """``<pool>-<suffix>``, the name of a VM a pool makes."""
    if len(suffix) != POOL_SUFFIX_LENGTH or not set(suffix) <= set(POOL_SUFFIX_ALPHABET):
        raise IdentityError(f"pool VM suffix {suffix!r}: expected {POOL_SUFFIX_LENGTH} of {POOL_SUFFIX_ALPHABET!r}")
    return validate_vm_name(f"{_check_label(pool, 'pool')}-{suffix}")


def pool_vm_name_pattern(pool: str) -> str:
    """The names a pool's VMs may have, as a regular expression RE2 (Kyverno) and Python read alike:
    ``<pool>-<rest>``, one DNS label (pool_vm_name's, or one given to ``compose --name``)."""
    room = LABEL_MAX - len(pool) - 1
    return f"^{re.escape(pool)}-[a-z0-9]([-a-z0-9]{{0,{room - 2}}}[a-z0-9])?$"


def is_pool_vm_name(pool: str, vm: object) -> bool:
    """Whether vm is a name pool_vm_name_pattern allows for this pool."""
    return isinstance(vm, str) and is_label(pool) and re.fullmatch(pool_vm_name_pattern(pool)[1:-1], vm) is not None


def pool_vm_proof(seed: str, namespace: str, vm: str, pool: str) -> str:
    """The annotation that proves the reconciler made this pool VM: 32 hex digits of
    HMAC-SHA256(seed, 'pool-vm:<namespace>/<vm>:<pool>'); a tenant who copies the label cannot forge it."""
    if not isinstance(seed, str) or not seed:
        raise IdentityError("seed: must be a non-empty string")
    message = f"pool-vm:{validate_namespace(namespace)}/{validate_vm_name(vm)}:{_check_label(pool, 'pool')}"
    return hmac.new(seed.encode("utf-8"), message.encode("utf-8"), hashlib.sha256).hexdigest()[:32]


# What the commissioning script writes as power_pass: MAAS requires one for a redfish machine
# (src/provisioningserver/drivers/power/redfish.py marks it required), and the script carries
# no secret. Not a secret: the reconciler replaces it with bmc_password(seed, serial).
PLACEHOLDER_PASSWORD = "maas-kubevirt-placeholder"


# A VM's credential generation: 0 until its password is rotated (a leak suspected), then 1, 2,
# ... Kept in the ConfigMap ROTATIONS_CONFIGMAP of the system namespace, one key per serial.
ROTATIONS_CONFIGMAP = "maas-kubevirt-rotations"
GENERATION_MAX = 999_999_999
# The highest generation the reconciler's ServiceAccount (the lease kubeconfig) may write: each of
# its updates raises one VM's generation by one at most, and never above this, so a stolen lease
# kubeconfig cannot push a VM to GENERATION_MAX, past which nobody could rotate it again; above
# it, only an administrator's own credentials rotate (the rotations policy enforces both).
RECONCILER_GENERATION_MAX = 999_999
_GENERATION = re.compile(r"(0|[1-9][0-9]{0,8})\Z")


def parse_generation(text: object) -> int:
    """A generation as the ConfigMap stores it: a decimal without leading zeros, 0 to GENERATION_MAX."""
    if not isinstance(text, str) or not _GENERATION.match(text):
        raise IdentityError(
            f"credential generation {text!r}: not a whole number from 0 to {GENERATION_MAX} "
            "written without leading zeros"
        )
    return int(text)


def _generation_suffix(generation: int) -> str:
    """'' for generation 0, so its derivation is the one sites had before rotation; else ':<g>'."""
    if isinstance(generation, bool) or not isinstance(generation, int) or not 0 <= generation <= GENERATION_MAX:
        raise IdentityError(f"credential generation {generation!r}: not a whole number from 0 to {GENERATION_MAX}")
    return f":{generation}" if generation else ""


def bmc_password(seed: str, serial: str, generation: int = 0) -> str:
    """The VM's BMC password: 32 hex digits of sha256(seed + ':' + serial [+ ':' + generation]).

    Generation 0 adds nothing. Kyverno: truncate(sha256(regex_replace_all(':0$',
    join('', [seed, ':', serial, ':', generation]), '')), `32`).
    """
    if not isinstance(seed, str) or not seed:
        raise IdentityError("seed: must be a non-empty string")
    parse_serial(serial)
    return _sha256_hex(f"{seed}:{serial}{_generation_suffix(generation)}")[:32]


# Redfish is a chassis power type in MAAS: machines with the same power_address and power_user
# share one BMC row and its stored password (get_or_create_bmc in src/maasserver/models/bmc.py,
# Node.set_power_config in src/maasserver/models/node.py). The address is public, so the user
# is what keeps a VM's row its own: random at enlistment, derived from the seed afterwards.
BMC_USER_PREFIX = "maas-kubevirt-"
# What the commissioning script writes as power_user: this and 128 random bits (32 hex digits),
# drawn on the machine at each enlistment. A copy lives in the script; a test proves it equal.
ENLIST_USER_PREFIX = "maas-enlist-"


# What the reconciler writes as the user when it takes a derived credential back: this and 32 hex
# digits keyed by the seed and the machine, so the row is that machine's alone and nobody's to
# name (a fixed user would let any machine join it), and a second reset writes the same.
RESET_USER_PREFIX = "maas-kubevirt-reset-"


def reset_user(seed: str, system_id: str) -> str:
    """The power_user of a machine whose derived credentials were taken back: no VM's BMC user."""
    if not isinstance(seed, str) or not seed:
        raise IdentityError("seed: must be a non-empty string")
    return RESET_USER_PREFIX + _sha256_hex(f"{seed}:reset:{system_id}")[:32]


def bmc_user(seed: str, serial: str, generation: int = 0) -> str:
    """The VM's BMC user: BMC_USER_PREFIX and 32 hex digits of sha256(seed + ':user:' + serial
    [+ ':' + generation]).

    A serial holds no ':', so this input never equals a password's. Kyverno: join('',
    ['maas-kubevirt-', truncate(sha256(regex_replace_all(':0$', join('', [seed, ':user:',
    serial, ':', generation]), '')), `32`)]).
    """
    if not isinstance(seed, str) or not seed:
        raise IdentityError("seed: must be a non-empty string")
    parse_serial(serial)
    return BMC_USER_PREFIX + _sha256_hex(f"{seed}:user:{serial}{_generation_suffix(generation)}")[:32]


# What bmc_user and bmc_password produce, whatever the seed: a value of neither shape is no VM's
# derived credential, so nothing else is hashed to find whose it is.
_DERIVED_SHAPE = re.compile(rf"({re.escape(BMC_USER_PREFIX)})?[0-9a-f]{{32}}\Z")


def derived_shape(value: object) -> bool:
    """Whether a value has the shape of a derived BMC user or password (not whether it is one)."""
    return isinstance(value, str) and _DERIVED_SHAPE.match(value) is not None
