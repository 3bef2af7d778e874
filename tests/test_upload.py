"""upload-script: create or update the commissioning script in MAAS, as MAAS parses it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import Args, audit_records, values_for  # noqa: E402

from maas_kubevirt import maas, upload  # noqa: E402
from maas_kubevirt.maas import RetryPolicy  # noqa: E402
from maas_kubevirt.values import ValuesError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(maas, "RETRY", RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05,
                                                     max_retry_after=0.05))
    monkeypatch.delenv("MAAS_API_KEY", raising=False)


@pytest.fixture
def double():
    with MaasDouble() as running:
        yield running


def run(capsys, function, values, args):
    code = function(values, args)
    out, err = capsys.readouterr()
    return code, out, err


# --- upload-script ---------------------------------------------------------------------------

SCRIPT = """#!/usr/bin/env python3
# --- Start MAAS 1.0 script metadata ---
# name: 31-kubevirt-bmc-config
# title: KubeVirt BMC
# tags: [bmc-config, enlisting]
# script_type: commissioning
# --- End MAAS 1.0 script metadata ---
SETTINGS = {"seed": "SEED-S3CRET-0123456789"}  # replaced by maas-kubevirt render
"""


def test_upload_script_creates_then_updates(tmp_path, double, capsys):
    script = tmp_path / "31-kubevirt-bmc-config"
    script.write_text(SCRIPT)
    values = values_for(tmp_path, double)
    code, out, err = run(capsys, upload.main, values, Args(script=str(script)))
    assert code == 0, err
    assert double.scripts["31-kubevirt-bmc-config"]["script"] == SCRIPT.encode()
    assert "created the commissioning script 31-kubevirt-bmc-config" in err
    (record,) = audit_records(out)
    assert (record["action"], record["before"], record["outcome"]) == ("upload-script", "absent", "ok")
    script.write_text(SCRIPT + "# v2\n")
    code, out, err = run(capsys, upload.main, values, Args(script=str(script)))
    assert code == 0 and "updated" in err
    assert double.scripts["31-kubevirt-bmc-config"]["script"].endswith(b"# v2\n")
    assert [w[:2] for w in double.writes] == [("POST", "scripts/"), ("PUT", "scripts/31-kubevirt-bmc-config")]
    assert "SEED-S3CRET" not in out + err + (tmp_path / "audit.log").read_text()


def test_upload_script_race_falls_back_to_update(tmp_path, double, capsys):
    script = tmp_path / "s"
    script.write_text(SCRIPT)
    values = values_for(tmp_path, double)
    real = maas.MAASClient.script_exists
    try:
        maas.MAASClient.script_exists = lambda self, name: False
        double.scripts["31-kubevirt-bmc-config"] = {"id": 1, "name": "31-kubevirt-bmc-config",
                                                    "script": b"old", "history": []}
        code, out, err = run(capsys, upload.main, values, Args(script=str(script)))
    finally:
        maas.MAASClient.script_exists = real
    assert code == 0 and double.scripts["31-kubevirt-bmc-config"]["script"] == SCRIPT.encode()


def test_upload_script_missing_file_is_usage_error(tmp_path, double):
    with pytest.raises(ValuesError, match="--script: expected a readable rendered script"):
        upload.main(values_for(tmp_path, double), Args(script=str(tmp_path / "nope")))


@pytest.mark.parametrize("text, problem", [
    ("#!/bin/sh\necho hi\n", "metadata block"),
    ("#!/bin/sh\n# --- Start MAAS 1.0 script metadata ---\n# title: x\n# --- End MAAS 1.0 script metadata ---\n",
     "metadata name"),
    ("#!/bin/sh\n# --- Start MAAS 1.0 script metadata ---\n# name: 'a b'\n# --- End MAAS 1.0 script metadata ---\n",
     "metadata name"),
])
def test_script_name_errors(text, problem):
    with pytest.raises(ValuesError, match=problem):
        upload.script_name(text)


def test_upload_failure_exit_1(tmp_path, double, capsys):
    script = tmp_path / "s"
    script.write_text(SCRIPT)
    double.inject("500", method="POST", path="scripts/")
    code, out, err = run(capsys, upload.main, values_for(tmp_path, double),
                         Args(script=str(script)))
    assert code == 1 and "POST scripts/: 500: Internal Server Error" in err


def test_rendered_script_if_present_has_a_name():
    rendered = ROOT / "commissioning" / "31-kubevirt-bmc-config"
    if not rendered.exists():
        pytest.skip("the commissioning script is not written yet")
    assert upload.script_name(rendered.read_text()) == "31-kubevirt-bmc-config"


