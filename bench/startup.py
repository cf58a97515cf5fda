"""Backend start time, first (cold caches) and later starts (warm caches), with where the time goes.

Starts the backend and a frontend N times on one model and measures the seconds until the frontend's
/health answers 200 (the backend admits frontends once the engine and its processor are ready). The first
start gets empty compile caches (vLLM's torch.compile cache, inductor's and Triton's, all under a fresh
directory unless --cache-dir names one), so it is a node's very first start; the later ones find what the
first wrote, as a restarted node does with the compose file's cache volume. Each start's log is read for the
phases vLLM and the backend log with a duration or a readiness mark, printed with their offset from the
spawn, so a slow start shows its phase.

    python -m bench.startup --shape qwen3-0.6b --runs 2                     (GPU)
    python -m bench.startup --runs 2                                        (CPU, tiny)
    python -m bench.startup --shape tiny-moe --backend-arg=--enforce-eager  (a variant's flags)
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from datetime import datetime
from pathlib import Path

from backend.tools.modelgen import QUANTS, SHAPES, ensure_model
from bench.procs import Proc, free_port, raise_on_signals, stop_all, wait_http_ok

# Log lines that mark a start phase: vLLM's own timing lines and the backend's readiness events.
PHASE = re.compile(r"took|takes|finished in|time: |Compiling|Directly load|load failure|saved AOT|Capturing"
                   r"|Starting to load|engine_ready|processor_ready|engine_starting|backend_socket_bound"
                   r"|backend_serving|frontend_connected")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z?")  # ours: ISO, UTC
# vLLM's own format where its loggers are not routed through ours: "INFO 11-25 20:35:28 [<file>.py:<line>]", local time
VLLM_STAMP = re.compile(r"^(?:\(\w+[^)]*\) )?(?:DEBUG|INFO|WARNING|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d) ")


def _stamp(line: str, year: int) -> tuple[float, int] | None:
    """(epoch seconds, end of the stamp) of a log line in either format; None if it has none."""
    if m := STAMP.match(line):
        return datetime.fromisoformat(m.group(1) + "+00:00").timestamp(), m.end()
    if m := VLLM_STAMP.match(line):
        return datetime.strptime(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S").timestamp(), m.end()
    return None


def cache_env(root: Path) -> dict[str, str]:
    """The compile caches a restart can reuse (the compose file keeps these in a volume)."""
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TRITON_CACHE_DIR": str(root / "triton")}


def phases(log: Path, spawned_at: float) -> list[tuple[float, str]]:
    """(seconds after the spawn, line) for each phase line of a start's log (vLLM's stamps have whole seconds)."""
    out, year = [], datetime.now().year
    for line in log.read_text(errors="replace").splitlines():
        stamp = _stamp(line, year) if PHASE.search(line) else None
        if stamp is not None:
            out.append((stamp[0] - spawned_at, line[stamp[1]:].strip()[:220]))
    return out


def one_start(args: argparse.Namespace, model_dir: Path, env: dict[str, str], log_dir: Path, i: int) -> dict:
    port = free_port()
    address = f"ipc://{log_dir}/backend-{i}.ipc"
    backend = Proc("backend", ["-m", "backend", "--model", str(model_dir), "--address", address,
                               "--generate-model", "none", "--log-level", "info",
                               "--state-dir", str(log_dir / f"state-{i}"), *args.backend_arg],
                   log_dir / f"backend-{i}.log", env=env)
    frontend = Proc("frontend", ["-m", "frontend", "--backend-address", address, "--port", str(port),
                                 "--log-level", "warning"], log_dir / f"frontend-{i}.log")
    procs: list[Proc] = []
    spawned_at = time.time()
    try:
        procs = [backend.start(), frontend.start()]
        ready_s = wait_http_ok(f"http://127.0.0.1:{port}/health", procs, args.timeout_s)
    finally:
        stop_all(procs)
    return {"ready_s": ready_s, "phases": phases(backend.log_path, spawned_at), "log": str(backend.log_path)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--quant", default=None, choices=QUANTS)
    p.add_argument("--model-dir", default="")
    p.add_argument("--runs", type=int, default=2, help="starts in a row; the first one with empty caches")
    p.add_argument("--cache-dir", default="", help="compile caches to use (default: a fresh empty directory)")
    p.add_argument("--backend-arg", action="append", default=[], help="extra backend flag (repeatable)")
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    raise_on_signals()
    model_dir = Path(args.model_dir or f"models/{args.shape}")
    ensure_model(model_dir, args.shape, num_layers=args.num_layers, quant=args.quant)
    log_dir = Path(tempfile.mkdtemp(prefix="pocserve-startup-"))
    cache = Path(args.cache_dir) if args.cache_dir else log_dir / "cache"
    env = cache_env(cache)
    print(f"model {model_dir}  caches {cache}  logs {log_dir}  backend flags {args.backend_arg}", flush=True)
    rows = []
    for i in range(args.runs):
        row = one_start(args, model_dir, env, log_dir, i)
        rows.append(row)
        print(f"start {i + 1} ({'cold' if i == 0 and not args.cache_dir else 'warm'} caches): "
              f"ready after {row['ready_s']:.1f} s", flush=True)
        for at, line in row["phases"]:
            print(f"   {at:7.1f} s  {line}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": args.shape, "quant": args.quant,
                                               "backend_args": args.backend_arg, "starts": rows}, indent=1))


if __name__ == "__main__":
    main()
