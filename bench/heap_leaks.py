"""The allocations a memray window left live, by stack: what grew a process's native heap.

    python -m bench.heap_leaks /tmp/engine.memray [--top 25] [--frames 18]

Reads the aggregated file that POCSERVE_MEMRAY writes (backend/core/heap_profile.py): memray's per-stack count and
bytes of the allocations made inside the window and still live at its end. Opened after the warm-up, that is the
growth, plus whatever was in flight at the window's end. Each stack is printed Python and native frames together,
innermost first, without the allocator's own frames (malloc, Python's object allocator), which say nothing of
who asked; stacks are grouped by the frames printed. Run it on the machine that wrote the file: memray resolves
native frames from the libraries' symbols there.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

# Frames that only pass an allocation through: the allocator's own, and the interpreter's call machinery.
_PASS_THROUGH = (
    "_PyObject_Malloc", "_PyObject_Calloc", "_PyObject_Realloc", "PyObject_Malloc", "PyObject_Calloc",
    "PyObject_Realloc", "PyMem_Malloc", "PyMem_Calloc", "PyMem_Realloc", "PyMem_RawMalloc", "PyMem_RawCalloc",
    "PyMem_RawRealloc", "_PyMem_RawMalloc", "_PyMem_RawCalloc", "_PyMem_RawRealloc", "_PyObject_MakeTpCall",
    "_PyObject_VectorcallTstate", "PyObject_Vectorcall", "_PyEval_EvalFrameDefault", "_PyEval_Vector",
    "_PyFunction_Vectorcall", "cfunction_vectorcall_O", "cfunction_vectorcall_FASTCALL",
    "cfunction_vectorcall_FASTCALL_KEYWORDS", "method_vectorcall_O", "method_vectorcall_FASTCALL",
    "method_vectorcall_FASTCALL_KEYWORDS", "method_vectorcall_NOARGS", "_PyObject_Call", "PyObject_Call",
    "trace_call_function", "type_call", "malloc", "calloc", "realloc", "operator new", "operator new[]",
    "posix_memalign", "aligned_alloc", "memalign",
)


def frame_text(frame: tuple) -> str:
    function, filename, line = frame
    if len(function) > 120:  # a C++ signature spelled out with its templates
        function = function[:117] + "..."
    where = filename.rsplit("/site-packages/", 1)[-1]
    return f"{function} ({where}:{line})"


def stack_key(frames: list[tuple], depth: int) -> tuple[str, ...]:
    """The first `depth` frames that are not pass-through, as text: what a stack is grouped by."""
    out = []
    for frame in frames:
        if str(frame[0]).split("(")[0].strip() in _PASS_THROUGH:
            continue
        out.append(frame_text(frame))
        if len(out) == depth:
            break
    return tuple(out)


def group(records, depth: int) -> list[dict]:
    """Live allocations grouped by stack_key, largest first: bytes, count, allocators, frames."""
    import memray

    sites: dict[tuple[str, ...], dict] = defaultdict(lambda: {"bytes": 0, "count": 0, "allocators": set()})
    for record in records:
        try:
            frames = list(record.hybrid_stack_trace(max_stacks=depth * 4))
        except NotImplementedError:  # recorded without native traces
            frames = list(record.stack_trace(max_stacks=depth * 4))
        site = sites[stack_key(frames, depth)]
        site["bytes"] += record.size
        site["count"] += record.n_allocations
        site["allocators"].add(memray.AllocatorType(record.allocator).name)
    rows = [{"bytes": v["bytes"], "count": v["count"], "allocators": sorted(v["allocators"]), "frames": list(k)}
            for k, v in sites.items()]
    return sorted(rows, key=lambda r: -r["bytes"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--top", type=int, default=25, help="stacks printed")
    p.add_argument("--frames", type=int, default=18, help="frames per stack, past the allocator's own")
    p.add_argument("--json", help="every group, to this file")
    args = p.parse_args(argv)
    import memray

    reader = memray.FileReader(args.path)
    meta = reader.metadata
    rows = group(reader.get_leaked_allocation_records(merge_threads=True), args.frames)
    total, count = sum(r["bytes"] for r in rows), sum(r["count"] for r in rows)
    print(f"{args.path}: pid {meta.pid}, {meta.command_line[:120]}")
    print(f"window {meta.start_time:%H:%M:%S} -> {meta.end_time:%H:%M:%S}; live at its end: "
          f"{total / 2**20:.2f} MB in {count} allocations, {len(rows)} stacks")
    for r in rows[:args.top]:
        print(f"\n{r['bytes'] / 2**20:9.3f} MB  {r['count']:8d} allocs  {r['bytes'] / max(r['count'], 1):9.0f} B each"
              f"  {','.join(r['allocators'])}")
        for f in r["frames"]:
            print(f"      {f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"total_bytes": total, "count": count, "stacks": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
