"""``maas-kubevirt upload-script``: create or update the commissioning script in MAAS."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PROG
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import error, note, warn
from maas_kubevirt.maas import MAASAuthError, MAASError, client_from_values
from maas_kubevirt.values import ValuesError

START_MARK = "# --- Start MAAS 1.0 script metadata ---"
END_MARK = "# --- End MAAS 1.0 script metadata ---"


def script_name(text: str, source: str = "script") -> str:
    """The ``name`` from a MAAS script's metadata block (the YAML between the markers)."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == START_MARK)
        end = next(i for i, line in enumerate(lines) if i > start and line.strip() == END_MARK)
    except StopIteration:
        raise ValuesError([f"{source}: expected a MAAS script metadata block "
                           f"({START_MARK!r} ... {END_MARK!r}), found none"]) from None
    block = []
    for line in lines[start + 1 : end]:
        stripped = line.lstrip()
        if not stripped.startswith("#"):
            raise ValuesError([f"{source}: every metadata line must start with '#'"])
        block.append(stripped[2:] if stripped.startswith("# ") else stripped[1:])
    try:
        metadata = yaml.safe_load("\n".join(block))
    except yaml.YAMLError:
        raise ValuesError([f"{source}: the script metadata is not valid YAML"]) from None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name or shlex.quote(name) != name:
        raise ValuesError([f"{source}: expected a metadata name without spaces or quotes, "
                           f"found {name!r}"])
    return name


def main(values: dict, args: Any) -> int:
    """``upload-script [--script FILE]``: POST scripts/ when new, PUT scripts/{name} otherwise."""
    path = Path(getattr(args, "script"))
    try:
        content = path.read_bytes()
    except OSError as failure:
        raise ValuesError([f"--script: expected a readable rendered script (run `{PROG} render` "
                           f"first), found {str(path)!r}: {failure.strerror or failure}"]) from None
    name = script_name(content.decode("utf-8", "replace"), str(path))
    audit = Audit(values["maas"].get("audit_log", ""))
    client = client_from_values(values, warn)
    comment = "uploaded by maas-kubevirt"
    try:
        try:
            exists = client.script_exists(name)
            if exists:
                client.update_script(name, content, comment)
            else:
                try:
                    client.create_script(name, content, comment)
                except MAASError as failure:
                    if failure.status != 400 or "already exist" not in failure.message.lower():
                        raise
                    exists = True
                    client.update_script(name, content, comment)
        except MAASAuthError as failure:
            error(str(failure))
            return EXIT_USAGE
        except MAASError as failure:
            audit.write("upload-script", None, None, None, name, "failed", str(failure))
            error(str(failure))
            return EXIT_FAILED
    finally:
        client.close()
    audit.write("upload-script", None, None, "present" if exists else "absent", name, "ok")
    note(f"{'updated' if exists else 'created'} the commissioning script {name} in MAAS "
         f"({len(content)} bytes)")
    return EXIT_OK
