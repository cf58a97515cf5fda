"""PoC mining rate through the HTTP API vs the artifact API called directly, on one backend.

    python -m bench.mining                                        (CPU, tiny model)
    python -m bench.mining --shape qwen3-0.6b --seq-len 1024 --batch-size 32 --seconds 30   (GPU)

"Direct" sends PocArtifactsRequest batches over ZMQ back to back (one in flight), "HTTP" starts a round with
POST /api/v1/pow/init/generate and reads `nonces_per_second` from /status after `--seconds`, as mlnode does.
Then a shared-mode run: chat throughput and PoC rate side by side (`--shared`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

from bench.procs import Proc, free_port, raise_on_sigterm, stop_all, wait_http_ok
from bench.prom import labelled, totals
from tests.backend_client import RawBackend

NODE = {"block_hash": "BENCH", "block_height": 1, "public_key": "bench_key", "node_id": 0, "node_count": 1}


def start_stack(model_dir: Path, work: Path, mode: str, args, *extra: str) -> tuple[list[Proc], str, str]:
    """A backend (sized for args.batch_size x args.seq_len PoC forwards) and a frontend; (procs, address, url)."""
    address = f"ipc://{work}/{mode}.ipc"
    port = free_port()
    backend = Proc("backend", ["-m", "backend", "--model", str(model_dir), "--generate-model", "none",
                               "--address", address, "--served-model-name", "bench", "--state-dir",
                               str(work / f"state-{mode}"), "--scheduling-mode", mode, "--gpu-memory-utilization",
                               str(args.gpu_memory_utilization), "--max-num-seqs", str(args.batch_size),
                               "--max-num-batched-tokens", str(max(4096, args.batch_size * args.seq_len)),
                               "--max-model-len", str(max(2048, args.seq_len)), *extra], work / f"backend-{mode}.log")
    frontend = Proc("frontend", ["-m", "frontend", "--backend-address", address, "--port", str(port)],
                    work / f"frontend-{mode}.log")
    procs = [backend.start(), frontend.start()]
    base = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{base}/health", procs, args.startup_timeout_s)
    return procs, address, base


def poc_nonces(base: str, seq_len: int) -> float:
    """Nonces computed so far (mining and jobs), counted as each PoC forward ends: the PoC part of /metrics'
    vllm:iteration_tokens_total sum (nonces × seq_len a forward), that is the sum less chat's part (prompt tokens
    computed plus tokens generated). A round's total_processed moves a whole batch at a time: beside steady chat
    on the CPU engine a 32-nonce batch is ~9 s of one-sequence forwards, so a 20 s window counted 2 or 3 batches
    of the same forwards (0.33x or 0.49x). Chat's part reaches the histogram with the backend's stats, a little
    later than its own counters: the error is what chat computes meanwhile, well under a nonce of 1024 tokens."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    sums = totals(text)
    chat = (sums.get("vllm:generation_tokens_total", 0.0)
            + labelled(text, "vllm:prompt_tokens_by_source_total", source="local_compute"))
    return (sums.get("vllm:iteration_tokens_total_sum", 0.0) - chat) / seq_len


def mark(base: str, seq_len: int) -> tuple[float, int, float]:
    """(now, the round's total_processed, poc_nonces). The latter reaches /metrics with the backend's stats, up to
    a ping (0.5 s) late: two marks give a true rate where PoC runs at one rate around both (alone, or beside
    chat), the lag shifting the window without changing its length."""
    status = httpx.get(f"{base}/api/v1/pow/status", timeout=30).json()
    return time.perf_counter(), status["stats"]["total_processed"], poc_nonces(base, seq_len)


def rates(since: tuple[float, int, float], until: tuple[float, int, float]) -> tuple[float, float]:
    """Nonces/s between two marks: counted per forward, and by the round's whole batches."""
    return (until[2] - since[2]) / (until[0] - since[0]), (until[1] - since[1]) / (until[0] - since[0])


def direct_rate(address: str, args) -> float:
    raw = RawBackend(address)
    try:
        raw.artifacts(range(args.batch_size), seq_len=args.seq_len, block_hash="WARM")
        done, started, batch = 0, time.perf_counter(), 0
        while time.perf_counter() - started < args.seconds:
            nonces = range(batch * args.batch_size, (batch + 1) * args.batch_size)
            reply = raw.artifacts(nonces, seq_len=args.seq_len, block_hash=NODE["block_hash"])
            assert reply.error is None, reply.error
            done, batch = done + args.batch_size, batch + 1
        return done / (time.perf_counter() - started)
    finally:
        raw.close()


def http_rate(base: str, args, chat: bool = False) -> dict:
    body = {**NODE, "params": {"model": "bench", "seq_len": args.seq_len}, "batch_size": args.batch_size}
    r = httpx.post(f"{base}/api/v1/pow/init/generate", json=body, timeout=60)
    r.raise_for_status()
    result: dict = {}
    try:
        started = time.perf_counter()
        num_chat_tokens = 0
        while time.perf_counter() - started < args.seconds:
            if chat:
                reply = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
                    "model": "bench", "messages": [{"role": "user", "content": "Tell me a story."}],
                    "max_tokens": 64, "ignore_eos": True}).json()
                num_chat_tokens += reply["usage"]["completion_tokens"]
            else:
                time.sleep(0.5)
        status = httpx.get(f"{base}/api/v1/pow/status", timeout=10).json()
        result["nonces_per_s"] = status["stats"]["nonces_per_second"]
        if chat:
            result["chat_tokens_per_s"] = num_chat_tokens / (time.perf_counter() - started)
    finally:
        httpx.post(f"{base}/api/v1/pow/stop", timeout=60)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny", choices=("tiny", "qwen3-0.6b"))
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--shared", action="store_true", help="also measure chat + PoC in shared mode")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/pocserve-bench-mining"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    raise_on_sigterm()
    from backend.tools.modelgen import ensure_model
    model_dir = ensure_model(Path(f"models/{args.shape}"), args.shape)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    figures: dict = {"shape": args.shape, "seq_len": args.seq_len, "batch_size": args.batch_size}
    procs, address, base = start_stack(model_dir, args.work_dir, "exclusive", args)
    try:
        figures["direct_nonces_per_s"] = direct_rate(address, args)
        figures["http_nonces_per_s"] = http_rate(base, args)["nonces_per_s"]
    finally:
        stop_all(procs)
    figures["ratio_http_vs_direct"] = figures["http_nonces_per_s"] / figures["direct_nonces_per_s"]
    print(f"direct {figures['direct_nonces_per_s']:.1f} nonces/s  HTTP round {figures['http_nonces_per_s']:.1f} "
          f"nonces/s  ratio {figures['ratio_http_vs_direct']:.3f} (target >= 0.95)", flush=True)
    if args.shared:
        procs, address, base = start_stack(model_dir, args.work_dir, "shared", args)
        try:
            shared = http_rate(base, args, chat=True)
        finally:
            stop_all(procs)
        figures["shared"] = shared
        print(f"shared mode: PoC {shared['nonces_per_s']:.1f} nonces/s while chat ran at "
              f"{shared['chat_tokens_per_s']:.1f} tokens/s (sequential requests)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
