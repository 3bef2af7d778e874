"""Shared pieces of the reconciler tests: values for a MAAS double, running the CLI, secrets."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable

import yaml

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble  # noqa: E402

from maas_kubevirt import identity  # noqa: E402
from maas_kubevirt.reconcile import Audit, pool_description  # noqa: E402
from maas_kubevirt.values import load_values  # noqa: E402

DOMAIN = "bmc.example.com"
# The site seed of these tests (64 hex digits, as render generates, with no short pattern
# repeated: the seed rules refuse "5eed" * 16).
SEED = "7d3f0a9c5e21b84d6c0f93a7e512d8b4c96a0e37f1b5d2c84a9e60f7b3d1c258"


# A machine record as the plan reads it: every field it needs, each of the shape MAAS sends.
GOOD_RECORD = {"system_id": "abc123", "hostname": "h", "power_type": "redfish", "status_name": "New",
               "status": 0, "pool": {"name": "default", "id": 0}, "tag_names": ["a"]}


class RecordingAudit(Audit):
    """Audit records kept in memory as (action, system_id, outcome, reason), nothing printed."""

    def __init__(self) -> None:
        super().__init__("")
        self.records: list[tuple] = []

    def write(self, action, system_id, hostname, before, after, outcome, reason="", note="", **extra):
        self.records.append((action, system_id, outcome, reason))
        return {}


def derived(vm: str, namespace: str, seed: str = SEED) -> str:
    return identity.bmc_password(seed, identity.format_serial(vm, namespace))


def derived_user(vm: str, namespace: str, seed: str = SEED) -> str:
    return identity.bmc_user(seed, identity.format_serial(vm, namespace))


def owned(name: str) -> dict[str, str]:
    """A resource pool as MAAS lists it once the reconciler made it (its description says so)."""
    return {"name": name, "description": pool_description(name)}


def credentials(vm: str, namespace: str, seed: str = SEED) -> dict[str, str]:
    """add_vm's keywords for a VM whose derived password and user are already in place."""
    return {"password": derived(vm, namespace, seed), "power_user": derived_user(vm, namespace, seed)}


def write_seed(tmp_path: Path, seed: str = SEED) -> Path:
    path = tmp_path / "seed"
    path.write_text(seed + "\n")
    path.chmod(0o600)
    return path


def write_values(tmp_path: Path, double: MaasDouble, **maas: object) -> Path:
    key = tmp_path / "api-key"
    if not key.exists():
        key.write_text(double.api_key_text + "\n")
        key.chmod(0o600)
    seed_file = tmp_path / "seed"
    if not seed_file.exists():
        write_seed(tmp_path)
    settings = {"url": double.url, "api_key_file": str(key), "timeout": 1, "interval": 1,
                "audit_log": str(tmp_path / "audit.log")}
    settings.update(maas)
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"redfish": {"domain": DOMAIN}, "seed": {"file": str(seed_file)},
                                    "maas": settings}))
    return path


def values_for(tmp_path: Path, double: MaasDouble, **maas: object) -> dict:
    return load_values(write_values(tmp_path, double, **maas))


class Args:
    def __init__(self, **kw: object):
        self.once = False
        self.interval = None
        self.dry_run = False
        self.script = None
        self.__dict__.update(kw)


def audit_records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def secrets_of(double: MaasDouble, seeds: Iterable[str] = (SEED,)) -> list[str]:
    """Everything that must never be printed: the API key (each part), the seeds, every power
    password stored, and the password every matching machine derives from each seed."""
    derived_passwords = [
        identity.bmc_password(seed, identity.format_serial(*parsed))
        for seed in seeds for params in double.power.values()
        if (parsed := identity.parse_redfish_address(params.get("power_address"), DOMAIN))
    ]
    return [double.api_key_text, *double.api_key, *seeds, *double.passwords(), *derived_passwords]


def assert_no_secrets(double: MaasDouble, *texts: str, seeds: Iterable[str] = (SEED,)) -> None:
    secrets = secrets_of(double, seeds)
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"a secret leaked: {secret[:4]}..."


def matching_ids(double: MaasDouble, domain: str = DOMAIN) -> set[str]:
    return {
        sid for sid, machine in double.machines.items()
        if machine["power_type"] == "redfish"
        and identity.parse_redfish_address(double.power[sid].get("power_address"), domain) is not None
    }


def converged(double: MaasDouble, ids: Iterable[str], domain: str = DOMAIN, seed: str = SEED) -> bool:
    """Every given VM machine has its derived password, its name, its pool and has left New."""
    for sid in ids:
        machine = double.machines[sid]
        vm, ns = identity.parse_redfish_address(double.power[sid]["power_address"], domain)
        if double.power[sid]["power_pass"] != derived(vm, ns, seed):
            return False
        if double.power[sid]["power_user"] != derived_user(vm, ns, seed):
            return False
        names = (identity.maas_hostname(vm, ns), identity.fallback_hostname(vm, ns))
        if machine["hostname"] not in names or machine["pool"]["name"] != ns:
            return False
        if machine["status_name"] == "New":
            return False
    return True


def add_noise(double: MaasDouble) -> list[str]:
    """Machines that must never be touched: IPMI servers, lookalike domains, other power types."""
    return [
        double.add_machine("phys1", power_type="ipmi", power_address="10.0.0.1", power_pass="ipmi-S3CRET-a"),
        double.add_machine("phys2", power_type="ipmi", power_address="web1.vms.bmc.example.com",
                           power_pass="ipmi-S3CRET-b"),
        double.add_machine("evil1", power_type="redfish",
                           power_address="https://web1.vms.bmc.example.com.evil.io/redfish/v1/Systems/1",
                           power_pass="evil-S3CRET-c"),
        double.add_machine("evil2", power_type="redfish", power_address="https://web1.vms.xbmc.example.com",
                           power_pass="evil-S3CRET-d"),
        double.add_machine("short1", power_type="redfish", power_address="https://vms.bmc.example.com",
                           power_pass="evil-S3CRET-e"),
        double.add_machine("virsh1", power_type="virsh", power_address="qemu+ssh://web1.vms.bmc.example.com/system",
                           power_pass="virsh-S3CRET-f"),
    ]
