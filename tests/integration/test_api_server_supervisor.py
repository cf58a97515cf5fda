"""pocserve.supervisor with stand-in children (short Python scripts, no engine): how an instance stops, and how it
goes down with a child. The real backend and frontend are in test_api_server.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pocserve.supervisor import Child, Supervisor
from tests.stack import REPO

# Writes its pid, then sleeps; optionally ignores SIGTERM, exits with a code, or leaves a grandchild behind in
# its process group that ignores SIGTERM and outlives it.
_SCRIPT = """
import os, signal, subprocess, sys, time
mode, pid_file = sys.argv[1], sys.argv[2]
if mode == "deaf":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "leaves_grandchild":
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    grandchild = subprocess.Popen([sys.executable, "-c", code])
    open(pid_file + ".grandchild", "w").write(str(grandchild.pid))
open(pid_file, "w").write(str(os.getpid()))
if mode.startswith("exit"):
    time.sleep(0.5)
    sys.exit(int(mode[4:]))
time.sleep(60)
"""


def _child(name: str, mode: str, tmp_path) -> Child:
    return Child(name, [sys.executable, "-c", _SCRIPT, mode, str(tmp_path / name)], dict(os.environ))


def _pid(tmp_path, name: str, timeout_s: float = 30.0) -> int:
    path = tmp_path / name
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{name} never started"
        time.sleep(0.02)
    return int(path.read_text())


# The supervisor under test runs in a process of its own, so the signals meant for it never reach pytest.
_RUNNER = """
import json, os, sys
sys.path.insert(0, sys.argv[3])
from pocserve.supervisor import Child, Supervisor
from tests.stack import REPO
specs = json.loads(sys.argv[1])
sys.exit(Supervisor([Child(name, argv, dict(os.environ)) for name, argv in specs], float(sys.argv[2])).run())
"""


def _supervise_and_signal(tmp_path, children: list[Child], stop_timeout_s: float,
                          sig: int = signal.SIGINT) -> tuple[int, float]:
    """Runs a Supervisor over `children` in a child process, signals it once every child has started;
    returns (its exit status, seconds from the signal to its exit)."""
    specs = json.dumps([(c.name, c.argv) for c in children])
    runner = subprocess.Popen([sys.executable, "-c", _RUNNER, specs, str(stop_timeout_s), str(REPO)])
    try:
        for c in children:
            _pid(tmp_path, c.name)
        signalled = time.monotonic()
        runner.send_signal(sig)
        code = runner.wait(60)
        return code, time.monotonic() - signalled
    finally:
        if runner.poll() is None:
            runner.kill()


def _is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_supervisor_signal_stops_both_children_exit_zero(tmp_path, sig):
    children = [_child("backend", "sleep", tmp_path), _child("frontend", "sleep", tmp_path)]
    code, _ = _supervise_and_signal(tmp_path, children, 10.0, sig)
    assert code == 0  # both stopped by the one SIGTERM each got (the default action counts as stopped)
    assert all(_is_gone(_pid(tmp_path, n)) for n in ("backend", "frontend"))


def test_supervisor_child_exit_takes_the_instance_down_nonzero(tmp_path):
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    sup = Supervisor([_child("backend", "exit3", tmp_path), _child("frontend", "sleep", tmp_path)], 10.0)
    assert sup.run() == 3
    assert _is_gone(_pid(tmp_path, "frontend"))
    assert {sig: signal.getsignal(sig) for sig in before} == before  # its handlers are gone again


def test_supervisor_child_exit_zero_still_counts_as_failure(tmp_path):
    sup = Supervisor([_child("backend", "exit0", tmp_path), _child("frontend", "sleep", tmp_path)], 10.0)
    assert sup.run() == 1


def test_supervisor_child_ignoring_sigterm_is_killed_after_the_timeout(tmp_path):
    children = [_child("backend", "deaf", tmp_path), _child("frontend", "sleep", tmp_path)]
    code, _ = _supervise_and_signal(tmp_path, children, 1.0)
    assert code == 1  # not a clean stop
    assert _is_gone(_pid(tmp_path, "backend"))


def test_supervisor_reaps_what_a_child_left_in_its_process_group(tmp_path):
    children = [_child("backend", "leaves_grandchild", tmp_path), _child("frontend", "sleep", tmp_path)]
    code, _ = _supervise_and_signal(tmp_path, children, 10.0)
    assert code == 0
    grandchild = int((tmp_path / "backend.grandchild").read_text())
    assert _is_gone(grandchild)
