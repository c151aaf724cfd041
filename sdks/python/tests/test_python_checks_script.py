"""scripts/python-checks.sh chooses an interpreter the pins install on
(Python >= 3.11.5), or says which is needed and how to point it at one,
before it installs anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "scripts" / "python-checks.sh"


def _fake_python(path: Path, version: str) -> Path:
    """An interpreter that only reports its version (and can "make a venv")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\ncase "$*" in *version_info*) echo "{version}";; esac\nexit 0\n')
    path.chmod(0o755)
    return path


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "PYENV_ROOT": str(tmp_path / "pyenv")}
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PATH", "PYENV_ROOT", "HOME")} | base | env
    return subprocess.run(["bash", str(SCRIPT), "--which-python"], env=full, capture_output=True, text=True, timeout=60)


def test_an_old_python3_first_on_path_is_passed_over_for_one_that_fits(tmp_path: Path) -> None:
    _fake_python(tmp_path / "bin" / "python3", "3.11.2")
    for name in ("python3.11", "python3.12", "python3.13"):
        _fake_python(tmp_path / "bin" / name, "3.11.2")
    # Nothing that fits: a clear message, before anything is installed.
    out = _run(tmp_path)
    assert out.returncode == 2, out
    assert "need Python >= 3.11.5" in out.stderr and "3.11.2" in out.stderr and "PYTHON=" in out.stderr, out.stderr
    assert "ResolutionImpossible" not in out.stderr and "pip" not in out.stderr.replace("pins", "")
    # A pyenv version that fits is chosen, and the script says so.
    old = _fake_python(tmp_path / "pyenv" / "versions" / "3.10.13" / "bin" / "python3", "3.10.13")
    good = _fake_python(tmp_path / "pyenv" / "versions" / "3.11.9" / "bin" / "python3", "3.11.9")
    _fake_python(tmp_path / "pyenv" / "versions" / "3.13.0" / "bin" / "python3", "3.13.0")
    out = _run(tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == str(good), out
    assert f"using {good} (Python 3.11.9)" in out.stderr, out.stderr
    # PYTHON= is obeyed, and refused with the reason when it does not fit.
    out = _run(tmp_path, PYTHON=str(old))
    assert out.returncode == 2 and "PYTHON=" + str(old) + " is Python 3.10.13" in out.stderr and ">= 3.11.5" in out.stderr, out
    newer = _fake_python(tmp_path / "other" / "python3", "3.12.1")
    out = _run(tmp_path, PYTHON=str(newer))
    assert out.returncode == 0 and out.stdout.strip() == str(newer), out
