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

The leak the chat path was found to carry (vLLM's stable-ABI KV-cache write keeps a copy of its `str` argument on
every call outside a CUDA graph, docs/reliability.md section 4) predicts its own slope: the engine's steps and PoC
forwards per minute (the heap profile logs both) × attention layers × the bytes per call its start-up check measured
(`kv_write_leaks` / `kv_write_leak_check` in the log). Each variant says which of its work makes that call
(`Variant.eager_writes`); `kv_write_predicted_mb_per_min` against the measured slope tells whether anything else
grows, and the `chat-triton-attn` control (Triton's KV-cache write, no stable-ABI op) should then stay flat. Where
some steps replay a full CUDA graph (`chat-compiled`) the prediction is only an upper bound.
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
from typing import NamedTuple

from bench.soak import slope_per_min


class Variant(NamedTuple):
    env: dict[str, str]
    flags: list[str]  # bench.soak's
    # The work that runs vLLM's stable-ABI KV-cache write outside a CUDA graph, once per attention layer each:
    # "steps" (chat's, eager: bench.soak's backend runs --enforce-eager) and "forwards" (PoC's without their graphs).
    eager_writes: tuple[str, ...]
    # Only some of those steps do (the others replay a full CUDA graph): the prediction is an upper bound.
    bound: bool = False


# "mixed" is the soak as docs/reliability.md ran it.
VARIANTS: dict[str, Variant] = {
    "mixed": Variant({}, [], ("steps",)),
    "chat": Variant({}, ["--no-poc"], ("steps",)),
    "poc": Variant({}, ["--concurrency", "0"], ()),
    "mixed-no-poc-graphs": Variant({"POCSERVE_POC_GRAPHS": "0"}, [], ("steps", "forwards")),
    "poc-no-graphs": Variant({"POCSERVE_POC_GRAPHS": "0"}, ["--concurrency", "0"], ("forwards",)),
    "chat-compiled": Variant({}, ["--no-poc", "--backend-arg=--no-enforce-eager"], ("steps",), bound=True),
    # The control: vLLM's Triton attention writes the KV cache with a Triton kernel, not the stable-ABI op.
    "chat-triton-attn": Variant({}, ["--no-poc", "--backend-arg=--attention-backend=TRITON_ATTN"], ()),
}

_PAIR = re.compile(r"(\w+)=(-?[0-9.]+)(?=\s|$)")
# The heap profile's work counters (backend/core/loop.py work_counts) by the name Variant.eager_writes uses.
_COUNTERS = {"steps": "engine_steps", "forwards": "poc_forwards"}
# The start-up check's line (backend/engine/leak_check.py): bytes_per_call=48.02, or a list of readings.
_LEAK_CHECK = re.compile(r" kv_write_leak(?:s|_check) .*?bytes_per_call=\[?(-?[0-9.]+)")


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


def kv_write_bytes_per_call(log_text: str) -> float | None:
    """Host bytes per call of the KV-cache write, as the engine's start-up check measured them; None if unlogged."""
    found = _LEAK_CHECK.search(log_text)
    return float(found.group(1)) if found else None


def kv_write_prediction(variant: Variant, profiles: list[tuple[float, dict[str, float]]], layers: int,
                        bytes_per_call: float | None) -> dict:
    """The slope the KV-cache write's leak alone would give this variant: its eager work per minute (steps,
    forwards: slopes of the profiles' counters, after the first third as the heap's) × layers × bytes per call."""
    rates: dict[str, float | None] = {}
    for work, key in _COUNTERS.items():
        rate = slope_per_min([(t, f[key]) for t, f in profiles if key in f])
        rates[work] = None if rate is None else round(rate, 1)
    eager = [rates[w] for w in variant.eager_writes]
    predicted = None
    if bytes_per_call is not None and None not in eager:
        predicted = round(sum(r for r in eager if r is not None) * layers * bytes_per_call / 2**20, 2)
    return {**{f"{w}_per_min": r for w, r in rates.items()}, "kv_write_bytes_per_call": bytes_per_call,
            "kv_write_eager": list(variant.eager_writes), "kv_write_prediction_is_bound": variant.bound,
            "kv_write_predicted_mb_per_min": predicted}


def attention_layers(model_dir: Path) -> int:
    """Decoder layers of the model's config (every layer attends in the shapes the soak runs)."""
    return int(json.loads((model_dir / "config.json").read_text())["num_hidden_layers"])


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
    variant = VARIANTS[name]
    work = root / name
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.soak", "--shape", args.shape, "--model-dir", str(args.model_dir),
           "--seconds", str(args.seconds), "--work-dir", str(work / "work"), "--json", str(work / "soak.json"),
           *variant.flags, *(f"--backend-arg={a}" for a in args.backend_arg)]
    env = {**os.environ, "POCSERVE_HEAP_PROFILE_S": str(args.profile_s), **variant.env}
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
    layers = attention_layers(args.model_dir)
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
        log_text = (args.out / n / "work" / "backend.log").read_text(errors="replace")
        profiles = heap_profiles(log_text)
        row = summarize(n, report, profiles)
        row.update(kv_write_prediction(VARIANTS[n], profiles, layers, kv_write_bytes_per_call(log_text)))
        rows.append(row)
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
