"""Rendering the bundle: the seed, file modes, the injected script settings, the YAML stream."""

from __future__ import annotations

import ast
import copy
import stat

import pytest
import yaml
from hypothesis import given, strategies as st

from maas_kubevirt import cli, render
from maas_kubevirt.paths import SCRIPT_NAME
from maas_kubevirt.values import ValuesError, load_values

DEFAULTS = load_values(None)


def settings_of(script: str) -> dict:
    for node in ast.parse(script).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SETTINGS":
            return ast.literal_eval(node.value)
    raise AssertionError("no SETTINGS in the script")


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_render_generates_the_seed_once_and_keeps_it(tmp_path, capsys):
    assert cli.main(["render", "--output", str(tmp_path)]) == 0
    seed_file = tmp_path / "seed"
    seed = seed_file.read_text().strip()
    assert len(seed) == 64 and mode(seed_file) == 0o600
    script = tmp_path / "commissioning" / SCRIPT_NAME
    first = script.read_text()
    assert cli.main(["render", "--output", str(tmp_path)]) == 0
    assert seed_file.read_text().strip() == seed
    assert script.read_text() == first
    assert settings_of(first)["seed"] == seed
    out, err = capsys.readouterr()
    assert seed not in out + err
    assert "kubectl apply -k" in out and "upload-script" in out


def test_secret_bearing_files_are_private_and_names_carry_no_secret(tmp_path):
    render.render(DEFAULTS, tmp_path)
    seed = (tmp_path / "seed").read_text().strip()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert mode(tmp_path / "commissioning" / SCRIPT_NAME) == 0o700
    for path in files:
        assert seed not in str(path.relative_to(tmp_path))
        if seed in path.read_text():
            assert mode(path) & 0o077 == 0, path
    kubernetes = [p for p in files if p.parent.name == "kubernetes"]
    assert any(seed in p.read_text() for p in kubernetes), "the seed Secret is rendered"
    for path in kubernetes:
        assert list(yaml.safe_load_all(path.read_text())), path


def test_configured_seed_file_is_used(tmp_path):
    seed_file = tmp_path / "site-seed"
    seed_file.write_text("a-site-secret-of-enough-length\n")
    values = copy.deepcopy(DEFAULTS)
    values["seed"]["file"] = str(seed_file)
    render.render(values, tmp_path / "out")
    assert not (tmp_path / "out" / "seed").exists()
    assert settings_of((tmp_path / "out" / "commissioning" / SCRIPT_NAME).read_text())["seed"] == (
        "a-site-secret-of-enough-length"
    )


@pytest.mark.parametrize("content, problem", [(None, "expected a readable seed file"), ("short", "at least 16")])
def test_bad_seed_file_is_a_values_error_that_writes_nothing(tmp_path, content, problem):
    seed_file = tmp_path / "seed-file"
    if content is not None:
        seed_file.write_text(content)
    values = copy.deepcopy(DEFAULTS)
    values["seed"]["file"] = str(seed_file)
    with pytest.raises(ValuesError, match=problem) as raised:
        render.render(values, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    if content:
        assert content not in str(raised.value)


def test_stream_needs_a_seed_file(tmp_path, capsys):
    assert cli.main(["render", "--output", "-"]) == 2
    assert "seed.file: expected a seed file when rendering to stdout" in capsys.readouterr().err


def test_stream_is_one_yaml_document_per_object(tmp_path, capsys):
    seed_file = tmp_path / "seed"
    seed_file.write_text("0123456789abcdef0123456789abcdef\n")
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump({"seed": {"file": str(seed_file)}}))
    assert cli.main(["--values", str(values_file), "render", "--output", "-"]) == 0
    out, err = capsys.readouterr()
    documents = [d for d in yaml.safe_load_all(out) if d is not None]
    kinds = {d["kind"] for d in documents}
    assert {"ClusterRole", "Secret", "ClusterPolicy", "Namespace"} <= kinds
    assert "Kustomization" not in kinds
    assert err == ""


@given(
    manufacturer=st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=40).filter(str.strip),
    seed=st.text(st.characters(blacklist_categories=("Cs",)), min_size=16, max_size=64),
)
def test_no_value_can_break_out_of_the_script_settings(manufacturer, seed):
    values = copy.deepcopy(DEFAULTS)
    values["smbios"]["manufacturer"] = manufacturer
    script = render.render_commissioning(values, seed)
    assert settings_of(script) == render.script_settings(values, seed)
    source = (render.data_dir() / "commissioning" / SCRIPT_NAME).read_text()
    assert len(script.splitlines()) == len(source.splitlines())
