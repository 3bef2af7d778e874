"""Finding the bundle's data (checkout or installed) and writing files atomically."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from maas_kubevirt import paths

ROOT = Path(__file__).resolve().parents[1]


def test_checkout_data_dir_is_the_repository():
    assert paths.data_dir() == ROOT


def test_environment_overrides_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MAAS_KUBEVIRT_DATA", str(tmp_path))
    assert paths.data_dir() == tmp_path


def test_installed_package_uses_usr_share(tmp_path):
    site = tmp_path / "lib" / "python3" / "dist-packages"
    shutil.copytree(ROOT / "src" / "maas_kubevirt", site / "maas_kubevirt")
    env = {k: v for k, v in os.environ.items() if k != "MAAS_KUBEVIRT_DATA"}
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); "
         "from maas_kubevirt import paths; print(paths.data_dir())"],
        capture_output=True, text=True, check=True, env=env,
    )
    assert result.stdout.strip() == "/usr/share/maas-kubevirt"


def test_write_atomic_sets_mode_and_leaves_no_temporary(tmp_path):
    target = paths.write_atomic(tmp_path / "sub" / "secret", "s3cret\n", mode=0o600)
    assert target.read_text() == "s3cret\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["secret"]


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "file"
    target.write_text("old")

    with pytest.raises(TypeError):
        paths.write_atomic(target, 12345)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["file"]
