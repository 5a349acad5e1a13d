"""Every shell line of the scripts is linted (shellcheck), the image recipe too (hadolint), and the
image pins what the requirements pin."""
import os
import re
import sys
from pathlib import Path
import subprocess

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "examples/scripts"
BIN = Path(sys.executable).parent
SHELL_FILES = sorted(SCRIPTS.glob("*.sh")) + [ROOT / "dockerfile/entrypoint.sh"]



@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: p.name)
def test_shellcheck(path):
    proc = subprocess.run([str(BIN / "shellcheck"), "--external-sources", str(path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint():
    proc = subprocess.run([str(BIN / "hadolint"), "--no-color", "dockerfile/Dockerfile"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_scripts_are_executable_and_strict():
    for path in SCRIPTS.glob("*.sh"):
        if path.name == "common.sh":
            assert not os.access(path, os.X_OK), "common.sh is sourced, never run"
            continue
        assert os.access(path, os.X_OK), path
        assert "set -euo pipefail" in path.read_text(), path


def test_image_pins_match_the_requirements():
    dockerfile = (ROOT / "dockerfile/Dockerfile").read_text()
    torch = re.search(r"^torch==(\S+)", (ROOT / "requirements/constraints.txt").read_text(), re.M).group(1)
    flash = re.search(r"^flash-attn==(\S+)", (ROOT / "requirements/gpu.txt").read_text(), re.M).group(1)
    assert f"torch=={torch}" in dockerfile and f"flash-attn=={flash}" in dockerfile
    assert "python3.11" in dockerfile and "USER 1000" in dockerfile
    assert "requirements/gpu.txt" in dockerfile and "pip install --no-deps -e ." in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "runs" in ignored  # the build context stays small
