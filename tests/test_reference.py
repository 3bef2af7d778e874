"""The reference pages (docs/reference/) against the code they describe: every values key with its
type and default, every command with its options and exit codes, every doctor row with the
statuses it can take, every metric with its type and labels, and which commands read each key
(runs against the MAAS double on loopback). Fast: no tier."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import yaml

from reference_pages import DOCTOR_PAGE, ROOT, STATUSES, code_spans, doctor_check_names, doctor_rows, key_rows, page, \
    sections, table

import maas_kubevirt
from maas_kubevirt import cli, metrics, values

SRC = ROOT / "src" / "maas_kubevirt"


# --- values.md ---------------------------------------------------------------------------------

def schema_checks() -> dict[str, object]:
    """Every key the values schema checks, dotted, -> its check."""
    checks: dict[str, object] = dict(values.SCALARS)
    for section, keys in values.SCHEMA.items():
        for key, check in keys.items():
            if (section, key) in values.NESTED:
                checks.update({f"{section}.{key}.{leaf}": c for leaf, c in values.NESTED[section, key].items()})
            else:
                checks[f"{section}.{key}"] = check
    return checks


def pool_checks() -> dict[str, object]:
    """Every key of one pool (the list ``pools``), as ``pools[].<key>`` -> its check."""
    return {f"pools[].{key}": check for key, check in values.POOL.items()}


def default_values() -> dict[str, object]:
    """Every key of the shipped values.yaml, dotted, -> its default (a mapping the schema takes
    whole, such as ingress.annotations, is one key)."""
    found: dict[str, object] = {}

    def walk(mapping: dict, path: tuple[str, ...]) -> None:
        for key, value in mapping.items():
            here = (*path, key)
            whole = len(here) == 2 and here in {(s, k) for s, keys in values.SCHEMA.items() for k in keys} \
                and here not in values.NESTED
            if isinstance(value, dict) and not whole:
                walk(value, here)
            else:
                found[".".join(here)] = value
    walk(yaml.safe_load((ROOT / "values.yaml").read_text()), ())
    return found


def values_rows() -> dict[str, dict[str, str]]:
    return {key: dict(zip(("type", "default", "read_by", "what"), row[1:]))
            for key, row in key_rows(page("values.md")).items()}


def test_values_page_lists_every_key_and_no_other():
    documented, schema, shipped = set(values_rows()), set(schema_checks()), set(default_values())
    assert schema == shipped, f"values.yaml and the schema differ: {sorted(schema ^ shipped)}"
    schema |= set(pool_checks())
    assert not schema - documented, f"not in docs/reference/values.md: {sorted(schema - documented)}"
    assert not documented - schema, f"docs/reference/values.md names keys that do not exist: {sorted(documented - schema)}"


def test_values_page_gives_each_default_as_values_yaml_has_it():
    shipped = default_values()
    wrong = []
    for key, row in values_rows().items():
        spans = code_spans(row["default"])
        if key not in shipped:
            continue   # test_values_page_lists_every_key_and_no_other says so
        if len(spans) != 1 or yaml.safe_load(spans[0]) != shipped[key]:
            wrong.append(f"{key}: the page says {row['default']!r}, values.yaml {shipped[key]!r}")
    assert not wrong, "\n".join(wrong)


def test_values_page_gives_each_type_as_the_schema_checks_it():
    """A choice lists exactly the schema's options, a number its range, a boolean says so."""
    wrong = []
    rows = values_rows()
    for key, check in {**schema_checks(), **pool_checks()}.items():
        if key not in rows:
            continue
        said = rows[key]["type"]
        expected = check(object())
        expected = expected[0] if isinstance(expected, list) else expected
        if expected.startswith("one of "):
            options = expected.removeprefix("one of ").split(", ")
            if code_spans(said) != options:
                wrong.append(f"{key}: the page lists {code_spans(said)}, the schema takes {options}")
        elif (limits := re.search(r"from (\d+) to (\d+)$", expected)) and f"{limits[1]} to {limits[2]}" not in said:
            wrong.append(f"{key}: the page says {said!r}, the schema takes {limits[1]} to {limits[2]}")
        elif expected == "true or false" and said != "boolean":
            wrong.append(f"{key}: the page says {said!r}, the schema takes a boolean")
    kinds = code_spans(rows.get("gateway.route_kinds", {}).get("type", ""))
    if kinds != list(values.ROUTE_KINDS):
        wrong.append(f"gateway.route_kinds: the page lists {kinds}, the schema takes {list(values.ROUTE_KINDS)}")
    assert not wrong, "\n".join(wrong)


