"""Test helpers that run the real processes: a backend (embedded vLLM CPU engine) and frontends over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
# The test backends' context. Long enough that a chat meant to outlive something (an init, a kill, a client
# leaving) cannot finish first, even on a loaded machine: see LONG_MAX_TOKENS.
MAX_MODEL_LEN = 4096
# max_tokens of such chats (with ignore_eos): the context less room for their short prompts. The tiny model
# decodes a few hundred tokens/s here, so each lasts seconds, far longer than the races it is held against.
LONG_MAX_TOKENS = MAX_MODEL_LEN - 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process with its log in a file; tail() helps explain failures."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args, self.log_path = args, log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> Proc:
        log = open(self.log_path, "ab")  # noqa: SIM115  (the child keeps writing to it)
        self.proc = subprocess.Popen([sys.executable, *self.args], cwd=REPO, env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def check(self, stall_s: float) -> None:
        """Raises, with the log's tail, if the process has exited or its log has not grown for `stall_s` (a
        stack dump of a stalled process is added where py-spy is installed). For waits that would otherwise
        only end at their timeout."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.args[1]} exited {self.proc.returncode}:\n{self.tail()}")
        size = self.log_path.stat().st_size if self.log_path.exists() else 0
        now = time.monotonic()
        if size != getattr(self, "_log_size", None):
            self._log_size, self._log_grew_at = size, now
        elif now - self._log_grew_at > stall_s:
            raise TimeoutError(f"{self.args[1]}: no log line for {stall_s:g} s and no reply:\n{self.tail()}"
                               f"{py_spy_dump(self.proc.pid)}")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(30)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


# Each test backend's KV cache: an explicit size (vLLM's --kv-cache-memory-bytes), never a share of the RAM the
# host reports: a fresh VM's NUMA node read 7.8 GiB where it reads 23.5 GiB an hour later, and a share of 0.1 then
# left the engine less than nothing (docs/reliability.md, "Memory the host reports"). 512 MiB holds 262144 tokens
# of the tiny models, twice their PoC batch.
KV_CACHE_BYTES = "512M"
MEMORY_FLAGS = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")


def backend_args(model_dir: Path, address: str, *extra: str) -> list[str]:
    """The test backend's command line; `extra` comes last (vLLM's parser: the last flag wins), and a memory
    flag in it replaces the explicit KV size (a share of RAM needs no explicit size beside it)."""
    memory = [] if any(a.split("=")[0] in MEMORY_FLAGS for a in extra) else ["--kv-cache-memory-bytes",
                                                                              KV_CACHE_BYTES]
    return ["-m", "backend", "--model", str(model_dir), "--address", address, "--generate-model", "none",
            "--enforce-eager", *memory, "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-seqs", "64", "--no-json-whitespace", "--served-model-name", "tiny",
            "--tool-call-parser", "hermes", "--enable-auto-tool-choice", *extra]


def frontend_args(address: str, port: int, *extra: str) -> list[str]:
    return ["-m", "frontend", "--backend-address", address, "--port", str(port), *extra]


def py_spy_dump(pid: int) -> str:
    """Every thread's Python stack of `pid` and its children (py-spy), or "" where py-spy is missing."""
    import shutil

    spy = shutil.which("py-spy")
    if spy is None:
        return ""
    try:
        out = subprocess.run([spy, "dump", "--subprocesses", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=60)
    except subprocess.TimeoutExpired:
        return "\npy-spy dump timed out"
    return f"\npy-spy dump:\n{out.stdout}{out.stderr}"


def wait_healthy(base_url: str, *procs: Proc, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.proc is not None and proc.proc.poll() is not None:
                raise RuntimeError(f"{proc.args[1]} exited {proc.proc.returncode}:\n{proc.tail()}")
        try:
            if httpx.get(f"{base_url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{base_url} not healthy after {timeout_s} s:\n" + "\n".join(p.tail() for p in procs))


@dataclass
class Stack:
    model_dir: Path
    address: str
    base_url: str
    backend: Proc
    frontend: Proc
    model: str = "tiny"


@contextmanager
def running_stack(model_dir: Path, work: Path, *backend_extra: str) -> Iterator[Stack]:
    """A backend (its state in `work`) and a frontend, healthy, stopped on exit."""
    address = f"ipc://{work}/backend.ipc"
    with serving(model_dir, work, backend_args(model_dir, address, "--state-dir", str(work / "state"),
                                               *backend_extra)) as stack:
        yield stack


@contextmanager
def serving(model_dir: Path, work: Path, backend_argv: list[str]) -> Iterator[Stack]:
    """The backend `backend_argv` starts (its --address an ipc:// path in `work`) and a frontend, healthy."""
    address = backend_argv[backend_argv.index("--address") + 1]
    backend = Proc(backend_argv, work / "backend.log").start()
    port = free_port()
    frontend = Proc(frontend_args(address, port), work / "frontend.log").start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, frontend, backend)
        yield Stack(model_dir, address, base_url, backend, frontend)
    finally:
        frontend.stop()
        backend.stop()


def wait_until(predicate, timeout_s: float = 60.0, what: str = "condition"):
    """Polls `predicate` until it returns something truthy, which is returned; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} not met in {timeout_s} s"
        time.sleep(0.05)
    return value
