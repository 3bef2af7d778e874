"""tools/mutate's own logic: the script's way into mutmut, and the equivalent-mutant lists."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

import pytest
ROOT = Path(__file__).resolve().parents[1]
_loader = importlib.machinery.SourceFileLoader("mutate_tool", str(ROOT / "tools" / "mutate"))
mutate = importlib.util.module_from_spec(importlib.util.spec_from_loader("mutate_tool", _loader))
_loader.exec_module(mutate)


def test_the_script_as_a_module_names_its_functions_for_mutmut_however_it_is_loaded(tmp_path):
    module_text = mutate.script_as_module((ROOT / mutate.SCRIPT).read_text(encoding="utf-8"))
    path = tmp_path / "any-name"
    path.write_text(module_text)
    loader = importlib.machinery.SourceFileLoader("loaded_under_another_name", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    assert module.main.__module__ == module.parse_serial.__module__ == mutate.SCRIPT_MODULE
    assert module._RUN_AS_SCRIPT is False
    # Run as a program (a rendered copy under test) it still reaches main().
    assert module_text.count("sys.exit(main())") == 1
    program = {"__name__": "__main__"}
    exec(compile(module_text.replace("sys.exit(main())", "REACHED_MAIN = True"), str(path), "exec"), program)
    assert program["REACHED_MAIN"] and program["main"].__module__ == mutate.SCRIPT_MODULE


def test_function_names_from_mutant_names():
    assert mutate.function_of("maas_kubevirt.identity.x_validate_domain__mutmut_9") == "validate_domain"
    assert mutate.function_of("kubevirt_bmc_config.x__text__mutmut_2") == "_text"
    assert mutate.function_of("maas_kubevirt.maas.xǁMAASClientǁcall__mutmut_3") == "MAASClient.call"
    assert mutate.function_of("maas_kubevirt.maas.client.xǁMAASClientǁcall__mutmut_3") == "MAASClient.call"
    assert mutate.function_of("maas_kubevirt.maas.x_client_from_values__mutmut_1") == "client_from_values"


def test_changed_lines_of_a_diff():
    diff = "--- a\n+++ b\n@@ -1 +1 @@\n-    if a < b:\n+    if a <= b:\n     pass\n"
    assert mutate.changed_lines(diff) == ("if a < b:", "if a <= b:")


@pytest.mark.parametrize("module", sorted(mutate.TARGETS))
def test_each_equivalent_mutant_is_explained_and_still_in_the_code(module):
    """An entry whose line left the code is stale: make mutate would list it; this says so sooner."""
    files = [mutate.SCRIPT] if module == "script" else mutate.target_files(module)
    source = " ".join(" ".join((ROOT / name).read_text(encoding="utf-8").split()) for name in files)
    for (function, before, after), reason in mutate.load_equivalents(module).items():
        assert len(reason.split()) >= 4, (function, before)
        assert function.rsplit(".", 1)[-1] in source and " ".join(before.split(" / ")[0].split()) in source, (
            f"{module}: {function}: {before!r} is no longer in {mutate.TARGETS[module][0]}"
        )
        assert before != after


def test_report_clears_the_survivors_and_counts_what_a_stopped_run_never_reached(tmp_path):
    meta = tmp_path / "mutants" / f"{mutate.TARGETS['render'][0]}.meta"
    meta.parent.mkdir(parents=True)
    results = {"m.x_a__mutmut_1": 1, "m.x_a__mutmut_2": 0, "m.x_b__mutmut_1": 33, "m.x_b__mutmut_2": None}
    meta.write_text(json.dumps({"exit_code_by_key": results, "other": "kept"}))
    assert mutate.forget("render", tmp_path, ["m.x_a__mutmut_2", "m.x_b__mutmut_1"]) == 1
    assert json.loads(meta.read_text()) == {"other": "kept", "exit_code_by_key": {
        "m.x_a__mutmut_1": 1, "m.x_a__mutmut_2": None, "m.x_b__mutmut_1": None, "m.x_b__mutmut_2": None}}


def test_report_puts_back_the_files_a_stopped_re_run_left_mutated(tmp_path):
    for module in ("render", "script"):
        target = tmp_path / mutate.TARGETS[module][0]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("a mutant left behind\n")
    mutate.restore_targets(tmp_path, ["render", "script"])
    assert (tmp_path / mutate.TARGETS["render"][0]).read_text() == (ROOT / mutate.TARGETS["render"][0]).read_text()
    assert (tmp_path / mutate.SCRIPT_AS_MODULE).read_text() == mutate.script_as_module((ROOT / mutate.SCRIPT).read_text())


def test_a_package_target_is_every_python_file_in_it():
    assert mutate.target_files("render") == ["src/maas_kubevirt/render.py"]
    files = mutate.target_files("maas")
    assert "src/maas_kubevirt/maas/__init__.py" in files and "src/maas_kubevirt/maas/client.py" in files
    assert files == sorted(files) and all(name.endswith(".py") for name in files)
    assert {Path(name).name for name in files} == {path.name for path in (ROOT / "src/maas_kubevirt/maas").glob("*.py")}


def test_a_package_target_is_scored_and_cleared_over_all_its_files(tmp_path, monkeypatch):
    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py"):
        (package / name).write_text("def f():\n    return 1\n")
    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    monkeypatch.setitem(mutate.TARGETS, "pkg", ("src/pkg/", []))
    codes = {"src/pkg/__init__.py": {}, "src/pkg/a.py": {"pkg.a.x_f__mutmut_1": 1, "pkg.a.x_f__mutmut_2": 0},
             "src/pkg/b.py": {"pkg.b.x_f__mutmut_1": None}}
    for name, results in codes.items():
        meta = tmp_path / "mutants" / f"{name}.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"exit_code_by_key": results}))
    assert mutate.results("pkg", tmp_path) == [("src/pkg/a.py", "pkg.a.x_f__mutmut_1", 1),
                                                ("src/pkg/a.py", "pkg.a.x_f__mutmut_2", 0),
                                                ("src/pkg/b.py", "pkg.b.x_f__mutmut_1", None)]
    assert mutate.forget("pkg", tmp_path, ["pkg.a.x_f__mutmut_2"]) == 1
    assert json.loads((tmp_path / "mutants/src/pkg/a.py.meta").read_text())["exit_code_by_key"] == {
        "pkg.a.x_f__mutmut_1": 1, "pkg.a.x_f__mutmut_2": None}
    tree = tmp_path / "tree"
    (tree / "src" / "pkg").mkdir(parents=True)
    (tree / "src" / "pkg" / "a.py").write_text("a mutant left behind\n")
    mutate.restore_targets(tree, ["pkg"])
    assert all((tree / name).read_text() == (tmp_path / name).read_text() for name in codes)
