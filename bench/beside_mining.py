"""What runs beside a mining round: validation jobs (any mode) and streaming chat (shared mode).

    python -m bench.beside_mining                      (CPU, tiny model: both parts)
    python -m bench.beside_mining --part jobs --shape qwen3-0.6b --seq-len 1024 --batch-size 32     (GPU)
    python -m bench.beside_mining --part chat --shape qwen3-0.6b --seq-len 1024 --batch-size 32 --streams 16 \
        --max-tokens 128                                                                             (GPU)

jobs (exclusive mode): a 4-nonce validation job and a --big-job-nonces compute job, alone and while a round mines
at full rate. Prints the 4-nonce job's latency against two of the round's batches plus its own compute, the big
job's rate against its rate alone, and the round's rate before, during and after the big job.

chat (shared mode, --chat-share): --streams concurrent streaming chats of --max-tokens, idle and during a round.
Prints chat output tok/s, TTFT and TPOT p50/p99, and PoC nonces/s alone and beside chat, counted per forward
(bench.mining.poc_nonces; the round's own count moves a 32-nonce batch at a time, printed beside it).

bursts (shared mode): --bursts bursts of --streams streams sent together to a node whose chat is idle, --burst-gap-s
apart (longer than the loop's linger, so each burst finds chat idle), without a round and during one. Prints TTFT
p50/p99 idle and during mining, PoC nonces/s alone and during the bursts, and whether the artifacts of jobs run
back to back while bursts come and go (their forwards met by a burst midway) are bit-identical to the same job's
alone.

    python -m bench.beside_mining --part bursts                                    (CPU: 4 streams x 64 tokens)
    python -m bench.beside_mining --part bursts --shape qwen3-0.6b --streams 16 --max-tokens 128        (GPU)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.chat_streams import chat_load, stream_chat
from bench.mining import NODE, mark, rates, start_stack
from bench.procs import raise_on_signals, stop_all
from poc.artifacts import vector_l2


def _pow(base: str) -> str:
    return f"{base}/api/v1/pow"


def _processed(base: str) -> int:
    return httpx.get(f"{_pow(base)}/status", timeout=30).json()["stats"]["total_processed"]


def _job(base: str, nonces: list[int], args, **fields) -> tuple[float, dict]:
    """A wait:true /generate; (seconds to the answer, body)."""
    body = {**NODE, "nonces": nonces, "params": {"model": "bench", "seq_len": args.seq_len},
            "batch_size": args.batch_size, "wait": True, **fields}
    started = time.perf_counter()
    r = httpx.post(f"{_pow(base)}/generate", json=body, timeout=3600)
    elapsed = time.perf_counter() - started
    r.raise_for_status()
    answer = r.json()
    assert answer["status"] == "completed", answer
    return elapsed, answer


def _init(base: str, args) -> None:
    body = {**NODE, "params": {"model": "bench", "seq_len": args.seq_len}, "batch_size": args.batch_size}
    httpx.post(f"{_pow(base)}/init/generate", json=body, timeout=60).raise_for_status()


def _stop(base: str) -> None:
    httpx.post(f"{_pow(base)}/stop", timeout=120).raise_for_status()


def _round_rate(base: str, args) -> float:
    since = mark(base, args.seq_len)
    time.sleep(args.seconds)
    return rates(since, mark(base, args.seq_len))[0]


def jobs_part(model_dir: Path, args) -> dict:
    procs, _address, base = start_stack(model_dir, args.work_dir, "exclusive", args,
                                        "--max-queued-nonces", str(max(100_000, 4 * args.big_job_nonces)))
    try:
        four = list(range(4))
        _job(base, four, args)  # warm-up: the first forward of a shape compiles
        small_alone, honest = _job(base, four, args)
        validation = {"validation": {"artifacts": honest["artifacts"]}}
        big = list(range(10_000, 10_000 + args.big_job_nonces))
        big_alone_s, _ = _job(base, big, args)
        batch_s = args.batch_size / _batch_rate(base, args)
        _init(base, args)
        try:
            time.sleep(args.settle_s)
            mining_before = _round_rate(base, args)
            small_s, answer = _job(base, four, args, **validation)
            assert answer["n_mismatch"] == 0, answer
            before = _processed(base)
            big_s, _ = _job(base, big, args)
            mining_during = (_processed(base) - before) / big_s
            mining_after = _round_rate(base, args)
        finally:
            _stop(base)
    finally:
        stop_all(procs)
    figures = {
        "batch_s": batch_s, "small_alone_s": small_alone, "small_beside_round_s": small_s,
        "small_target_s": 2 * batch_s + small_alone, "big_alone_nonces_per_s": len(big) / big_alone_s,
        "big_beside_round_nonces_per_s": len(big) / big_s, "mining_before_nonces_per_s": mining_before,
        "mining_during_big_job_nonces_per_s": mining_during, "mining_after_nonces_per_s": mining_after}
    figures["big_ratio"] = figures["big_beside_round_nonces_per_s"] / figures["big_alone_nonces_per_s"]
    print(f"4-nonce validation: {small_s * 1000:.0f} ms beside the round ({small_alone * 1000:.0f} ms alone; "
          f"target <= 2 batches + its own = {figures['small_target_s'] * 1000:.0f} ms)", flush=True)
    print(f"{len(big)}-nonce job: {figures['big_beside_round_nonces_per_s']:.1f} nonces/s beside the round vs "
          f"{figures['big_alone_nonces_per_s']:.1f} alone: {figures['big_ratio']:.3f} (target >= 0.8)", flush=True)
    print(f"round: {mining_before:.1f} nonces/s before, {mining_during:.1f} during the big job, "
          f"{mining_after:.1f} after", flush=True)
    return figures


def _batch_rate(base: str, args) -> float:
    """Nonces/s of a round alone: a short round's own figure (its batches are the ones a job waits behind)."""
    _init(base, args)
    try:
        time.sleep(args.settle_s)
        return _round_rate(base, args)
    finally:
        _stop(base)


