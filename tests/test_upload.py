"""upload-script: only the script render wrote from the same values, tags and timeout sent on
update, read back and verified; the MAAS double parses uploads as MAAS's ScriptForm does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import RESERVED_ADMIN, MaasDouble  # noqa: E402
from reconcile_helpers import Args, audit_records, values_for  # noqa: E402

from maas_kubevirt import maas, upload  # noqa: E402
from maas_kubevirt.maas import MAASClient, MAASError, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.paths import SCRIPT_NAME, data_dir  # noqa: E402
from maas_kubevirt.render import render  # noqa: E402
from maas_kubevirt.values import ValuesError  # noqa: E402

# Wall-clock bounds: run after the parallel workers, with the machine to itself (tests/conftest.py).
pytestmark = pytest.mark.timing

OTHER = b"""#!/bin/sh
# --- Start MAAS 1.0 script metadata ---
# name: 31-kubevirt-bmc-config
# title: an older upload with other tags
# tags: [old-tag]
# timeout: 00:01:00
# script_type: commissioning
# --- End MAAS 1.0 script metadata ---
echo old
"""


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(maas, "RETRY", RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05,
                                                     max_retry_after=0.05))
    monkeypatch.delenv("MAAS_API_KEY", raising=False)


@pytest.fixture
def double():
    with MaasDouble() as running:
        yield running


def rendered(tmp_path: Path, double: MaasDouble, **maas_values) -> tuple[dict, Path]:
    values = values_for(tmp_path, double, **maas_values)
    render(values, tmp_path / "build")
    return values, tmp_path / "build" / "commissioning" / SCRIPT_NAME


def upload_cli(capsys, values, script):
    code = upload.main(values, Args(script=str(script)))
    out, err = capsys.readouterr()
    return code, out, err


def client_of(double):
    return MAASClient(double.url, Signer(*double.api_key), timeout=2,
                      retry=RetryPolicy(attempts=1))


def seed_of(tmp_path):
    """The seed render used: seed.file, which reconcile_helpers.write_values sets."""
    return (tmp_path / "seed").read_text().strip()


# --- create, update, read back ---------------------------------------------------------------


def test_create_then_update_reads_back(tmp_path, double, capsys):
    values, script = rendered(tmp_path, double)
    code, out, err = upload_cli(capsys, values, script)
    assert code == 0, err
    stored = double.scripts[SCRIPT_NAME]
    assert stored["script"] == script.read_bytes()
    assert {"bmc-config", "enlisting"} <= set(stored["tags"]) and stored["timeout"] == "0:05:00"
    assert "created the commissioning script" in err and "read back and verified" in err
    (record,) = audit_records(out)
    assert (record["action"], record["before"], record["outcome"]) == ("upload-script", "absent", "ok")
    code, out, err = upload_cli(capsys, values, script)
    assert code == 0 and "updated" in err
    assert [w[:2] for w in double.writes] == [("POST", "scripts/"), ("PUT", f"scripts/{SCRIPT_NAME}")]
    assert seed_of(tmp_path) not in out + err + (tmp_path / "audit.log").read_text()


def test_update_sends_tags_and_timeout_so_an_old_script_gets_enlisting_back(tmp_path, double, capsys):
    client_of(double).create_script(SCRIPT_NAME, OTHER, "someone else's")
    assert double.scripts[SCRIPT_NAME]["tags"] == ["old-tag", "node"]
    values, script = rendered(tmp_path, double)
    code, out, err = upload_cli(capsys, values, script)
    assert code == 0, err
    stored = double.scripts[SCRIPT_NAME]
    # The embedded tags alone would not have done it (PUT ignores them); the form fields did.
    method, target, fields = double.writes[-1]
    assert (method, target) == ("PUT", f"scripts/{SCRIPT_NAME}")
    assert set(fields["tags"].split(",")) == {"old-tag", "node", "bmc-config", "enlisting"}
    assert fields["timeout"] == "00:05:00"
    assert set(stored["tags"]) == {"old-tag", "node", "bmc-config", "enlisting"}
    assert stored["timeout"] == "0:05:00" and stored["script"] == script.read_bytes()
    (record,) = audit_records(out)
    assert record["before"] == "present" and record["outcome"] == "ok"


def test_read_back_catches_missing_tags(tmp_path, double, capsys, monkeypatch):
    values, script = rendered(tmp_path, double)
    real = MaasDouble._script_write

    def drop_tags(self, request, name):
        request.fields.pop("tags", None)  # a MAAS that kept the old tags
        return real(self, request, name)

    client_of(double).create_script(SCRIPT_NAME, OTHER)
    monkeypatch.setattr(MaasDouble, "_script_write", drop_tags)
    code, out, err = upload_cli(capsys, values, script)
    assert code == 1
    assert "without the tag(s) bmc-config, enlisting" in err
    (record,) = audit_records(out)
    assert record["outcome"] == "failed" and "bmc-config" in record["reason"]


def test_read_back_catches_other_text(tmp_path, double, capsys, monkeypatch):
    values, script = rendered(tmp_path, double)
    real = MaasDouble._script_write

    def mangle(self, request, name):
        status, body, headers = real(self, request, name)
        self.scripts[SCRIPT_NAME]["script"] += b"# changed on the way\n"
        return status, body, headers

    monkeypatch.setattr(MaasDouble, "_script_write", mangle)
    code, out, err = upload_cli(capsys, values, script)
    assert code == 1 and "other than the rendered one" in err


def test_create_race_falls_back_to_update(tmp_path, double, capsys, monkeypatch):
    values, script = rendered(tmp_path, double)
    client_of(double).create_script(SCRIPT_NAME, OTHER)
    calls = []
    real = maas.MAASClient.script

    def first_none(self, name):
        calls.append(name)
        return None if len(calls) == 1 else real(self, name)

    monkeypatch.setattr(maas.MAASClient, "script", first_none)
    code, out, err = upload_cli(capsys, values, script)
    assert code == 0, err
    assert double.scripts[SCRIPT_NAME]["script"] == script.read_bytes()
    assert {"bmc-config", "enlisting", "old-tag"} <= set(double.scripts[SCRIPT_NAME]["tags"])


def test_upload_failure_exit_1(tmp_path, double, capsys):
    values, script = rendered(tmp_path, double)
    double.inject("500", method="POST", path="scripts/")
    code, out, err = upload_cli(capsys, values, script)
    assert code == 1 and "POST scripts/: 500: Internal Server Error" in err


def test_not_admin_gets_maas_message_and_exit_2(tmp_path, double, capsys):
    values, script = rendered(tmp_path, double)
    double.admin = False
    code, out, err = upload_cli(capsys, values, script)
    assert code == 2
    assert f"POST scripts/: 403: {RESERVED_ADMIN} (the API key's user lacks permission" in err


# --- what upload-script refuses before it asks MAAS anything ---------------------------------


def refused(tmp_path, double, values, text: bytes | str, problem: str):
    path = tmp_path / "candidate"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(ValuesError) as caught:
        upload.main(values, Args(script=str(path)))
    assert problem in str(caught.value)
    assert double.request_count == 0
    return str(caught.value)


def test_refuses_the_unrendered_template(tmp_path, double):
    values, _ = rendered(tmp_path, double)
    template = (data_dir() / "commissioning" / SCRIPT_NAME).read_text()
    refused(tmp_path, double, values, template, "the unrendered commissioning script")


def test_refuses_a_script_rendered_from_other_values(tmp_path, double):
    values, script = rendered(tmp_path, double)
    other = dict(values, redfish={**values["redfish"], "domain": "bmc.other.example"})
    message = refused(tmp_path, double, other, script.read_bytes(), "rendered from other values (domain differ")
    assert seed_of(tmp_path) not in message


def test_refuses_an_edited_script(tmp_path, double):
    values, script = rendered(tmp_path, double)
    text = script.read_text().replace("NODE_ID = \"1\"", "NODE_ID = \"2\"")
    assert text != script.read_text()
    refused(tmp_path, double, values, text, "its code differs from what maas-kubevirt renders")


@pytest.mark.parametrize("text, problem", [
    ("echo hi\n", "expected a shebang"),
    ("#!/bin/sh\necho hi\n", "metadata block"),
    ("#!/bin/sh\n# --- Start MAAS 1.0 script metadata ---\n# name: x\n", "metadata block"),
    ("#!/bin/sh\n# --- Start MAAS 1.0 script metadata ---\n# title: x\n# --- End MAAS 1.0 script metadata ---\n",
     "metadata name"),
    ("#!/bin/sh\n# --- Start MAAS 1.0 script metadata ---\n# name: 'a b'\n# --- End MAAS 1.0 script metadata ---\n",
     "metadata name"),
    ("#!/bin/sh\n# --- Start MAAS 1.0 script metadata ---\nname: x\n# --- End MAAS 1.0 script metadata ---\n",
     "must start with '#'"),
])
def test_script_metadata_errors(text, problem):
    with pytest.raises(ValuesError, match=problem):
        upload.script_name(text)


def test_refuses_a_script_without_the_enlisting_tags(tmp_path, double):
    values, _ = rendered(tmp_path, double)
    refused(tmp_path, double, values, OTHER, "is not tagged bmc-config, enlisting")


def test_missing_file_is_usage_error(tmp_path, double):
    with pytest.raises(ValuesError, match="--script: expected a readable rendered script"):
        upload.main(values_for(tmp_path, double), Args(script=str(tmp_path / "nope")))


def test_shipped_script_metadata_as_maas_reads_it():
    text = (data_dir() / "commissioning" / SCRIPT_NAME).read_text()
    metadata = upload.script_metadata(text)
    assert upload.script_name(text) == SCRIPT_NAME
    assert set(upload.REQUIRED_TAGS) <= set(upload.script_tags(metadata))
    assert metadata["timeout"] == "00:05:00"  # a string: YAML 1.1 sexagesimal needs a leading 1-9


def test_without_script_uploads_what_render_writes(tmp_path, double, capsys):
    """No --script: the region host renders the script from its own values, byte for byte the
    file render writes on the workstation from the same values (no file to copy, none stale)."""
    values, script = rendered(tmp_path, double)
    code = upload.main(values, Args(script=None))
    err = capsys.readouterr().err
    assert code == 0, err
    assert double.scripts[SCRIPT_NAME]["script"] == script.read_bytes()
    assert {"bmc-config", "enlisting"} <= set(double.scripts[SCRIPT_NAME]["tags"])


def test_without_script_follows_the_values(tmp_path, double, capsys):
    """Other values, another script: the render of the values given, not any file's."""
    values, script = rendered(tmp_path, double)
    values["redfish"]["domain"] = "bmc.other.example"
    assert upload.main(values, Args(script=None)) == 0, capsys.readouterr().err
    held = double.scripts[SCRIPT_NAME]["script"]
    assert held != script.read_bytes() and b"bmc.other.example" in held


