"""Child processes for the benchmarks: each in its own process group, logged to a file, always killed.

Every child starts a new session, so a Ctrl-C in the terminal reaches only the bench script, whose `finally`
(SIGTERM too, through `raise_on_signals`) then takes down each whole group: vLLM's API server
leaves its engine-core child in the same group, and a group kill also catches orphans.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt, so `finally` blocks stop the children.

    SIGINT is set explicitly: a script started in the background by a non-interactive shell inherits it ignored.
    """
    def handler(signum, _frame) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


# The first name of raise_on_signals; bench/mining.py imports it.
raise_on_sigterm = raise_on_signals


class Proc:
    """`python ARGS` with its own process group and its output in `log_path`."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.args, self.log_path = name, args, log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, *self.args], cwd=REPO, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_running(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the group, wait for the leader, then SIGKILL whatever is left of the group."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        if self.proc.poll() is None:
            _killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        _killpg(pgid, signal.SIGKILL)
        self.proc.wait(10)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group may be gone already
        os.killpg(pgid, sig)


def wait_http_ok(url: str, procs: list[Proc], timeout_s: float) -> float:
    """Polls `url` until it answers 200; returns the seconds waited. Fails fast if a child dies."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        for p in procs:
            p.check_running()
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout_s} s:\n" + "\n".join(p.tail() for p in procs))


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (Linux /proc/stat; NaN elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def stat_fields(path: str) -> list[str] | None:
    """The fields of one /proc stat file (a process's or a thread's) after its name, so that [0] is the state,
    [2] the process group, [7] minor faults, [11] utime, [12] stime; None once the task is gone."""
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def read_stat(path: str) -> tuple[int, int] | None:
    """(process group, CPU ticks: utime + stime) of one /proc stat file; None once the task is gone."""
    fields = stat_fields(path)
    return None if fields is None else (int(fields[2]), int(fields[11]) + int(fields[12]))


def group_cpu_s(pgids: list[int]) -> float:
    """CPU seconds used so far by the live members of these process groups (Linux /proc; NaN elsewhere)."""
    total, wanted = 0, set(pgids)
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return float("nan")
    for pid in pids:
        stat = read_stat(f"/proc/{pid}/stat")
        if stat is not None and stat[0] in wanted:
            total += stat[1]
    return total / os.sysconf("SC_CLK_TCK")


def group_rss_bytes(pgids: list[int]) -> dict[int, int]:
    """Resident memory (RSS) of each process group, summed over its live members (Linux /proc; {} elsewhere)."""
    totals, page = dict.fromkeys(pgids, 0), os.sysconf("SC_PAGE_SIZE")
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pgrp = int(f.read().rsplit(")", 1)[1].split()[2])
            if pgrp in totals:
                with open(f"/proc/{pid}/statm") as f:
                    totals[pgrp] += int(f.read().split()[1]) * page  # the second field is resident pages
        except OSError:
            continue  # exited meanwhile
    return totals


def rss_by_mapping_mb(pid: int) -> dict[str, float]:
    """One process's resident memory by kind of mapping (Linux /proc/PID/smaps; {} elsewhere or once it exited):
    glibc's main heap, anonymous mappings (other allocators, thread stacks, pinned host memory), device mappings
    (/dev/...: a GPU driver's), files, and the kernel's named ones ([stack], [vdso], ...). Says where a growth is."""
    out = {"heap": 0.0, "anonymous": 0.0, "device": 0.0, "file": 0.0, "other": 0.0}
    kind = "other"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(maxsplit=1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's header: range perms offset dev inode [path]
                    parts = line.split(maxsplit=5)
                    path = parts[5].strip() if len(parts) > 5 else ""
                    kind = ("heap" if path == "[heap]" else "anonymous" if not path else "device"
                            if path.startswith("/dev/") else "other" if path.startswith("[") else "file")
                elif first == "Rss:":
                    out[kind] += int(line.split()[1]) / 1024
    except OSError:
        return {}
    return {k: round(v, 1) for k, v in out.items()}


def stop_all(procs: list[Proc]) -> None:
    """Stops in reverse start order (frontend before backend); every one even if another fails.

    SIGINT/SIGTERM are ignored meanwhile, so a second Ctrl-C cannot leave children behind.
    """
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for p in reversed(procs):
            try:
                p.stop()
            except Exception as e:  # keep stopping the rest; the error is shown, not hidden
                print(f"bench: stopping {p.name} failed: {e!r}", file=sys.stderr)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def gpu_processes() -> list[str]:
    """`pid, name, memory` of every process of this machine's that holds a CUDA context ([] where there is no
    nvidia-smi). Processes outside this PID namespace (another container on a shared host) are not ours to
    wait for: nvidia-smi names them by host PIDs that /proc here does not have."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return [row for row in rows if os.path.exists(f"/proc/{row.split(',', 1)[0].strip()}")]


def wait_gpus_free(timeout_s: float, poll_s: float = 2.0) -> tuple[float, list[str]]:
    """Waits until no process holds a GPU (what the previous step left exiting would share the device with the
    system under test). Returns the seconds waited and the processes still there at the timeout."""
    started = time.monotonic()
    while (held := gpu_processes()) and time.monotonic() - started < timeout_s:
        time.sleep(poll_s)
    return time.monotonic() - started, held
