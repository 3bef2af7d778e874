"""Rendering the bundle: the seed, file modes, the injected script settings, the YAML stream."""

from __future__ import annotations

import ast
import copy
import os
import re
import secrets
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
    assert seed not in first and "seed" not in settings_of(first)
    out, err = capsys.readouterr()
    assert seed not in out + err
    assert "kubectl apply -k" in out and "upload-script" in out


def test_render_says_once_that_it_generated_the_seed_where_and_to_back_it_up(tmp_path, capsys):
    assert cli.main(["render", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    announced = [line for line in out.splitlines() if line.startswith("Generated a new site seed")]
    assert len(announced) == 1 and f"in {tmp_path / 'seed'} (mode 0600)" in announced[0]
    assert "Back it up now" in out
    assert cli.main(["render", "--output", str(tmp_path)]) == 0
    assert "Generated a new site seed" not in capsys.readouterr().out


def test_render_with_a_seed_file_announces_no_seed(tmp_path, capsys):
    seed_file = tmp_path / "site-seed"
    seed_file.write_text(secrets.token_hex(32) + "\n")
    seed_file.chmod(0o600)
    values = tmp_path / "values.yaml"
    values.write_text(f"seed:\n  file: {seed_file}\n")
    assert cli.main(["--values", str(values), "render", "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Generated a new site seed" not in out and not (tmp_path / "out" / "seed").exists()


def test_secret_bearing_files_are_private_and_names_carry_no_secret(tmp_path):
    render.render(DEFAULTS, tmp_path)
    seed = (tmp_path / "seed").read_text().strip()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert mode(tmp_path / "commissioning" / SCRIPT_NAME) == 0o755  # no secret in it: MAAS serves it to anyone
    for path in files:
        assert seed not in str(path.relative_to(tmp_path))
        if seed in path.read_text():
            assert mode(path) & 0o077 == 0, path
    kubernetes = [p for p in files if p.parent.name == "kubernetes"]
    assert any(seed in p.read_text() for p in kubernetes), "the seed Secret is rendered"
    for path in kubernetes:
        assert list(yaml.safe_load_all(path.read_text())), path


SITE_SEED = "b52e09d7c4a16f83e0b9d25c7a41f6e38d0c92b7a5e1f4d6093c8b2a7e5d1f04"  # no repeated pattern


def private_file(path, text):
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_configured_seed_file_is_used(tmp_path):
    seed_file = private_file(tmp_path / "site-seed", SITE_SEED + "\n")
    values = copy.deepcopy(DEFAULTS)
    values["seed"]["file"] = str(seed_file)
    render.render(values, tmp_path / "out")
    assert not (tmp_path / "out" / "seed").exists()
    secret = (tmp_path / "out" / "kubernetes" / "seed-secret.yaml").read_text()
    assert SITE_SEED in secret
    assert mode(tmp_path / "out") == 0o755  # the seed lives elsewhere: nothing private at the top


def test_script_is_byte_identical_whatever_the_seed(tmp_path):
    """MAAS serves the script to any PXE-booting machine and any MAAS user: it carries no secret."""
    scripts = []
    for name, seed in (("one", secrets.token_hex(32)), ("two", secrets.token_hex(32))):
        seed_file = private_file(tmp_path / f"seed-{name}", seed + "\n")
        values = copy.deepcopy(DEFAULTS)
        values["seed"]["file"] = str(seed_file)
        render.render(values, tmp_path / name)
        script = (tmp_path / name / "commissioning" / SCRIPT_NAME).read_bytes()
        assert seed.encode() not in script
        scripts.append(script)
    assert scripts[0] == scripts[1]


@pytest.mark.parametrize("content, mode, problem", [
    (None, 0o600, "expected a readable seed file"),
    ("a-site-secret-of-enough-length", 0o600, "64 or more hexadecimal digits"),
    ("ab" * 31, 0o600, "only 31 bytes"),
    (SITE_SEED, 0o640, "has mode 0640"),
    (SITE_SEED, 0o604, "has mode 0604"),
])
def test_bad_seed_file_is_a_values_error_that_writes_nothing(tmp_path, content, mode, problem):
    seed_file = tmp_path / "seed-file"
    if content is not None:
        private_file(seed_file, content).chmod(mode)
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
    seed_file = private_file(tmp_path / "seed", SITE_SEED + "\n")
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump({"seed": {"file": str(seed_file)}, "ingress": {"tls_secret": "bmc-tls"}}))
    assert cli.main(["--values", str(values_file), "render", "--output", "-"]) == 0
    out, err = capsys.readouterr()
    assert "Next steps" not in out and not re.search(r"^Rendered \d+ files", out, re.MULTILINE)
    documents = [d for d in yaml.safe_load_all(out) if d is not None]
    kinds = {d["kind"] for d in documents}
    assert {"ClusterRole", "Secret", "ClusterPolicy", "Namespace"} <= kinds
    assert "Kustomization" not in kinds
    assert err == ""


@given(
    manufacturer=st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=40).filter(str.strip),
)
def test_no_value_can_break_out_of_the_script_settings(manufacturer):
    values = copy.deepcopy(DEFAULTS)
    values["smbios"]["manufacturer"] = manufacturer
    script = render.render_commissioning(values)
    assert settings_of(script) == render.script_settings(values)
    source = (render.data_dir() / "commissioning" / SCRIPT_NAME).read_text()
    assert len(script.splitlines()) == len(source.splitlines())


def test_a_symlink_planted_at_output_seed_is_refused_and_nothing_is_written(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    target = tmp_path / "attacker-reads-this"
    (output / "seed").symlink_to(target)
    with pytest.raises(ValuesError, match="is a symbolic link"):
        render.render(DEFAULTS, output)
    assert not target.exists()
    assert sorted(p.name for p in output.iterdir()) == ["seed"]


def test_a_dangling_or_pointing_symlink_is_refused_even_to_a_good_seed(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    real = private_file(tmp_path / "real-seed", SITE_SEED)
    (output / "seed").symlink_to(real)
    with pytest.raises(ValuesError, match="is a symbolic link"):
        render.render(DEFAULTS, output)


def test_an_existing_output_seed_is_checked_like_seed_file(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    private_file(output / "seed", "0123456789abcdef\n")
    with pytest.raises(ValuesError, match="64 or more hexadecimal digits") as raised:
        render.render(DEFAULTS, output)
    assert "0123456789abcdef" not in str(raised.value)
    assert sorted(p.name for p in output.iterdir()) == ["seed"]


@pytest.mark.parametrize("umask", [0o000, 0o002, 0o022, 0o077, 0o277])
def test_output_directories_have_fixed_modes_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        render.render(DEFAULTS, tmp_path / "a" / "out")
    finally:
        os.umask(old)
    out = tmp_path / "a" / "out"
    assert mode(out) == 0o700                      # it holds the generated seed
    assert mode(tmp_path / "a") == 0o755
    assert mode(out / "kubernetes") == 0o755 and mode(out / "commissioning") == 0o755
    assert mode(out / "seed") == 0o600
    assert mode(out / "kubernetes" / "seed-secret.yaml") == 0o600


def test_nothing_is_written_when_a_value_fails_late(tmp_path, monkeypatch):
    def broken(values, seed):
        raise ValuesError(["ingress.source_ranges: expected something else"])

    monkeypatch.setattr(render, "render_kubernetes", broken)
    with pytest.raises(ValuesError):
        render.render(DEFAULTS, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # not even the generated seed


# --- rendering_problem: what upload-script and doctor say about a script ------------------

SOURCE = "the-candidate"
RENDER_AGAIN = "run `maas-kubevirt --values FILE render` with the values you pass here"


def test_a_script_rendered_from_these_values_has_no_problem():
    assert render.rendering_problem(render.render_commissioning(DEFAULTS), DEFAULTS, SOURCE) is None


@pytest.mark.parametrize("text", [
    "#!/bin/sh\necho no settings here\n",              # no SETTINGS at all
    "SETTINGS = {'domain': \n",                        # not Python
    "SETTINGS = dict(domain='bmc.example.com')\n",    # not a literal
    "SETTINGS = ['domain', 'bmc.example.com']\n",     # a literal, not a mapping
    "x = 1\n",                                        # SETTINGS absent, other assignments present
])
def test_a_script_without_literal_settings_is_not_ours(text):
    assert render.rendering_problem(text, DEFAULTS, SOURCE) == (
        f"{SOURCE}: not a script rendered by maas-kubevirt (no SETTINGS): {RENDER_AGAIN}")


def test_settings_found_after_other_statements_are_read():
    script = render.render_commissioning(DEFAULTS)
    assert render._embedded_settings("import os\nx = 1\n" + script) == render.script_settings(DEFAULTS)
    assert render._embedded_settings("a = b = 1\nobj.attr = 2\nx, y = 3, 4\nSETTINGS = {'k': 1}\n") == {"k": 1}


def test_the_unrendered_template_is_named_as_such():
    template = (render.data_dir() / "commissioning" / SCRIPT_NAME).read_text()
    assert render.rendering_problem(template, DEFAULTS, SOURCE) == (
        f"{SOURCE}: the unrendered commissioning script from the source tree: {RENDER_AGAIN}")


def test_other_values_are_named_by_key_never_by_value():
    theirs = copy.deepcopy(DEFAULTS)
    theirs["redfish"]["domain"] = "bmc.secret-site.example"
    theirs["smbios"]["manufacturer"] = "operator-x Cloud"
    problem = render.rendering_problem(render.render_commissioning(theirs), DEFAULTS, SOURCE)
    assert problem == (f"{SOURCE}: rendered from other values (domain, manufacturer differ from these): "
                       f"{RENDER_AGAIN}")
    assert "secret-site" not in problem and "operator-x" not in problem


def test_a_setting_only_one_side_has_is_named():
    script = render.render_commissioning(DEFAULTS).replace("'rendered': True", "'rendered': True, 'extra': 1")
    assert "(extra differ from these)" in render.rendering_problem(script, DEFAULTS, SOURCE)


def test_a_script_rendered_before_username_was_retired_is_named_by_it():
    """Such a script (in MAAS, or in an old bundle) writes the one fixed user every VM shares."""
    script = render.render_commissioning(DEFAULTS).replace("'rendered': True", "'rendered': True, 'username': 'maas'")
    assert render.rendering_problem(script, DEFAULTS, SOURCE) == (
        f"{SOURCE}: rendered from other values (username differ from these): {RENDER_AGAIN}")


def test_edited_code_with_the_right_settings_is_named_as_edited():
    script = render.render_commissioning(DEFAULTS) + "\n# a local change\n"
    assert render.rendering_problem(script, DEFAULTS, SOURCE) == (
        f"{SOURCE}: its code differs from what maas-kubevirt renders (another version, or edited): "
        f"{RENDER_AGAIN}")


# --- render's next steps -------------------------------------------------------------------


@pytest.mark.parametrize("argv0, command", [
    ("/usr/bin/maas-kubevirt", "/usr/bin/maas-kubevirt"),   # the command as the operator typed it
    ("/srv/venv/lib/python3/site-packages/maas_kubevirt/__main__.py", "maas-kubevirt"),
])
def test_next_steps_name_the_files_and_the_values_just_used(tmp_path, capsys, monkeypatch, argv0, command):
    values_file = tmp_path / "site values.yaml"       # a space, quoted for the shell
    values_file.write_text("redfish:\n  domain: bmc.site.example\n")
    out = tmp_path / "out"
    monkeypatch.setattr("sys.argv", [argv0])
    assert cli.main(["--values", str(values_file), "render", "--output", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    # The seed is generated and .values-source is render's note of its values file: neither is rendered.
    written = [p for p in out.rglob("*") if p.is_file() and p.name not in ("seed", ".values-source")]
    assert printed[0] == f"Rendered {len(written)} files into {out}/"
    assert printed[1] == f"Generated a new site seed in {out / 'seed'} (mode 0600): every BMC password derives from it."
    assert printed[2].startswith("  Back it up now")
    assert printed[3:] == [
        "Next steps:",
        f"  kubectl apply -k {out / 'kubernetes'}",
        "  on the MAAS region host, with this release's package installed: "
        "sudo maas-kubevirt --values /etc/maas-kubevirt/values.yaml upload-script",
    ]


def test_next_steps_without_a_values_file_name_none(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["maas-kubevirt"])
    assert cli.main(["render", "--output", str(tmp_path / "out")]) == 0
    assert "sudo maas-kubevirt --values /etc/maas-kubevirt/values.yaml upload-script" in capsys.readouterr().out


def test_the_script_is_ascii_so_any_locale_reads_it():
    """MAAS runs it under whatever locale the ephemeral image has; render reads it likewise."""
    assert (render.data_dir() / "commissioning" / SCRIPT_NAME).read_bytes().isascii()


def test_a_policy_this_version_retired_is_named_with_the_way_to_remove_it(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["render", "--output", str(out)]) == 0
    kubernetes = out / "kubernetes"
    retired = yaml.safe_load((kubernetes / "policy-vm-bmc.yaml").read_text())
    retired["metadata"]["name"] = "maas-kubevirt-old-rule"
    (kubernetes / "policy-old-rule.yaml").write_text(yaml.safe_dump(retired))
    listed = yaml.safe_load((kubernetes / "kustomization.yaml").read_text())
    (kubernetes / "kustomization.yaml").write_text(yaml.safe_dump({**listed, "resources": [*listed["resources"], "policy-old-rule.yaml"]}))
    capsys.readouterr()
    assert cli.main(["render", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "This version no longer has maas-kubevirt-old-rule; `kubectl apply -k` does not remove it." in printed
    assert f"Delete, then apply:\n  kubectl delete clusterpolicy maas-kubevirt-old-rule\n  kubectl apply -k {kubernetes}\n" in printed
    assert "cannot update" not in printed  # nothing else needs recreating


def test_directories_are_never_open_to_others_even_before_their_mode_is_set(tmp_path, monkeypatch):
    """Created 0700 and only then opened up: no moment when another user can list the seed's directory."""
    seen = []
    real_chmod = os.chmod

    def chmod(path, mode):
        seen.append((path, stat.S_IMODE(os.stat(path).st_mode)))
        real_chmod(path, mode)

    monkeypatch.setattr(render.os, "chmod", chmod)
    old = os.umask(0)
    try:
        render.make_directory(tmp_path / "a" / "b" / "out", render.PRIVATE_DIR)
    finally:
        os.umask(old)
    assert [mode for _, mode in seen] == [0o700, 0o700, 0o700]
    assert mode(tmp_path / "a") == mode(tmp_path / "a" / "b") == 0o755 and mode(tmp_path / "a" / "b" / "out") == 0o700


def test_a_directory_another_process_creates_meanwhile_is_left_and_the_rest_made(tmp_path, monkeypatch):
    real_mkdir = os.mkdir
    raced = tmp_path / "a"

    def mkdir(path, mode=0o777):
        if path == raced and not raced.exists():
            real_mkdir(path, 0o750)           # the other process wins the race
            raise FileExistsError(path)
        real_mkdir(path, mode)

    monkeypatch.setattr(render.os, "mkdir", mkdir)
    render.make_directory(tmp_path / "a" / "b" / "out", render.PUBLIC_DIR)
    assert mode(raced) == 0o750                 # not ours: left as it is
    assert mode(tmp_path / "a" / "b") == 0o755 and mode(tmp_path / "a" / "b" / "out") == 0o755


def test_manifests_without_the_seed_are_readable_and_those_with_it_private(tmp_path):
    written = render.render(DEFAULTS, tmp_path)
    seed = (tmp_path / "seed").read_text().strip()
    manifests = [p for p in written if p.parent.name == "kubernetes"]
    assert {p.name for p in manifests if mode(p) == 0o600} == {p.name for p in manifests if seed in p.read_text()} == {"seed-secret.yaml"}
    assert all(mode(p) == 0o644 for p in manifests if p.name != "seed-secret.yaml")


def test_the_stream_is_the_rendered_directory_as_one_stream(tmp_path, capsys):
    seed_file = private_file(tmp_path / "seed", SITE_SEED + "\n")
    values = copy.deepcopy(DEFAULTS)
    values["seed"]["file"] = str(seed_file)
    written = render.render(values, tmp_path / "out")
    capsys.readouterr()
    assert render.render(values, "-") == []
    files = [p for p in written if p.parent.name == "kubernetes" and p.name != "kustomization.yaml"]
    assert capsys.readouterr().out == "---\n".join(p.read_text() for p in files)


def template_with(tmp_path, monkeypatch, text):
    (tmp_path / "commissioning").mkdir()
    (tmp_path / "commissioning" / SCRIPT_NAME).write_text(text)
    monkeypatch.setattr(render, "data_dir", lambda: tmp_path)


MARKER = "SETTINGS = {}  # replaced by maas-kubevirt render\n"


@pytest.mark.parametrize("text, found", [("print('no settings')\n", 0), (MARKER + MARKER, 2)])
def test_a_template_without_exactly_one_settings_line_is_refused(tmp_path, monkeypatch, text, found):
    template_with(tmp_path, monkeypatch, text)
    with pytest.raises(RuntimeError) as raised:
        render.render_commissioning(DEFAULTS)
    assert str(raised.value) == f"{SCRIPT_NAME}: expected exactly one SETTINGS line to replace, found {found}"


def test_a_template_that_assigns_settings_again_is_refused(tmp_path, monkeypatch):
    template_with(tmp_path, monkeypatch, "config.path = '/x'\n" + MARKER + "SETTINGS = {'domain': 'elsewhere'}\n")
    with pytest.raises(RuntimeError) as raised:
        render.render_commissioning(DEFAULTS)
    assert str(raised.value) == f"{SCRIPT_NAME}: the injected SETTINGS do not read back as written"


def test_a_template_with_other_kinds_of_assignment_renders(tmp_path, monkeypatch):
    template_with(tmp_path, monkeypatch, "config.path = '/x'\na, b = 1, 2\n" + MARKER)
    assert settings_of(render.render_commissioning(DEFAULTS)) == render.script_settings(DEFAULTS)


def test_an_ingress_without_a_certificate_is_warned_about_and_still_rendered(tmp_path, capsys):
    """MAAS's driver speaks HTTPS only: with neither ingress.tls_secret nor ingress.cluster_issuer
    render warns, once, naming both keys; either one, or the gateway exposure, silences it."""
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"ingress": {"class_name": "nginx"}}))
    assert cli.main(["--values", str(site), "render", "--output", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "ingress.tls_secret and ingress.cluster_issuer" in err, err
    assert "HTTPS" in err and "'nginx'" in err
    assert (tmp_path / "a" / "kubernetes" / "kustomization.yaml").is_file()
    for changes in ({"ingress": {"tls_secret": "bmc-tls"}}, {"ingress": {"cluster_issuer": "site-ca"}},
                    {"exposure": "gateway", "gateway": {"namespace": "gw", "name": "bmc"}}):
        values = copy.deepcopy(DEFAULTS)
        for key, part in changes.items():
            values[key] = {**values[key], **part} if isinstance(part, dict) else part
        assert render.tls_warning(values) is None, changes


# --- kubernetes.example_namespace ---------------------------------------------------------------


def _namespaces(directory) -> set[str]:
    from maas_kubevirt import policies

    manifests = {path.name: path.read_text() for path in directory.glob("*.yaml")}
    listed = yaml.safe_load(manifests["kustomization.yaml"])["resources"]
    return {o["metadata"]["name"] for name in listed for o in policies.parse(manifests[name])
            if o.get("kind") == "Namespace"}


def test_the_example_namespace_is_rendered_by_default_and_left_out_with_false(tmp_path, capsys):
    from maas_kubevirt import policies

    assert DEFAULTS["kubernetes"]["example_namespace"] is True
    assert cli.main(["render", "--output", str(tmp_path / "build")]) == 0
    kubernetes = tmp_path / "build" / "kubernetes"
    assert _namespaces(kubernetes) == {"maas-kubevirt", policies.EXAMPLE_NAMESPACE}
    values = tmp_path / "values.yaml"
    values.write_text("kubernetes:\n  example_namespace: false\n")
    assert cli.main(["--values", str(values), "render", "--output", str(tmp_path / "build")]) == 0
    # Left out of the kustomization, and the previous render's file gone (`kubectl apply -f DIR`).
    assert _namespaces(kubernetes) == {"maas-kubevirt"}
    assert not (kubernetes / policies.EXAMPLE_NAMESPACE_FILE).exists()
    capsys.readouterr()
    assert cli.main(["--values", str(values), "render", "--output", "-"]) == 2   # no seed.file: refused
    values.write_text(f"kubernetes:\n  example_namespace: false\nseed:\n  file: {tmp_path / 'build' / 'seed'}\n")
    capsys.readouterr()
    assert cli.main(["--values", str(values), "render", "--output", "-"]) == 0
    stream = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    assert [o["metadata"]["name"] for o in stream if o["kind"] == "Namespace"] == ["maas-kubevirt"]
    assert policies.EXAMPLE_NAMESPACE not in yaml.safe_dump(stream)


@pytest.mark.parametrize("value", ["no-thanks", 0, "", None, "false"])
def test_example_namespace_is_true_or_false(tmp_path, value):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"kubernetes": {"example_namespace": value}}))
    with pytest.raises(ValuesError) as refused:
        load_values(path)
    assert str(refused.value).startswith("kubernetes.example_namespace: expected true or false, found")


def test_a_bare_render_after_a_site_render_refuses_to_drop_the_sites_values(tmp_path, capsys):
    """`make VALUES=site.yaml` then `make`: the second would render the defaults over the site's
    bundle without a word (issue 43 item 3). It refuses, saying how to go on; a site render again works."""
    from maas_kubevirt import cli

    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"redfish": {"domain": "bmc.site.example"}}))
    output = tmp_path / "build"
    assert cli.main(["--values", str(site), "render", "--output", str(output)]) == 0
    rendered = {p: p.read_bytes() for p in output.rglob("*.yaml")}
    capsys.readouterr()
    assert cli.main(["render", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert str(site) in err and "--values" in err and "remove" in err
    assert {p: p.read_bytes() for p in output.rglob("*.yaml")} == rendered, "the refused render wrote something"
    assert cli.main(["--values", str(site), "render", "--output", str(output)]) == 0
    fresh = tmp_path / "fresh"
    assert cli.main(["render", "--output", str(fresh)]) == 0
    assert cli.main(["render", "--output", str(fresh)]) == 0, "defaults over defaults is no loss"
