"""Every file a document, comment or docstring of the repository names is in the repository (issue 29, item 5).

What is read: Markdown, TOML and YAML files whole; the comments of shell scripts, Makefiles and Dockerfiles; the
comments and docstrings of Python files. A path-like token (a name ending in one of the suffixes of `PATH`, with or
without directories) must name a file of the repository: from its root, from the directory of the file that names
it, as the end of a repository path, or (a bare name) anywhere in it. Bare data file names (JSON without a
directory: a model's or an output's files) are not checked. Paths of other projects are allowed only where
`EXTERNAL` lists them, each with whose they are.

Nor may anything point at the design documents the project was started from, which the repository does not hold,
or at their section numbers: docs/architecture.md and docs/decisions.md hold those facts now.
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Directories that are not the repository's: virtualenvs, caches, models, state, build output.
_SKIP_DIRS = {"models", "state", "build", "dist", "gpu-out", "__pycache__", "node_modules"}
_WHOLE = (".md", ".toml", ".yml", ".yaml")
_COMMENTS_ONLY = (".sh", ".Dockerfile", ".conf")

# A path-like token: optional ./ or ../, directories, a file name with one of these suffixes.
PATH = re.compile(r"(?<![\w./-])((?:\.\.?/)*[\w.-]*\w(?:/[\w.-]+)*\.(?:py|md|sh|yml|yaml|toml|json))(?![\w/-])")

# Other projects' files that the repository names on purpose, by path prefix or bare name: whose they are.
EXTERNAL = {
    "torch/": "PyTorch's installed package (a frame of a native heap profile)",
    "vllm/": "vLLM's source tree (the fork, gonka-ai/vllm, keeps the same layout and adds vllm/poc/)",
    "tests/gonka/": "the fork's tests (gonka-ai/vllm)",
    "decentralized-api/": "dapi, the network's node (gonka-ai/gonka)",
    "mlnode/": "the ML node (gonka-ai/gonka)",
    "deploy/": "the network's deployment files (gonka-ai/gonka)",
    "src/gonka_poc/": "the gonka-poc vLLM plugin (gonka-ai/gonka-vllm-plugins)",
    "gpu_random.py": "the fork's PoC RNG (gonka-ai/vllm), the source of the golden values",
    ".stage/": "the wheel bundle staged for a GPU machine, ignored by git (scripts/gpu_check.sh explains it)",
}

# Design references that name nothing in the repository: the start-up design and spec documents, their sections.
DESIGN_REFERENCE = re.compile(
    r"§\s*\d+(?:\.\d+)*(?:[–-]\d+(?:\.\d+)*)?|\bARCHITECTURE\b|reference-behavior|vllm-integration|\bstyle\.md\b"
    r"|shared/(?:design|spec|gpu)\b|\bAppendix [A-C]\b|(?i:\bthe spec's\b)")

def _repo_files() -> Iterator[Path]:
    """The files git tracks or would track: ignored ones (.venv, models, .stage) exist only on some checkouts, and a
    reference that resolves to one here would fail on CI's clean clone."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=False)
    if listed.returncode == 0:
        for name in listed.stdout.decode().split("\0"):
            if name and (ROOT / name).is_file():
                yield ROOT / name
        return
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS
                       and not d.endswith(".egg-info")]
        for name in filenames:
            yield Path(dirpath) / name


FILES = sorted(_repo_files())
RELATIVE = {p.relative_to(ROOT).as_posix() for p in FILES}
NAMES = {p.name for p in FILES}


def _python_text(source: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every comment and docstring line."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                for i, line in enumerate(doc.splitlines()):
                    yield node.body[0].lineno + i, line


def _text(path: Path) -> Iterator[tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        yield from _python_text(source)
    elif path.name.endswith(_WHOLE):
        yield from enumerate(source.splitlines(), 1)
    elif path.name.endswith(_COMMENTS_ONLY) or path.name == "Makefile":
        for number, line in enumerate(source.splitlines(), 1):
            if "#" in line:
                yield number, line[line.index("#"):]


def _is_external(token: str) -> bool:
    return any(token.startswith(key) if key.endswith("/") else token == key for key in EXTERNAL)


def _resolves(token: str, source: Path) -> bool:
    for base in (ROOT, source.parent):
        candidate = (base / token).resolve()
        if candidate.is_relative_to(ROOT) and candidate.relative_to(ROOT).as_posix() in RELATIVE:
            return True
    if "/" not in token:
        return token in NAMES
    return any(p.endswith("/" + token) for p in RELATIVE)


def findings() -> dict[str, list[tuple[int, str]]]:
    """Relative path → (line, what) for every missing file named and every design reference."""
    found: dict[str, list[tuple[int, str]]] = {}
    for path in FILES:
        if not (path.suffix == ".py" or path.name.endswith(_WHOLE + _COMMENTS_ONLY) or path.name == "Makefile"):
            continue
        relative = path.relative_to(ROOT).as_posix()
        for number, line in _text(path):
            for match in PATH.finditer(line):
                token = match.group(1)
                if token.endswith(".json") and "/" not in token:
                    continue
                if not _is_external(token) and not _resolves(token, path):
                    found.setdefault(relative, []).append((number, token))
            for match in DESIGN_REFERENCE.finditer(line):
                found.setdefault(relative, []).append((number, match.group(0)))
    return found


FINDINGS = findings()


def test_every_file_named_is_in_the_repository() -> None:
    unexpected = [f"{path}:{line}: {what}" for path, items in sorted(FINDINGS.items()) for line, what in items]
    assert not unexpected, "references to files the repository does not contain, or to design documents it " \
        "does not hold (point to the file that holds the fact, docs/architecture.md or docs/decisions.md):\n" + \
        "\n".join(unexpected)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The scanner itself: a stale path, a path outside the repository, a spec section; external and real paths
    pass."""
    source = ROOT / "backend" / "core" / "loop.py"
    assert not _resolves("backend/curve.py", source)
    assert not _resolves("../shared/gpu/README.md", ROOT / "scripts" / "gpu_check.sh")
    assert _resolves("backend/transport/server.py", source)
    assert not _resolves(".venv/bin/activate", source)  # ignored by git: present here, absent on a clean clone
    assert _resolves("policy.py", source)  # beside the file that names it
    assert _resolves("transport/server.py", ROOT / "backend" / "__init__.py")
    assert _is_external("vllm/v1/worker/gpu_worker.py") and not _is_external("backend/ipc.py")
    assert [m.group(1) for m in PATH.finditer("see `backend/engine/poc.py:81`, not https://x.org/a/b.py")] == [
        "backend/engine/poc.py"]
    assert DESIGN_REFERENCE.search("(spec " + "§1.8)") and DESIGN_REFERENCE.search("see " + "ARCHITECTURE")
    assert not DESIGN_REFERENCE.search("docs/architecture.md, the OpenAPI spec's schema")
