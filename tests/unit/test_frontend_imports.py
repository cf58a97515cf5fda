"""The frontend must run without torch, vLLM, numpy or transformers, and must not import the backend."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "vllm", "numpy", "transformers")
FORBIDDEN_ROOTS = {"torch", "vllm", "numpy", "backend", "poc", "sampling"}

_CHILD = textwrap.dedent(f"""
    import importlib.abc
    import sys

    BLOCKED = {HEAVY!r}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{{name}} is blocked: the frontend must not need it")
            return None

    sys.meta_path.insert(0, Blocker())
    import frontend.app, frontend.__main__, frontend.backend_client
    from frontend.app import create_app
    from frontend.settings import load_settings

    app = create_app(load_settings([]))
    assert app.routes
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print("ok")
""")


def test_frontend_imports_without_heavy_packages():
    env = {k: v for k, v in os.environ.items() if not k.startswith("POCSERVE_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", ["frontend", "protocol"])
def test_frontend_imports_no_forbidden_module_statically(package):
    files = sorted((REPO / package).rglob("*.py"))
    assert files
    offenders = {str(f.relative_to(REPO)): sorted(_imported_roots(f) & FORBIDDEN_ROOTS) for f in files}
    assert {f: roots for f, roots in offenders.items() if roots} == {}
