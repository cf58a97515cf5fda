"""Runs one instance's backend and frontend and stops them the way the ML node expects.

- Each child leads a process group of its own, so the ML node's SIGINT to *our* group reaches only us, and each
  child gets exactly one SIGTERM from us (a second signal would make uvicorn skip its graceful shutdown). Each
  child also dies with us (PR_SET_PDEATHSIG) should we be killed outright.
- SIGINT or SIGTERM: both children get SIGTERM at once; whatever still runs after `stop_timeout_s` (inside the
  ML node's 20 s) is killed, and so is anything left in their process groups (the processor process, vLLM
  workers), so nothing outlives us. Exit 0 when both stopped by themselves.
- A child that exits on its own (a dead engine, a port taken after all) takes the instance down: the other is
  stopped and we exit non-zero, so the ML node's restart logic sees it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from common.process import die_with_parent_hook

log = structlog.get_logger("pocserve.supervisor")

_POLL_S = 0.05
# Members left in a child's process group after it exited get this long to go by themselves.
_GROUP_GRACE_S = 2.0
# Exit statuses of a child that stopped as asked: uvicorn re-raises the SIGTERM it handled once it has shut down.
_CLEAN_EXITS = (0, -signal.SIGTERM)


@dataclass(frozen=True)
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]


class Supervisor:
    def __init__(self, children: Sequence[Child], stop_timeout_s: float) -> None:
        self.specs = tuple(children)
        self.stop_timeout_s = stop_timeout_s
        self.children: dict[str, subprocess.Popen] = {}
        self.num_signals = 0
        self._signal_name = ""

    def run(self, **log_fields: object) -> int:
        """Starts the children, then waits for a signal or for one of them to exit; returns our exit status."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            hook = die_with_parent_hook()
            for spec in self.specs:
                self.children[spec.name] = subprocess.Popen(spec.argv, env=spec.env, start_new_session=True,
                                                            preexec_fn=hook)
            log.info("instance_started", **log_fields, **{f"{n}_pid": c.pid for n, c in self.children.items()})
            return self._watch()
        finally:
            if any(c.poll() is None for c in self.children.values()):  # only on an exception of our own
                self.stop("supervisor error")
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _watch(self) -> int:
        while True:
            if self.num_signals:
                return self.stop(f"signal {self._signal_name}")
            for name, child in self.children.items():
                code = child.poll()
                if code is not None:
                    log.error("process_exited", process=name, exit_code=code)
                    self.stop(f"{name} exited")
                    return code if code > 0 else 1
            time.sleep(_POLL_S)

    def _on_signal(self, signum: int, _frame) -> None:
        self.num_signals += 1
        self._signal_name = signal.Signals(signum).name

    def stop(self, reason: str) -> int:
        """Stops every child; 0 when each one stopped by itself within the timeout."""
        started = time.monotonic()
        log.info("instance_stopping", reason=reason, timeout_s=self.stop_timeout_s)
        for child in self.children.values():
            if child.poll() is None:
                child.terminate()
        deadline = started + self.stop_timeout_s
        while any(c.poll() is None for c in self.children.values()) and time.monotonic() < deadline:
            if self.num_signals >= 2:  # asked twice (Ctrl-C again): no more waiting
                log.warning("stop_hurried", signals=self.num_signals)
                break
            time.sleep(_POLL_S)
        is_clean = True
        for name, child in self.children.items():
            if child.poll() is None:
                log.error("process_killed", process=name, pid=child.pid, after_s=round(self.stop_timeout_s, 1))
                _signal_group(child.pid, signal.SIGKILL)
                child.wait()
                is_clean = False
            elif child.returncode not in _CLEAN_EXITS:
                is_clean = False
            log.info("process_stopped", process=name, exit_code=child.returncode)
        for child in self.children.values():
            _reap_group(child.pid)
        log.info("instance_stopped", elapsed_s=round(time.monotonic() - started, 2), is_clean=is_clean)
        return 0 if is_clean else 1


def _signal_group(pgid: int, sig: int) -> bool:
    """Signals a process group; False when it has no member left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id was reused by someone else's group: not ours to touch
        return False
    return True


def _group_members(pgid: int) -> list[str]:
    """`pid name` of each live process in the group (zombies left to a parent that does not reap them are not
    running anything). Linux reads /proc; elsewhere a non-empty group is one unnamed member."""
    if not Path("/proc/self/stat").exists():
        return ["?"] if _signal_group(pgid, 0) else []
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            text = stat.read_text()
            name, fields = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                if int(stat.parent.name) == pgid:
                    # A live leader: our child is dead and reaped, so its pid, and with it the group id, went
                    # to a new process that started a session of its own. Not ours to touch.
                    return []
                members.append(f"{stat.parent.name} {name}")
    return members


def _reap_group(pgid: int) -> None:
    """Whatever a child left in its process group. A child that exited cleanly stopped its own processes, and
    helpers such as multiprocessing's resource tracker (which ignores SIGINT and SIGTERM) exit once their
    parent is gone: they get a grace period, then SIGKILL, and we wait (briefly) until they are gone."""
    deadline = time.monotonic() + _GROUP_GRACE_S
    while members := _group_members(pgid):
        if time.monotonic() >= deadline:
            log.warning("process_group_killed", pgid=pgid, members=members)
            _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + _GROUP_GRACE_S
            while _group_members(pgid) and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            return
        time.sleep(_POLL_S)
