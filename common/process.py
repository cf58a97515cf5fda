"""Set-up every pocserve process does the same way: its title, dying with its parent, refusing bad input.

- `set_title`: the name `ps` and `top` show (pocserve-backend, pocserve-processor, ...), so an operator tells the
  processes of a node apart; setproctitle is optional, without it the title stays the interpreter's.
- `die_with_parent` / `die_with_parent_hook`: Linux's parent-death signal (PR_SET_PDEATHSIG), so a child whose
  parent was killed outright (SIGKILL runs none of the parent's cleanup) does not outlive it. Elsewhere both are
  no-ops: the parents still stop their children on every exit path they control.
- `freeze_startup_heap`: once a process is ready, what its start-up allocated (vLLM's modules and configs, the
  tokenizer, FastAPI's routes) moves out of the garbage collector's sight, as vLLM does for its own engine core and
  API server (vllm/utils/gc_utils.py `freeze_gc_heap`). Unfrozen, every full collection walked it all: the engine
  process's took 586-598 ms beside a busy loop on 2 cores, and a request of many messages triggers one, so every
  stream stalled that long (docs/reliability.md, section 8).
- `refuse`: bad input found at start is one line on stderr, "prog: what is wrong", and exit status 2, which the
  ML node's supervisor and ours read as "do not restart, fix the command line".
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
from collections.abc import Callable

# The exit status of a refusal: argparse's for a usage error, and what the supervisors must not restart on.
REFUSED = 2

# <linux/prctl.h>
PR_SET_PDEATHSIG = 1


def set_title(title: str) -> None:
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, or None where there is none (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent() -> None:
    """SIGTERM to this process when its parent dies, however it dies."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def die_with_parent_hook() -> Callable[[], None] | None:
    """A subprocess preexec_fn doing `die_with_parent` in the child; None where there is no prctl."""
    prctl = _prctl()  # looked up here: between fork and exec the child should only make the call
    if prctl is None:
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)

    return hook


def freeze_startup_heap() -> int:
    """Collects once, then freezes every object tracked so far; the number frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def refuse(prog: str, error: object) -> int:
    """Prints "prog: error" on stderr; returns the refusal's exit status for the caller to exit with."""
    print(f"{prog}: {error}", file=sys.stderr)
    return REFUSED
