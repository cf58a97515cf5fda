"""pocserve.instance: what one instance checks before anything starts (model, port) and what it keeps apart from
its neighbours (state directory, ZMQ path). Real sockets and directories, no engine."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest

from pocserve.flags import Plan
from pocserve.instance import InstanceError, check_port_free, prepare, resolve_model
from tests.stack import free_port

PLAN = Plan(model="", revision=None, download_dir=None, host="127.0.0.1", port=0, api_key="",
            backend_args=("--served-model-name", "tiny", "--max-model-len", "1024"), frontend_args=(), ignored=())


def test_instance_port_in_use_names_the_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InstanceError, match=rf"^--port {port}: address already in use on 127\.0\.0\.1$"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # free again once closed


def test_instance_model_directory_or_local_hugging_face_cache(tmp_path):
    (tmp_path / "m").mkdir()
    assert resolve_model(str(tmp_path / "m")) == (tmp_path / "m").resolve()
    with pytest.raises(InstanceError, match=r"no such directory$"):
        resolve_model(str(tmp_path / "missing"))
    cache = tmp_path / "hf"
    with pytest.raises(InstanceError, match="not in the local Hugging Face cache"):
        resolve_model("Org/Model", download_dir=str(cache))
    # A repo the node downloaded before: found offline, at the revision refs/main names.
    snapshot = cache / "models--Org--Model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--Org--Model" / "refs").mkdir()
    (cache / "models--Org--Model" / "refs" / "main").write_text("abc123")
    assert resolve_model("Org/Model", download_dir=str(cache)) == snapshot


def test_instance_state_dir_and_zmq_path_are_the_instance_own(tmp_path):
    (tmp_path / "model").mkdir()
    plan = replace(PLAN, model=str(tmp_path / "model"), api_key="secret")
    a = prepare(replace(plan, port=free_port()), tmp_path / "state")
    # Another free port, not a's neighbour: port + 1 can be any process's ephemeral port on a busy machine.
    b = prepare(replace(plan, port=next(p for p in iter(free_port, None) if p != a.plan.port)), tmp_path / "state")
    try:
        assert a.state_dir == (tmp_path / "state" / f"port-{a.plan.port}").resolve() and a.state_dir.is_dir()
        assert a.state_dir != b.state_dir and a.address != b.address
        assert a.run_dir.name.startswith(f"pocserve-{a.plan.port}-")
        backend, frontend = a.children({"PATH": "/bin", "POC_CALLBACK_INTERVAL_SEC": "1"})
        assert backend.argv[1:3] == ["-m", "backend"] and frontend.argv[1:3] == ["-m", "frontend"]
        assert _flag(backend.argv, "--address") == a.address == _flag(frontend.argv, "--backend-address")
        assert _flag(backend.argv, "--state-dir") == str(a.state_dir)
        assert _flag(backend.argv, "--generate-model") == "none"
        assert _flag(backend.argv, "--max-model-len") == "1024"
        assert _flag(frontend.argv, "--port") == str(a.plan.port)
        assert backend.env["POC_CALLBACK_INTERVAL_SEC"] == "1" == frontend.env["POC_CALLBACK_INTERVAL_SEC"]
        assert frontend.env["POCSERVE_API_KEY"] == "secret" and "POCSERVE_API_KEY" not in backend.env
        assert not any("secret" in arg for arg in backend.argv + frontend.argv)
    finally:
        a.remove_run_dir()
        b.remove_run_dir()
    assert not a.run_dir.exists()


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_instance_unusable_state_root_names_the_setting(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "file").write_text("")
    with pytest.raises(InstanceError, match=r"^POCSERVE_STATE_ROOT: cannot create"):
        prepare(replace(PLAN, model=str(tmp_path / "model"), port=free_port()), Path(tmp_path / "file"))