# --- the double parses uploads as MAAS does (src/maasserver/forms/script.py) -----------------


def test_double_requires_a_shebang(double):
    with pytest.raises(MAASError) as caught:
        client_of(double).create_script("x", b"echo hi\n")
    assert str(caught.value) == "POST scripts/: 400: script: Must start with shebang."


def test_double_refuses_form_fields_that_override_embedded_metadata(double):
    with pytest.raises(MAASError) as caught:
        client_of(double).create_script("other-name", OTHER)
    assert str(caught.value) == "POST scripts/: 400: name: May not override values defined in embedded YAML."
    client = client_of(double)
    client.create_script(SCRIPT_NAME, OTHER)
    with pytest.raises(MAASError) as caught:
        client.update_script(SCRIPT_NAME, OTHER, title="another title")
    assert "title: May not override values defined in embedded YAML." in str(caught.value)


def test_double_put_ignores_embedded_tags_and_timeout(double):
    client = client_of(double)
    client.create_script(SCRIPT_NAME, OTHER)
    newer = OTHER.replace(b"[old-tag]", b"[bmc-config, enlisting]").replace(b"00:01:00", b"00:05:00")
    client.update_script(SCRIPT_NAME, newer)
    stored = double.scripts[SCRIPT_NAME]
    assert stored["tags"] == ["old-tag", "node"] and stored["timeout"] == "0:01:00"
    assert client.script_text(SCRIPT_NAME) == newer
    # Embedded tags and timeout are applied on create, and form fields win over them there too.
    client.create_script("fresh", newer.replace(SCRIPT_NAME.encode(), b"fresh"))
    assert double.scripts["fresh"]["tags"] == ["bmc-config", "enlisting", "node"]
    assert double.scripts["fresh"]["timeout"] == "0:05:00"


def test_double_script_writes_are_admin_only(double):
    double.admin = False
    with pytest.raises(maas.MAASForbidden) as caught:
        client_of(double).create_script(SCRIPT_NAME, OTHER)
    assert caught.value.status == 403 and RESERVED_ADMIN in str(caught.value)
    assert client_of(double).script(SCRIPT_NAME) is None  # reading is not admin-only