def test_values_page_names_real_commands_and_the_retired_keys():
    commands = set(subcommands())
    for key, row in values_rows().items():
        readers = {r.strip() for r in row["read_by"].split(",")}
        assert readers and readers <= commands, f"{key}: read by {sorted(readers - commands)}, not a command"
    text = page("values.md")
    for section, key in values.RETIRED:
        assert f"`{section}.{key}`" in text, f"{section}.{key} is refused, and the page does not say so"


class Recording(dict):
    """A values mapping that notes every key read from it, as a dotted path, in ``read``; the
    mappings of a list (``pools``) note theirs as ``pools[].name``."""

    def __init__(self, data: dict, read: set[str], path: tuple[str, ...] = ()):
        def wrap(value, at: tuple[str, ...]):
            if isinstance(value, dict):
                return Recording(value, read, at)
            if isinstance(value, list):
                return [wrap(item, (*at[:-1], at[-1] + "[]")) for item in value]
            return value

        super().__init__({k: wrap(v, (*path, k)) for k, v in data.items()})
        self.read, self.path = read, path

    def __getitem__(self, key):
        self.read.add(".".join((*self.path, key)))
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(".".join((*self.path, key)))
        return super().get(key, default)


def keys_read(command: str, settings: dict, args: Recording | object) -> set[str]:
    """The values keys one run of a command reads (its module's main, as cli calls it)."""
    read: set[str] = set()
    cli._command(command).main(Recording(settings, read), args)
    return read & (set(schema_checks()) | set(pool_checks()))


def documented_readers() -> dict[str, set[str]]:
    """Command -> the keys values.md says it reads."""
    readers: dict[str, set[str]] = {}
    for key, row in values_rows().items():
        for command in row["read_by"].split(","):
            readers.setdefault(command.strip(), set()).add(key)
    return readers


def render_variants() -> list[dict]:
    """The defaults, and the values that switch on what the defaults leave out of a render."""
    gateway = values.load_values(None)
    gateway["exposure"] = "gateway"
    gateway["gateway"].update(namespace="bmc-gateway", name="bmc")
    traefik = values.load_values(None)
    traefik["ingress"]["allowlist"] = "traefik"
    # A pool: its RBAC and policy read the pool's keys (issue 42).
    pooled = values.load_values(None)
    pooled["pools"] = [{"name": "small", "namespace": "maas-vms", "cores": 2, "memory": "4Gi", "disk": "20Gi",
                        "storage_class": "standard", "network": "pxe", "ready": 1, "max": 2, "tags": [],
                        "on_release": "recreate"}]
    return [values.load_values(None), gateway, traefik, pooled]


def test_values_page_names_every_key_render_reads(tmp_path, capsys):
    """`render` reads exactly the keys values.md says it reads, over the exposures and allowlists."""
    read = set()
    for number, settings in enumerate(render_variants()):
        read |= keys_read("render", settings, argparse.Namespace(output=str(tmp_path / str(number)), values=None))
    capsys.readouterr()
    documented = documented_readers().get("render", set())
    assert read == documented, (f"render reads, and the page does not say so: {sorted(read - documented)}; "
                                f"the page says render reads: {sorted(documented - read)}")


