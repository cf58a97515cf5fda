"""`python -m common.curve_keys`, and its former name `backend.tools.curve_keys`, as an operator runs them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.stack import REPO


@pytest.mark.parametrize("module", ["common.curve_keys", "backend.tools.curve_keys"])
def test_curve_keys_writes_a_pair_and_never_overwrites_it(module, tmp_path):
    run = [sys.executable, "-m", module, str(tmp_path / "keys"), "--name", "frontend-1"]
    first = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    public, secret = tmp_path / "keys" / "frontend-1.key", tmp_path / "keys" / "frontend-1.key_secret"
    assert public.stat().st_mode & 0o777 == 0o644 and secret.stat().st_mode & 0o077 == 0
    before = secret.read_bytes()

    again = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "exists" in again.stderr and secret.read_bytes() == before
