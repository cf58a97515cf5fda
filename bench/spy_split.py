"""Where each thread's samples go in py-spy's raw output: per thread, the functions its samples are in (each
counted once per sample, callers included) and the leaf functions, as shares of that thread's samples.

Reads what `py-spy record --threads -f raw` writes (with or without `--subprocesses`, `--idle`, `--gil`): one line
per distinct stack, `[process PID:"CMD";]thread (TID): NAME;func (file:line);...;func (file:line) COUNT`; a
subprocess's stacks start with its parents' `process` frames, and the thread is the last process's. With
`--native --idle`, also each thread's share of samples waiting for the GIL, by the Python function it waits in.
Written for issue 43's question, where an engine process spends a decode step's host time that `vllm serve`'s does
not: `scripts/gpu_check.sh bench-serving-rounds` with SPY_S samples both servers and runs this on each file.

    python -m bench.spy_split spy-ours.txt spy-vllm.txt [--top 15] [--min-samples 50]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_THREAD = re.compile(r"thread \((?:0x)?[0-9a-fA-F]+\)(?::\s*(.*))?$")
_FRAME = re.compile(r"^(.*?) \((.*):\d+\)$")


@dataclass
class Thread:
    name: str
    samples: int = 0
    inclusive: Counter = field(default_factory=Counter)
    leaf: Counter = field(default_factory=Counter)
    # Samples where the thread waits for the GIL (native stacks only), by the Python function it waits in.
    gil_waits: Counter = field(default_factory=Counter)


def function(frame: str) -> str:
    """A frame as its function and its file's name, without the directory and the line: one entry per function,
    whatever line it was on."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    return f"{match.group(1)} ({Path(match.group(2)).name})"


# Where CPython takes the GIL back (exported names; take_gil itself is static and often unwound as its caller).
_GIL_TAKERS = ("take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread", "PyGILState_Ensure")
# Callers whose `pthread_cond_timedwait` is take_gil's, inlined: the interpreter, a Cython or C extension module
# coming back from a call that released the GIL, torch's Python bindings (pybind11's GIL guards).
_GIL_CALLERS = ("libpython", "(python3", ".cpython-", ".abi3.so", "libtorch_python", "gil")


def _is_python(frame: str) -> bool:
    return ".py:" in frame or "<frozen " in frame


def gil_wait(frames: list[str]) -> bool:
    """Whether a `--native` stack waits for the GIL: below its last Python frame, one of CPython's GIL takers, or a
    `pthread_cond_timedwait` called from the interpreter, an extension module or torch's bindings, and not by a
    Python lock's wait (PyThread_acquire_lock). A wait called from the CUDA driver or a C++ library's own condition
    variable is not the GIL's. Without native frames (py-spy's default) nothing counts."""
    last = max((i for i, f in enumerate(frames) if _is_python(f)), default=-1)
    native = [f.strip() for f in frames[last + 1:]]
    if any(f.startswith(_GIL_TAKERS) for f in native):
        return True
    waits = [i for i, f in enumerate(native) if f.startswith("pthread_cond_timedwait")]
    if not waits:
        return False
    caller = native[waits[0] - 1] if waits[0] > 0 else ""  # right under a Python frame: the interpreter's own
    return "acquire_lock" not in caller and (not caller or any(c in caller for c in _GIL_CALLERS))


def parse(text: str) -> dict[str, Thread]:
    """Threads by `process/thread name` (process only where the file has several)."""
    threads: dict[str, Thread] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        process = ""
        while parts and parts[0].startswith("process "):  # the innermost process owns the thread
            process = parts.pop(0).split(":", 1)[0].removeprefix("process ")
        match = _THREAD.match(parts[0].strip()) if parts else None
        if match is None:
            continue
        key = f"{process}/{match.group(1) or parts[0].strip()}" if process else (match.group(1) or parts[0].strip())
        thread = threads.setdefault(key, Thread(key))
        frames = [function(f) for f in parts[1:]]
        thread.samples += int(count)
        for name in dict.fromkeys(frames):  # once per sample, in stack order (ties list the caller first)
            thread.inclusive[name] += int(count)
        if frames:
            thread.leaf[frames[-1]] += int(count)
        if gil_wait(parts[1:]):
            waiting_in = next((function(f) for f in reversed(parts[1:]) if _is_python(f)), "(native)")
            thread.gil_waits[waiting_in] += int(count)
    return threads


def report(path: Path, top: int, min_samples: int) -> list[str]:
    threads = sorted(parse(path.read_text(errors="replace")).values(), key=lambda t: -t.samples)
    lines = [f"== {path}: {sum(t.samples for t in threads)} samples in {len(threads)} threads"]
    for t in threads:
        if t.samples < min_samples:
            continue
        lines.append(f"-- {t.name}: {t.samples} samples")
        lines.append("   in (callers included):")
        lines += [f"   {n / t.samples:7.1%}  {name}" for name, n in t.inclusive.most_common(top)]
        lines.append("   leaf:")
        lines += [f"   {n / t.samples:7.1%}  {name}" for name, n in t.leaf.most_common(top)]
        if waits := sum(t.gil_waits.values()):
            lines.append(f"   waiting for the GIL: {waits / t.samples:.1%} of the samples, in:")
            lines += [f"   {n / t.samples:7.1%}  {name}" for name, n in t.gil_waits.most_common(top)]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=15, help="functions listed per thread and kind")
    p.add_argument("--min-samples", type=int, default=50, help="threads with fewer samples are left out")
    args = p.parse_args()
    for path in args.files:
        print("\n".join(report(path, args.top, args.min_samples)))


if __name__ == "__main__":
    main()
