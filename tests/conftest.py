"""Session fixtures shared by integration and e2e tests: one generated model, one backend, one frontend."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.stack import Proc, backend_args, free_port, frontend_args, wait_healthy


@dataclass
class Stack:
    model_dir: Path
    address: str
    base_url: str
    backend: Proc
    frontend: Proc
    model: str = "tiny"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    from backend.tools.modelgen import ensure_model
    return ensure_model(tmp_path_factory.mktemp("model") / "tiny-qwen3", "tiny")


@pytest.fixture(scope="session")
def stack(model_dir, tmp_path_factory) -> Iterator[Stack]:
    """The shared backend + frontend; tests must leave the engine idle (no running requests) when done."""
    work = tmp_path_factory.mktemp("stack")
    address = f"ipc://{work}/backend.ipc"
    backend = Proc(backend_args(model_dir, address, "--state-dir", str(work / "state")), work / "backend.log").start()
    port = free_port()
    frontend = Proc(frontend_args(address, port), work / "frontend.log").start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, frontend, backend)
        yield Stack(model_dir, address, base_url, backend, frontend)
    finally:
        frontend.stop()
        backend.stop()
