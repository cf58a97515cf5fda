"""One instance on this machine: its model directory, HTTP port, private ZMQ path and state directory, and the
command lines of its two processes.

Instances never share anything: the ZMQ ipc socket lives in a fresh directory of the instance's own (named after
its port, removed at exit), and the state directory is `<POCSERVE_STATE_ROOT>/port-<port>`, so an instance
restarted on the same port (the ML node's ports are fixed: INFERENCE_PORT + 1 + i) finds its queued jobs and
undelivered callbacks again.
"""

from __future__ import annotations

import errno
import shutil
import socket
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common.model_dir import ModelNotFound
from common.model_dir import resolve_model as common_resolve_model
from pocserve.flags import Plan
from pocserve.supervisor import Child

# generate-model none: a drop-in serves the model it was given, never a generated stand-in.
BACKEND_FIXED = ("--generate-model", "none")


class InstanceError(Exception):
    """The instance cannot start; str() is the one line the launcher prints (it names the flag)."""


@dataclass(frozen=True)
class Instance:
    plan: Plan
    model_dir: Path
    state_dir: Path
    run_dir: Path  # private: holds the backend's ipc socket

    @property
    def address(self) -> str:
        return f"ipc://{self.run_dir}/backend.ipc"

    def backend_command(self) -> list[str]:
        """vLLM's command line as given (the backend takes it whole), then the instance's own settings."""
        return [sys.executable, "-m", "backend", *self.plan.backend_args, *BACKEND_FIXED, "--address", self.address,
                "--state-dir", str(self.state_dir)]

    def frontend_command(self) -> list[str]:
        return [sys.executable, "-m", "frontend", "--host", self.plan.host, "--port", str(self.plan.port),
                "--backend-address", self.address, "--frontend-id", f"{socket.gethostname()}-{self.plan.port}",
                *self.plan.frontend_args]

    def children(self, environ: Mapping[str, str]) -> list[Child]:
        """The backend and the frontend, with the operator's environment (POCSERVE_*, POC_*, CUDA_VISIBLE_DEVICES,
        VLLM_*); secrets go to the frontend through its environment, never on a command line others can read."""
        env = {**environ, "PYTHONUNBUFFERED": "1"}
        secret = {"POCSERVE_API_KEY": self.plan.api_key} if self.plan.api_key else {}
        return [Child("backend", self.backend_command(), env),
                Child("frontend", self.frontend_command(), {**env, **secret})]

    def describe(self) -> dict[str, object]:
        """For the start log line."""
        return {"port": self.plan.port, "host": self.plan.host, "model": str(self.model_dir),
                "state_dir": str(self.state_dir), "address": self.address}

    def remove_run_dir(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)


def prepare(plan: Plan, state_root: Path) -> Instance:
    """Checks what can be checked before anything starts (model, port), then makes the instance's directories."""
    model_dir = resolve_model(plan.model, plan.revision, plan.download_dir)
    check_port_free(plan.host, plan.port)
    state_dir = (state_root / f"port-{plan.port}").resolve()
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InstanceError(f"POCSERVE_STATE_ROOT: cannot create {state_dir}: {e.strerror}") from None
    run_dir = Path(tempfile.mkdtemp(prefix=f"pocserve-{plan.port}-"))
    return Instance(plan, model_dir, state_dir, run_dir)


def resolve_model(model: str, revision: str | None = None, download_dir: str | None = None) -> Path:
    try:
        return common_resolve_model(model, revision, download_dir)
    except ModelNotFound as e:
        raise InstanceError(f"--model {e}") from None


def check_port_free(host: str, port: int) -> None:
    """Fails now, with the port named, where the frontend would fail to bind after the engine has loaded."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InstanceError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            s.bind(address)
        except OSError as e:
            what = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
            raise InstanceError(f"--port {port}: {what} on {host}") from None
