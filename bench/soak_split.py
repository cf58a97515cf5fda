"""Which traffic grows the engine's heap: bench.soak in variants run side by side, each with its own stack.

    python -m bench.soak_split --shape qwen3-0.6b --model-dir models/qwen3-0.6b --seconds 360 \\
        --backend-arg=--gpu-memory-utilization=0.12 --backend-arg=--kv-cache-memory-bytes=2G --out /tmp/split

The 10-minute GPU soak grew the engine's glibc heap by ~5 MB/min in live native memory with no Python site behind
it (docs/reliability.md, section 4); the CPU engine's heap is flat. Each variant here turns one suspect on or off
(chat alone, PoC alone, PoC without its CUDA graphs, chat compiled with CUDA graphs as a node runs it) and logs
the engine's `heap_profile` (backend/core/heap_profile.py, POCSERVE_HEAP_PROFILE_S). All run at once, so one device
call answers for all; they share the GPU and the host, which slows each but does not change what a request or a
forward allocates. Reported per variant: glibc's in-use bytes and RSS, their slopes after the first third of the
load (MB/min), and that growth per thousand chats and per thousand nonces, where the variant served them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from bench.soak import slope_per_min

# name → (environment, bench.soak flags); "mixed" is the soak as docs/reliability.md ran it.
VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "mixed": ({}, []),
    "chat": ({}, ["--no-poc"]),
    "poc": ({}, ["--concurrency", "0"]),
    "mixed-no-poc-graphs": ({"POCSERVE_POC_GRAPHS": "0"}, []),
    "chat-compiled": ({}, ["--no-poc", "--backend-arg=--no-enforce-eager"]),
}

_PAIR = re.compile(r"(\w+)=(-?[0-9.]+)(?=\s|$)")


def heap_profiles(log_text: str) -> list[tuple[float, dict[str, float]]]:
    """(unix time, figures) of every `heap_profile` line of a backend log (console format: an ISO timestamp
    first, then key=value pairs)."""
    out = []
    for line in log_text.splitlines():
        if " heap_profile " not in line:
            continue
        try:
            at = datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
        except (ValueError, IndexError):
            continue
        out.append((at, {k: float(v) for k, v in _PAIR.findall(line)}))
    return out


def summarize(name: str, report: dict, profiles: list[tuple[float, dict[str, float]]]) -> dict:
    """One variant's figures: work done, heap and RSS slopes, growth per thousand chats and nonces."""
    load_min = report["load_s"] / 60
    chats, nonces = report["chat"]["completed"], report["pow"]["nonces_mined"]
    out: dict = {"variant": name, "ok": report["ok"], "problems": report["problems"], "chats": chats,
                 "nonces": nonces, "validations": report["pow"]["validations_submitted"],
                 "profiles": len(profiles)}
    for key in ("malloc_in_use_mb", "malloc_mmapped_mb", "rss_mb"):
        slope = slope_per_min([(t, f[key]) for t, f in profiles if key in f])
        out[f"{key}_per_min"] = None if slope is None else round(slope, 2)
        if slope is not None:
            out[f"{key}_first_last"] = [f[key] for _, f in (profiles[0], profiles[-1])]
            # growth over the load if the slope held throughout, per unit of each kind of work
            for work, n in (("chats", chats), ("nonces", nonces)):
                out[f"{key}_kb_per_1k_{work}"] = round(slope * load_min * 1024 / (n / 1000), 1) if n else None
    return out


def launch(name: str, args: argparse.Namespace, root: Path) -> subprocess.Popen:
    env_extra, flags = VARIANTS[name]
    work = root / name
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.soak", "--shape", args.shape, "--model-dir", str(args.model_dir),
           "--seconds", str(args.seconds), "--work-dir", str(work / "work"), "--json", str(work / "soak.json"),
           *flags, *(f"--backend-arg={a}" for a in args.backend_arg)]
    env = {**os.environ, "POCSERVE_HEAP_PROFILE_S": str(args.profile_s), **env_extra}
    if args.memray:
        env["POCSERVE_MEMRAY"] = f"{args.memray}:{work / 'engine.memray'}"
    log = open(work / "soak.txt", "w")  # noqa: SIM115 - the child writes it until it exits
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--seconds", type=float, default=360.0)
    p.add_argument("--profile-s", type=float, default=30.0, help="POCSERVE_HEAP_PROFILE_S of each backend")
    p.add_argument("--shape", default="tiny")
    p.add_argument("--model-dir", type=Path, default=Path("models/tiny-qwen3"))
    p.add_argument("--backend-arg", action="append", default=[], metavar="ARG", help="to every variant's backend")
    p.add_argument("--memray", metavar="START_S:STOP_S",
                   help="each engine's memray window (POCSERVE_MEMRAY), then bench.heap_leaks of it in leaks.txt")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    from backend.tools.modelgen import ensure_model
    ensure_model(args.model_dir, args.shape)  # once, before the soaks would each generate it into one directory
    started = time.monotonic()
    procs = {n: launch(n, args, args.out) for n in names}
    codes = {n: proc.wait() for n, proc in procs.items()}
    rows = []
    for n in names:
        report_path = args.out / n / "soak.json"
        if not report_path.exists():
            rows.append({"variant": n, "ok": False, "problems": [f"bench.soak exited {codes[n]} with no report"]})
            continue
        report = json.loads(report_path.read_text())
        log_path = args.out / n / "work" / "backend.log"
        rows.append(summarize(n, report, heap_profiles(log_path.read_text(errors="replace"))))
    for n in names:
        if (args.out / n / "engine.memray").exists():
            with open(args.out / n / "leaks.txt", "w") as f:
                subprocess.run([sys.executable, "-m", "bench.heap_leaks", str(args.out / n / "engine.memray"),
                                "--json", str(args.out / n / "leaks.json")], stdout=f, stderr=subprocess.STDOUT)
    result = {"seconds": args.seconds, "wall_s": round(time.monotonic() - started, 1), "variants": rows}
    (args.out / "split.json").write_text(json.dumps(result, indent=1))
    for r in rows:
        print(json.dumps(r))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
