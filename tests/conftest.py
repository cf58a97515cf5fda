"""Session fixtures shared by integration and e2e tests: one generated model, one backend, one frontend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import Stack, running_stack


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    from backend.tools.modelgen import ensure_model
    return ensure_model(tmp_path_factory.mktemp("model") / "tiny-qwen3", "tiny")


@pytest.fixture(scope="session")
def stack(model_dir, tmp_path_factory) -> Iterator[Stack]:
    """The shared backend + frontend; tests must leave the engine idle (no running requests) when done."""
    with running_stack(model_dir, tmp_path_factory.mktemp("stack")) as stack:
        yield stack