def test_values_page_names_every_key_the_maas_commands_read(tmp_path, monkeypatch, capsys):
    """Against the MAAS double, each command reads no key values.md does not say it reads."""
    from maas_double import MaasDouble
    from reconcile_helpers import values_for

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))   # doctor: no cluster rows
    for name in ("MAAS_API_KEY", "CREDENTIALS_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    documented = documented_readers()
    unsaid = []
    with MaasDouble() as double:
        settings = values_for(tmp_path, double)
        script = tmp_path / "build" / "commissioning" / "31-kubevirt-bmc-config"
        keys_read("render", settings, argparse.Namespace(output=str(tmp_path / "build"), values=None))
        runs = [
            ("upload-script", argparse.Namespace(script=str(script), values=None)),
            ("reconcile", argparse.Namespace(once=True, interval=None, dry_run=False, json=False,
                                             detailed_exitcode=False, values=None)),
            ("reconcile", argparse.Namespace(once=False, interval=None, dry_run=True, json=True,
                                             detailed_exitcode=True, values=None)),
            ("status", argparse.Namespace(json=True, values=None)),
            ("doctor", argparse.Namespace(kubeconfig=None, context=None, json=True, values=None)),
            ("rotate", argparse.Namespace(serial="web1.vms", kubeconfig=None, values=None)),
        ]
        for command, args in runs:
            read = keys_read(command, settings, args)
            assert read, f"{command} read no key: the run went wrong"
            unsaid += [f"{command} reads {key}" for key in sorted(read - documented.get(command, set()))]
    capsys.readouterr()
    assert not unsaid, "values.md does not say:\n" + "\n".join(unsaid)


# --- commands.md -------------------------------------------------------------------------------

def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def command_sections() -> dict[str, str]:
    return {head.strip("`"): body for head, body in sections(page("commands.md"), "##").items()}


def documented_options(body: str) -> dict[str, tuple[str, str]]:
    """Option or positional -> (its span as written, its default cell), from a section's option table."""
    found = {}
    for row in table(body, "option"):
        for span in code_spans(row[0]):
            found[span.split()[0]] = (span, row[1] if len(row) > 2 else "")
    return found


def usage(action: argparse.Action) -> list[tuple[str, str]]:
    """(name, as a reader would write it) for each way to give this argument."""
    if not action.option_strings:
        return [(action.metavar or action.dest, action.metavar or action.dest)]
    return [(option, f"{option} {action.metavar}" if action.metavar else option) for option in action.option_strings]


def test_commands_page_documents_every_command_and_option_and_no_other():
    sections_found = command_sections()
    wrong = []
    parser = cli.build_parser()
    global_options = documented_options(sections_found.get("Global options", "| option |\n| --- |\n"))
    expected = {name for action in parser._actions if not isinstance(action, argparse._SubParsersAction)
                for name, _ in usage(action)}
    if set(global_options) != expected:
        wrong.append(f"global options: the page has {sorted(global_options)}, the parser {sorted(expected)}")
    for name, sub in subcommands().items():
        if name not in sections_found:
            wrong.append(f"{name}: no section `## \\`{name}\\``")
            continue
        documented = documented_options(sections_found[name])
        actions = [a for a in sub._actions if a.dest not in ("help", cli.VALUES_AFTER)]
        written = {option: text for action in actions for option, text in usage(action)}
        for option in sorted(set(written) - set(documented)):
            wrong.append(f"{name}: {option} is not documented")
        for option in sorted(set(documented) - set(written)):
            wrong.append(f"{name}: the page documents {option}, which the parser does not take")
        for option in sorted(set(written) & set(documented)):
            if documented[option][0] != written[option]:
                wrong.append(f"{name}: the page writes {documented[option][0]!r}, the parser {written[option]!r}")
        for action in actions:
            default = action.default
            if isinstance(default, str) and default != argparse.SUPPRESS and action.option_strings:
                cell = documented.get(action.option_strings[0], ("", ""))[1]
                if f"`{default}`" not in cell:
                    wrong.append(f"{name}: {action.option_strings[0]} defaults to {default}, the page says {cell!r}")
    extra = set(sections_found) - set(subcommands()) - {"Global options", "Exit status", "Environment", "Shell completion"}
    if extra:
        wrong.append(f"the page has sections for commands that do not exist: {sorted(extra)}")
    assert not wrong, "\n".join(wrong)


EXIT_NAMES = {name: getattr(maas_kubevirt, name) for name in dir(maas_kubevirt) if name.startswith("EXIT_")}


def returned_exit_codes(path: Path, function: str | None = None) -> set[int]:
    """The EXIT_* constants a module (or one function of it) returns."""
    tree = ast.parse(path.read_text())
    if function is not None:
        tree = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    return {EXIT_NAMES[node.id] for ret in ast.walk(tree) if isinstance(ret, ast.Return) and ret.value is not None
            for node in ast.walk(ret.value) if isinstance(node, ast.Name) and node.id in EXIT_NAMES}


def command_module(name: str) -> Path:
    """The source file of the module that runs a command (cli imports it on use)."""
    return Path(cli._command(name).__file__)


def exit_rows(body: str) -> dict[int, str]:
    return {int(row[0]): row[1] for row in table(body, "exit")}


def test_commands_page_gives_every_exit_code_each_command_returns():
    """Each command's exit table holds exactly the codes its module returns, and those main()
    returns for every command (configuration errors, failures); the shared table every constant."""
    found = command_sections()
    common = returned_exit_codes(SRC / "cli.py", "main") | {2}   # 2: argparse's usage error
    wrong = []
    for name in subcommands():
        if name not in found:
            continue
        codes = returned_exit_codes(command_module(name)) | common
        documented = set(exit_rows(found[name]))
        if documented != codes:
            wrong.append(f"{name}: the page gives exit codes {sorted(documented)}, the code returns {sorted(codes)}")
    shared = set(exit_rows(found.get("Exit status", "| exit |\n| --- |\n")))
    if shared != set(EXIT_NAMES.values()):
        wrong.append(f"Exit status: the page gives {sorted(shared)}, the constants are {EXIT_NAMES}")
    assert not wrong, "\n".join(wrong)


def test_commands_page_says_what_the_unit_does_with_a_configuration_error():
    unit = (ROOT / "debian" / "maas-kubevirt.service").read_text()
    prevented = re.search(r"^RestartPreventExitStatus=(\d+)$", unit, re.M)
    assert prevented and int(prevented[1]) == maas_kubevirt.EXIT_USAGE, "the unit restarts on a configuration error"
    assert f"`RestartPreventExitStatus={prevented[1]}`" in exit_rows(command_sections()["Exit status"])[maas_kubevirt.EXIT_USAGE]
    assert "--detailed-exitcode" in exit_rows(command_sections()["reconcile"])[maas_kubevirt.EXIT_PENDING]


# --- metrics.md --------------------------------------------------------------------------------

def exported() -> dict[str, tuple[str, tuple[str, ...], object]]:
    """Every metric family a reconcile process can export -> (type, label names, collector)."""
    registry = metrics.Metrics()
    registry.leader(lambda: False)
    registry.pools(["small"])
    found = {}
    for collector in registry.registry._collector_to_names:
        name = collector._name + ("_total" if collector._type == "counter" else "")
        found[name] = (collector._type, tuple(collector._labelnames), collector)
    return found


# The values each label takes, from the constants metrics.py holds them in.
LABEL_VALUES = {
    ("outcome", "maas_kubevirt_cycles_total"): (*metrics.CYCLE_OUTCOMES, "other"),
    ("method", "maas_kubevirt_maas_requests_total"): (*metrics.METHODS, "other"),
    ("method", "maas_kubevirt_maas_request_duration_seconds"): (*metrics.METHODS, "other"),
    ("endpoint", "maas_kubevirt_maas_requests_total"): (*(n for _, n in metrics.FAMILIES), "other"),
    ("endpoint", "maas_kubevirt_maas_request_duration_seconds"): (*(n for _, n in metrics.FAMILIES), "other"),
    ("code", "maas_kubevirt_maas_requests_total"): (*metrics.FAILURES, "other"),
    ("kind", "maas_kubevirt_actions_total"): (*metrics.KINDS, "other"),
    ("outcome", "maas_kubevirt_actions_total"): (*metrics.OUTCOMES, "other"),
    ("state", "maas_kubevirt_machines"): metrics.STATES,
    ("pool", "maas_kubevirt_pool_machines"): ("<pools[].name>",),
    ("state", "maas_kubevirt_pool_machines"): metrics.POOL_STATES,
    ("pool", "maas_kubevirt_pool_actions_total"): ("<pools[].name>",),
    ("kind", "maas_kubevirt_pool_actions_total"): (*metrics.POOL_KINDS, "other"),
    ("outcome", "maas_kubevirt_pool_actions_total"): (*metrics.POOL_OUTCOMES, "other"),
}


def test_metrics_page_lists_every_metric_with_its_type_and_labels():
    text = page("metrics.md")
    rows = {code_spans(row[0])[0]: row for row in table(text, "metric") if code_spans(row[0])}
    found = exported()
    assert set(rows) == set(found), f"page and code differ: {sorted(set(rows) ^ set(found))}"
    wrong = []
    for name, (kind, labels, collector) in found.items():
        if rows[name][1] != kind:
            wrong.append(f"{name}: the page says {rows[name][1]}, it is a {kind}")
        if tuple(code_spans(rows[name][2])) != labels:
            wrong.append(f"{name}: the page gives labels {code_spans(rows[name][2])}, it has {list(labels)}")
        if kind == "histogram":
            bounds = collector._upper_bounds[:-1]   # the last is +Inf
            if f"buckets from {bounds[0]:g} s to {bounds[-1]:g} s" not in rows[name][3]:
                wrong.append(f"{name}: its buckets run from {bounds[0]:g} s to {bounds[-1]:g} s")
    assert not wrong, "\n".join(wrong)


def test_metrics_page_lists_every_label_value():
    documented = {}
    for row in table(page("metrics.md"), "label"):
        for metric in code_spans(row[1]):
            documented[(code_spans(row[0])[0], metric)] = [span for span in code_spans(row[2])]
    pairs = {(label, name) for name, (_, labels, _) in exported().items() for label in labels}
    assert pairs == set(LABEL_VALUES), f"labels of the code and of this test differ: {sorted(pairs ^ set(LABEL_VALUES))}"
    wrong = [f"{label} of {metric}: the page gives {documented.get((label, metric))}, the code {list(allowed)}"
             for (label, metric), allowed in LABEL_VALUES.items() if documented.get((label, metric)) != list(allowed)]
    assert not wrong, "\n".join(wrong)


# --- doctor.md ---------------------------------------------------------------------------------

def _status_of(node: ast.expr) -> set[str]:
    """OK / WARN / FAIL / SKIP, or both branches of `A if c else B`."""
    if isinstance(node, ast.IfExp):
        return _status_of(node.body) | _status_of(node.orelse)
    if isinstance(node, ast.Name) and node.id in ("OK", "WARN", "FAIL", "SKIP"):
        return {node.id.lower()}
    raise AssertionError(f"a Check's status this test cannot read: {ast.unparse(node)}")


def _name_of(node: ast.expr, known: dict[str, str]) -> str:
    """A Check's name: a string, a name bound to one, or an f-string (its fixed prefix, as `x/`,
    or the name it starts with, as `{NAME}/`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    if isinstance(node, ast.JoinedStr) and isinstance(node.values[0], ast.Constant):
        return node.values[0].value.rstrip("/")
    if isinstance(node, ast.JoinedStr) and isinstance(node.values[0], ast.FormattedValue):
        return _name_of(node.values[0].value, known)
    raise AssertionError(f"a Check's name this test cannot read: {ast.unparse(node)}")


def doctor_statuses() -> dict[str, set[str]]:
    """Check name -> every status its Check(...) calls in doctor's source can give (the rows
    skipped wholesale by _skipped are the page's general rules, not a row's own)."""
    found: dict[str, set[str]] = {}
    for path in sorted((SRC / "doctor").glob("*.py")):
        tree = ast.parse(path.read_text())
        module = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)
                  and isinstance(n.value.value, str)}
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name != "_skipped"):
            known = dict(module)
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                        isinstance(node.value, (ast.Constant, ast.JoinedStr)):
                    try:
                        known[node.targets[0].id] = _name_of(node.value, module)
                    except AssertionError:
                        pass
            for call in ast.walk(function):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Check":
                    found.setdefault(_name_of(call.args[0], known), set()).update(_status_of(call.args[1]))
    return found


def page_name(name: str) -> str:
    """A row as doctor names it: `cluster.vms/<ns>`, `pools.network/<pool>` and `cluster.kyverno_rbac/…` by their prefix."""
    return re.sub(r"/(…|<ns>|<pool>)$", "", name)


def test_doctor_page_lists_every_check_doctor_makes():
    """Each check name in doctor's source is a row of docs/reference/doctor.md, once, and no other."""
    names = set(doctor_statuses())
    listed = doctor_check_names()
    assert len(listed) == len(set(listed)), f"a check is listed twice: {sorted(n for n in listed if listed.count(n) > 1)}"
    rows = {page_name(name) for name in listed}
    assert names and not names - rows, f"not in {DOCTOR_PAGE}: {sorted(names - rows)}"
    assert not rows - names, f"{DOCTOR_PAGE} lists checks doctor does not make: {sorted(rows - names)}"


def test_doctor_page_gives_each_row_the_statuses_it_takes_and_a_fix():
    """A row says when it is ok, warn, fail or skip for exactly the statuses its code gives it."""
    statuses = doctor_statuses()
    wrong = []
    for name, said in doctor_rows().items():
        code = statuses.get(page_name(name), set())
        documented = {status for status in STATUSES if status in said}
        if documented != code:
            wrong.append(f"{name}: the page says when it is {sorted(documented)}, the code gives {sorted(code)}")
        if not said.get("fix"):
            wrong.append(f"{name}: no fix")
    assert not wrong, "\n".join(wrong)
