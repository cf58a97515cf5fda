"""common/process.py: the title, the parent-death signal, the frozen start-up heap, the exit-2 refusal."""

from __future__ import annotations

import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

from common.process import REFUSED, die_with_parent_hook, refuse, set_title

# Prints the child's parent-death signal (PR_GET_PDEATHSIG = 2), after an optional set-up statement.
READ_PDEATHSIG = """
import ctypes, sys
{setup}
value = ctypes.c_int(-1)
ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(value))
print(value.value)
"""
REPO = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _pdeathsig(setup: str = "", **popen) -> int:
    done = subprocess.run([sys.executable, "-c", READ_PDEATHSIG.format(setup=setup)], capture_output=True,
                          text=True, timeout=30, check=True, cwd=REPO, **popen)
    return int(done.stdout)


def test_refuse_prints_one_line_and_gives_exit_status_2(capsys):
    assert refuse("pocserve-frontend", ValueError("--port: not a number")) == REFUSED == 2
    captured = capsys.readouterr()
    assert captured.err == "pocserve-frontend: --port: not a number\n" and captured.out == ""


def test_set_title_uses_setproctitle(monkeypatch):
    titles: list[str] = []
    monkeypatch.setitem(sys.modules, "setproctitle", types.SimpleNamespace(setproctitle=titles.append))
    set_title("pocserve-backend")
    assert titles == ["pocserve-backend"]


def test_set_title_without_setproctitle_is_a_no_op(monkeypatch):
    monkeypatch.setitem(sys.modules, "setproctitle", None)  # makes `import setproctitle` raise ImportError
    set_title("pocserve-backend")


@linux_only
def test_die_with_parent_sets_sigterm_as_the_parent_death_signal():
    assert _pdeathsig() == 0  # nothing by default
    assert _pdeathsig("from common.process import die_with_parent; die_with_parent()") == signal.SIGTERM


@linux_only
def test_die_with_parent_hook_sets_it_in_a_subprocess_child():
    hook = die_with_parent_hook()
    assert hook is not None
    assert _pdeathsig(preexec_fn=hook) == signal.SIGTERM


# In a child: freezing the test process's heap would hide the rest of the suite's objects from its collector.
FREEZE = """
import gc
from common.process import freeze_startup_heap
startup = [[i] for i in range(100_000)]  # what a start-up leaves: tracked containers that live on
frozen = freeze_startup_heap()
later = [[i] for i in range(10)]
tracked = {id(o) for o in gc.get_objects()}
print(frozen >= len(startup), id(startup[0]) in tracked, id(later[0]) in tracked, len(tracked) < 50_000)
"""


def test_freeze_startup_heap_hides_what_start_up_left_from_every_later_collection():
    out = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2], check=True).stdout
    # Frozen: start-up's objects are walked by no collection (a full one walked ~700k in the engine process);
    # what is allocated later still is.
    assert out.split() == ["True", "False", "True", "True"]