def _greedy(base: str) -> str:
    """A temperature-0 chat's text: the same on an idle engine and beside a round, or chat's numerics moved."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 32,
            "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def _probe_vectors(base: str, args) -> list[str]:
    """One forward's worth of a validation job's artifacts, in nonce order."""
    _, body = _job(base, list(range(10**9, 10**9 + args.batch_size)), args)
    return [a["vector_b64"] for a in sorted(body["artifacts"], key=lambda a: a["nonce"])]


def chat_part(model_dir: Path, args) -> dict:
    procs, _address, base = start_stack(model_dir, args.work_dir, "shared", args,
                                        "--chat-share", str(args.chat_share), *args.backend_arg)
    try:
        args_warm = argparse.Namespace(**{**vars(args), "seconds": 0.0})
        chat_load(base, args_warm)  # warm-up: one request per stream
        greedy_idle, probe_alone = _greedy(base), _probe_vectors(base, args)
        idle_before = chat_load(base, args)
        poc_alone = _batch_rate(base, args)
        _init(base, args)
        try:
            time.sleep(args.settle_s)
            since = mark(base, args.seq_len)
            under_load: dict = {}
            inside: list = []

            def mark_inside() -> None:  # PoC's count 1 s into the chat load and 1 s before its end: beside chat
                time.sleep(1.0)
                inside.append(mark(base, args.seq_len))
                time.sleep(max(0.1, args.seconds - 2.0))
                inside.append(mark(base, args.seq_len))

            def beside_both() -> None:  # a validation job and a greedy chat, while the round and the chats run
                time.sleep(min(2.0, args.seconds / 4))
                under_load["probe"] = _probe_vectors(base, args)
                under_load["probe_done"] = time.perf_counter()
                under_load["greedy"] = _greedy(base)

            probe_thread, marks_thread = threading.Thread(target=beside_both), threading.Thread(target=mark_inside)
            probe_thread.start()
            marks_thread.start()
            beside = chat_load(base, args)
            ended = time.perf_counter()
            # The validation job's nonces are PoC's work in the window too (it takes most forwards while it runs:
            # on the CPU engine, where a forward beside chat is one sequence, half of a 15 s window): counted per
            # forward, and in the batch count once it is done.
            probe_in_window = under_load.get("probe_done", float("inf")) <= ended
            poc_batches = rates(since, mark(base, args.seq_len))[1]
            poc_batches += args.batch_size / (time.perf_counter() - since[0]) if probe_in_window else 0.0
            marks_thread.join()
            poc_beside = rates(*inside)[0]
            probe_thread.join()
        finally:
            _stop(base)
        # Idle chat again: one stretch's rate moved ±10% from run to run, and the ratio is only as good as it.
        idle_after = chat_load(base, args)
    finally:
        stop_all(procs)
    idle = {k: (idle_before[k] + idle_after[k]) / 2 for k in idle_before}
    probe = under_load["probe"]
    figures = {"idle_before": idle_before, "idle_after": idle_after,
               "chat_share": args.chat_share, "backend_args": args.backend_arg, "streams": args.streams,
               "max_tokens": args.max_tokens, "idle": idle, "beside_round": beside, "poc_alone_nonces_per_s": poc_alone,
               "poc_beside_chat_nonces_per_s": poc_beside, "probe_nonces_counted": probe_in_window,
               "poc_beside_chat_batches_nonces_per_s": poc_batches,
               "chat_ratio": beside["tokens_per_s"] / idle["tokens_per_s"], "poc_ratio": poc_beside / poc_alone,
               "tpot_p99_ratio": beside["tpot_p99_ms"] / idle["tpot_p99_ms"],
               "probe_identical": sum(a == b for a, b in zip(probe, probe_alone, strict=True)),
               "probe_max_l2": max(vector_l2(a, b) for a, b in zip(probe, probe_alone, strict=True)),
               "probe_sha256": hashlib.sha256("".join(probe_alone).encode()).hexdigest(),
               "greedy_identical": under_load["greedy"] == greedy_idle}
    for name, f in (("idle before", idle_before), ("idle after", idle_after), ("during the round", beside)):
        print(f"chat {name}: {f['tokens_per_s']:.1f} tok/s, TTFT p50/p99 {f['ttft_p50_ms']:.1f}/{f['ttft_p99_ms']:.1f}"
              f" ms, TPOT p50/p99 {f['tpot_p50_ms']:.2f}/{f['tpot_p99_ms']:.2f} ms ({f['num_requests']} requests)",
              flush=True)
    counted = "included" if probe_in_window else "not counted: it ended after the window"
    print(f"PoC: {poc_alone:.1f} nonces/s alone, {poc_beside:.1f} beside chat, counted per forward; by the round's "
          f"whole batches {poc_batches:.1f} (the {len(probe)}-nonce job's {counted})", flush=True)
    print(f"chat-share {args.chat_share} {' '.join(args.backend_arg)}: chat {figures['chat_ratio']:.3f}x idle, PoC "
          f"{figures['poc_ratio']:.3f}x alone, TPOT p99 {figures['tpot_p99_ratio']:.2f}x idle", flush=True)
    print(f"numerics: a {len(probe)}-nonce job beside chat and the round: {figures['probe_identical']}/{len(probe)} "
          f"vectors bit-identical to alone (max L2 {figures['probe_max_l2']:.2e}, sha256 of alone "
          f"{figures['probe_sha256'][:16]}); greedy chat identical: {figures['greedy_identical']}", flush=True)
    print("(ratios against the mean of the two idle stretches)", flush=True)
    return figures


def _bursts(base: str, args, clients: list[httpx.Client]) -> list[float]:
    """--bursts bursts of one stream per client sent together, --burst-gap-s apart: every stream's TTFT."""
    ttfts: list[float] = []
    for _ in range(args.bursts):
        results: list = []
        threads = [threading.Thread(target=stream_chat, args=(client, base, args, results)) for client in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ttfts += [ttft for ttft, _, _ in results]
        time.sleep(args.burst_gap_s)
    return ttfts


def _ttft(ttfts: list[float]) -> dict:
    return {"ttft_p50_ms": float(np.percentile(ttfts, 50) * 1000),
            "ttft_p99_ms": float(np.percentile(ttfts, 99) * 1000), "num_requests": len(ttfts)}


def _probes_beside_bursts(base: str, args, clients: list[httpx.Client]) -> list[list[str]]:
    """Validation jobs back to back while bursts come and go (a quarter of --bursts): their forwards start with
    chat idle and meet a burst midway (a paced forward moves onto PoC's SMs then, a parked one waits)."""
    stretch = argparse.Namespace(**{**vars(args), "bursts": max(3, args.bursts // 4)})
    bursts = threading.Thread(target=_bursts, args=(base, stretch, clients))
    bursts.start()
    probes: list[list[str]] = []
    while bursts.is_alive() or not probes:
        probes.append(_probe_vectors(base, args))
    bursts.join()
    return probes


def bursts_part(model_dir: Path, args) -> dict:
    procs, _address, base = start_stack(model_dir, args.work_dir, "shared", args,
                                        "--chat-share", str(args.chat_share), *args.backend_arg)
    # Connections kept, as real clients do, but dropped after 2 s idle: a client that finished its stream early
    # waits for the burst and the gap, and one reused as the server closes it (uvicorn: 5 s) fails the request.
    clients = [httpx.Client(timeout=600, limits=httpx.Limits(keepalive_expiry=2.0)) for _ in range(args.streams)]
    try:
        warm = argparse.Namespace(**{**vars(args), "bursts": 2})
        _bursts(base, warm, clients)  # warm-up: first requests, and the shapes a burst's prefill takes
        probe_alone = _probe_vectors(base, args)
        idle = _ttft(_bursts(base, args, clients))
        poc_alone = _batch_rate(base, args)
        _init(base, args)
        try:
            time.sleep(args.settle_s)
            since = mark(base, args.seq_len)
            during = _ttft(_bursts(base, args, clients))
            poc_during, poc_batches = rates(since, mark(base, args.seq_len))
            probes = _probes_beside_bursts(base, args, clients)
        finally:
            _stop(base)
    finally:
        for client in clients:
            client.close()
        stop_all(procs)
    figures = {"chat_share": args.chat_share, "backend_args": args.backend_arg, "streams": args.streams,
               "max_tokens": args.max_tokens, "bursts": args.bursts, "burst_gap_s": args.burst_gap_s,
               "idle": idle, "during_mining": during, "poc_alone_nonces_per_s": poc_alone,
               "poc_during_bursts_nonces_per_s": poc_during, "poc_ratio": poc_during / poc_alone,
               "poc_during_bursts_batches_nonces_per_s": poc_batches,
               "ttft_p99_added_ms": during["ttft_p99_ms"] - idle["ttft_p99_ms"],
               "probes": len(probes), "probes_identical": sum(probe == probe_alone for probe in probes),
               "probe_max_l2": max(vector_l2(a, b) for p in probes for a, b in zip(p, probe_alone, strict=True))}
    for name, f in (("idle", idle), ("during the round", during)):
        print(f"bursts of {args.streams} {name}: TTFT p50/p99 {f['ttft_p50_ms']:.1f}/{f['ttft_p99_ms']:.1f} ms "
              f"({f['num_requests']} requests)", flush=True)
    print(f"chat-share {args.chat_share} {' '.join(args.backend_arg)}: TTFT p99 +{figures['ttft_p99_added_ms']:.1f} ms "
          f"during mining; PoC {poc_during:.1f} nonces/s during the bursts vs {poc_alone:.1f} alone: "
          f"{figures['poc_ratio']:.3f}x (counted per forward; by the round's whole batches {poc_batches:.1f})",
          flush=True)
    print(f"numerics: {len(probes)} jobs of {args.batch_size} nonces during the round and bursts: "
          f"{figures['probes_identical']}/{len(probes)} bit-identical to alone (max L2 {figures['probe_max_l2']:.2e})",
          flush=True)
    return figures


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("jobs", "chat", "both", "bursts"), default="both",
                   help="both: jobs and chat; bursts runs alone")
    from backend.tools.modelgen import SHAPES
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--model-dir", type=Path, default=None,
                   help="a model directory as it is, not generated (e.g. modelgen --config-only output with "
                        "--backend-arg=--load-format=dummy)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--big-job-nonces", type=int, default=1000)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--chat-share", type=float, default=0.6, help="the backend's default")
    p.add_argument("--backend-arg", action="append", default=[],
                   help="one more backend argument for the chat part (repeat: --backend-arg=--poc-overlap "
                        "--backend-arg=off)")
    p.add_argument("--seconds", type=float, default=15.0, help="each measured stretch")
    p.add_argument("--bursts", type=int, default=20, help="bursts per stretch (--part bursts)")
    p.add_argument("--burst-gap-s", type=float, default=1.0, help="idle time between bursts (--part bursts)")
    p.add_argument("--settle-s", type=float, default=2.0, help="after a round starts, before measuring it")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/pocserve-bench-beside"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    raise_on_signals()
    from backend.tools.modelgen import ensure_model
    model_dir = args.model_dir or ensure_model(Path(f"models/{args.shape}"), args.shape)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    figures: dict = {"shape": args.shape, "model_dir": str(model_dir), "seq_len": args.seq_len,
                     "batch_size": args.batch_size}
    if args.part in ("jobs", "both"):
        figures["jobs"] = jobs_part(model_dir, args)
    if args.part in ("chat", "both"):
        figures["chat"] = chat_part(model_dir, args)
    if args.part == "bursts":
        figures["bursts"] = bursts_part(model_dir, args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
