"""``maas-kubevirt upload-script``: create or update the commissioning script in MAAS.

The script is rendered here from the values (so a region host needs only the package and its
values), or read from ``--script``, which must be what ``render`` wrote from the same values.
MAAS applies the tags and timeout embedded in a script only when it creates the script
(src/maasserver/forms/script.py, ScriptForm._clean_script), so an update sends them as form
fields; then the script is read back: its tags hold bmc-config and enlisting, and its stored
text is the rendered one.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import error, note, warn
from maas_kubevirt.maas import MAASAuthError, MAASClient, MAASError, MAASForbidden, client_from_values
from maas_kubevirt.render import REQUIRED_TAGS, render_commissioning, rendering_problem
from maas_kubevirt.values import ValuesError

# src/maasserver/forms/script.py, ScriptForm._read_script: the delimiters of the metadata block.
_DELIMITER = re.compile(r"\s*#\s*-+\s*(Start|End) MAAS (?P<version>\d+\.\d+) script metadata\s+-+", re.I)
COMMENT = "uploaded by maas-kubevirt"


def script_metadata(text: str, source: str = "script") -> dict:
    """The metadata block of a MAAS script, read as MAAS reads it: line 1 a shebang, then the
    YAML between the 1.0 delimiters, each line after its first '#'. Raises ValuesError."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#!/"):
        raise ValuesError([f"{source}: expected a shebang (#!/...) on line 1, as MAAS requires"])
    block, found, ended = [], False, False
    for line in lines[1:]:
        mark = _DELIMITER.search(line)
        if mark is not None and mark["version"] == "1.0":
            if found:
                ended = True
                break
            found = True
        elif found and line.strip():
            if "#" not in line:
                raise ValuesError([f"{source}: every metadata line must start with '#'"])
            block.append(line.split("#", 1)[1])
    if not (found and ended):
        raise ValuesError([f"{source}: expected a MAAS script metadata block (the lines between "
                           "'# --- Start MAAS 1.0 script metadata ---' and '# --- End ...'), found none"])
    try:
        metadata = yaml.safe_load("\n".join(block))
    except yaml.YAMLError:
        raise ValuesError([f"{source}: the script metadata is not valid YAML"]) from None
    if not isinstance(metadata, dict):
        raise ValuesError([f"{source}: expected the script metadata to be a YAML mapping"])
    return metadata


def script_name(text: str, source: str = "script") -> str:
    """The ``name`` from a MAAS script's metadata block."""
    name = script_metadata(text, source).get("name")
    if not isinstance(name, str) or not name or shlex.quote(name) != name:
        raise ValuesError([f"{source}: expected a metadata name without spaces or quotes, "
                           f"found {name!r}"])
    return name


def script_tags(metadata: dict) -> list[str]:
    """The embedded tags as a list (MAAS takes a comma-separated string or a list of strings)."""
    tags = metadata.get("tags")
    if isinstance(tags, str):
        return [t.strip() for t in tags.split(",") if t.strip()]
    if isinstance(tags, list) and all(isinstance(t, str) for t in tags):
        return [t.strip() for t in tags if t.strip()]
    return []


def _upload(client: MAASClient, name: str, content: bytes, metadata: dict) -> bool:
    """Create or update; True when the script existed."""
    existing = client.script(name)
    if existing is None:
        try:
            client.create_script(name, content, COMMENT)
            return False
        except MAASError as failure:
            if failure.status != 400 or "already exist" not in failure.message.lower():
                raise
        existing = client.script(name) or {}  # created meanwhile: update it
    stored = existing.get("tags") if isinstance(existing.get("tags"), list) else []
    # The union keeps tags an operator added; the form replaces the list with what it is given.
    tags = list(dict.fromkeys([*stored, *script_tags(metadata)]))
    fields = {"tags": ",".join(tags)}
    if metadata.get("timeout") is not None:  # an empty timeout would clear MAAS's
        fields["timeout"] = str(metadata["timeout"])
    client.update_script(name, content, COMMENT, **fields)
    return True


def _read_back_problem(client: MAASClient, name: str, content: bytes) -> str | None:
    stored = client.script(name) or {}
    tags = stored.get("tags") if isinstance(stored.get("tags"), list) else []
    missing = [tag for tag in REQUIRED_TAGS if tag not in tags]
    if missing:
        return (f"MAAS stored the script {name} without the tag(s) {', '.join(missing)}: "
                f"add them (`maas $PROFILE node-script add-tag {name} tag=...`) or upload again")
    if client.script_text(name) != content:
        return f"MAAS stored a text of the script {name} other than the rendered one: upload again"
    return None


def _rendered_file(path: Path) -> str:
    """The text of a script file render wrote, or a one-line ValuesError."""
    try:
        content = path.read_bytes()
    except OSError as failure:
        raise ValuesError([f"--script: expected a readable rendered script, found {str(path)!r}: "
                           f"{failure.strerror or failure} (leave out --script to upload the render of "
                           "these values)"]) from None
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise ValuesError([f"--script: {path} is not UTF-8 text: not a rendered script"]) from None


def main(values: dict, args: Any) -> int:
    """``upload-script [--script FILE]``: POST scripts/ when new, PUT scripts/{name} otherwise."""
    path = Path(args.script) if getattr(args, "script", None) else None
    text = _rendered_file(path) if path else render_commissioning(values)
    content = text.encode("utf-8")
    source = str(path) if path else "the script rendered from these values"
    option = f"--script: {path}" if path else source
    metadata = script_metadata(text, source)
    name = script_name(text, source)
    missing = [tag for tag in REQUIRED_TAGS if tag not in script_tags(metadata)]
    if missing:
        raise ValuesError([f"{option} is not tagged {', '.join(missing)}: MAAS would not run "
                           "it at enlistment; render it again"])
    problem = path and rendering_problem(text, values, option)
    if problem:
        raise ValuesError([problem])
    audit = Audit(values["maas"].get("audit_log", ""))
    client = client_from_values(values, warn)
    try:
        try:
            existed = _upload(client, name, content, metadata)
            problem = _read_back_problem(client, name, content)
        except (MAASAuthError, MAASForbidden) as failure:  # scripts are written by administrators only
            error(str(failure))
            return EXIT_USAGE
        except MAASError as failure:
            audit.write("upload-script", None, None, None, name, "failed", str(failure))
            error(str(failure))
            return EXIT_FAILED
    finally:
        client.close()
    before = "present" if existed else "absent"
    if problem:
        audit.write("upload-script", None, None, before, name, "failed", problem)
        error(problem)
        return EXIT_FAILED
    audit.write("upload-script", None, None, before, name, "ok")
    note(f"{'updated' if existed else 'created'} the commissioning script {name} in MAAS "
         f"({len(content)} bytes, tagged {', '.join(REQUIRED_TAGS)}; read back and verified)")
    return EXIT_OK
