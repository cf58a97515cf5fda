"""The network's launch, measured: `python -m pocserve.api_server` started with the ML node's runner command line and
one of the network's Qwen3-235B configs, then driven as dapi and the ML node drive it.

    python -m bench.network_launch --model-dir models/tiny-qwen3 --config node-config --cpu
    python -m bench.network_launch --model-dir models/q235b-fp8 --config release-candidate --tp 1

Prints (and --json writes): seconds to the ML node's heartbeat, the dtype the engine runs (its handshake, via the
probe) against the `--dtype float16` given, max_num_seqs against what `vllm serve` picks for the same arguments,
the heartbeat moving during a round mined by a node numbered above the node count, the round's nonces/s and GPU
memory against before it, a validator's /generate and its latency during the round, chat with cached prompt
tokens, and the seconds from SIGINT to exit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import httpx

from bench.procs import REPO, free_port
from bench.prom import totals

# gonka deploy/join/node-config*.json: the Qwen3-235B configs' args (TP as --tp says, on the machine at hand).
CONFIGS = {
    "node-config": ["--scheduling-policy", "priority", "--max-num-batched-tokens", "32768", "--max-model-len",
                    "240000"],
    "qwen235B-B200": ["--scheduling-policy", "priority", "--max-num-batched-tokens", "32768", "--max-model-len",
                      "240000", "--gpu-memory-utilization", "0.88"],
    "release-candidate": ["--gpu-memory-utilization", "0.85", "--max-model-len", "240000",
                          "--max-num-batched-tokens", "16384", "--kv-cache-dtype", "fp8", "--logprobs-mode",
                          "processed_logprobs", "--trust-remote-code"],
}
HEARTBEAT = ("vllm:iteration_tokens_total_count", "vllm:num_requests_running", "vllm:num_requests_waiting")


def runner_command(model_dir: Path, port: int, config: list[str]) -> list[str]:
    """The ML node's VLLMRunner: its own flags, the model config's, the worker extension last."""
    return [sys.executable, "-m", "pocserve.api_server", "--model", str(model_dir), "--dtype", "float16", "--port",
            str(port), "--host", "0.0.0.0", "--enable-prompt-tokens-details", *config, "--worker-extension-cls",
            "gonka_poc.worker.PoCWorkerExtension"]


def heartbeat(base: str) -> dict[str, float] | None:
    try:
        values = totals(httpx.get(f"{base}/metrics", timeout=3).text)
    except httpx.HTTPError:
        return None
    return {k: values[k] for k in HEARTBEAT} if all(k in values for k in HEARTBEAT) else None


class Receiver:
    """The node's callback endpoint on loopback: counts the nonces delivered to /generated."""

    def __init__(self) -> None:
        self.nonces: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("generated"):
                    outer.nonces += [a["nonce"] for a in body.get("artifacts", [])]
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def wait(predicate, timeout_s: float, what: str, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode} waiting for {what}:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met in {timeout_s} s:\n{tail(log)}")
        time.sleep(0.5)
    return value


def tail(log: Path, n: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def probe_dtype(port: int) -> str:
    """The dtype in the backend's handshake (its fingerprint), as the probe reports it."""
    [socket] = Path("/tmp").glob(f"pocserve-{port}-*/backend.ipc")
    out = subprocess.run([sys.executable, "-m", "backend.tools.probe", "--address", f"ipc://{socket}"], cwd=REPO,
                         capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"dtype (\S+)", out)
    return found.group(1) if found else f"? ({out.strip()[:200]})"


def vllm_serve_max_num_seqs(argv: list[str]) -> int:
    """What `vllm serve` picks for max_num_seqs with this command line (vLLM's parser and defaults alone)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    from backend.engine.compat import serve_parser

    def fail(message: str):
        raise SystemExit(message)

    namespace = serve_parser("vllm", "", fail).parse_args(argv[3:])
    namespace.worker_extension_cls = ""  # the plugin the ML node names is not installed here
    config = EngineArgs.from_cli_args(namespace).create_engine_config(UsageContext.OPENAI_API_SERVER)
    return int(config.scheduler_config.max_num_seqs)


def gpu_memory_mib() -> list[int] | None:
    """Memory in use on each GPU (nvidia-smi), None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [int(line) for line in out.split()]


def run(args: argparse.Namespace) -> dict:
    port = free_port()
    config = [*CONFIGS[args.config], "--tensor-parallel-size", str(args.tp), *shlex.split(args.extra)]
    if args.cpu:  # vLLM's CPU engine reserves the fraction of RAM: leave the host most of it
        config += ["--gpu-memory-utilization", "0.2"]
    argv = runner_command(Path(args.model_dir), port, config)
    log = Path(args.log)
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "POCSERVE_STATE_ROOT": str(log.parent / "state"),
           "POC_CALLBACK_INTERVAL_SEC": "0.5"}
    base, started = f"http://127.0.0.1:{port}", time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen(["sh", "-c", "exec " + " ".join(shlex.quote(a) for a in argv)], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    result: dict = {"command": " ".join(argv[1:]), "config": args.config}
    try:
        wait(lambda: heartbeat(base), args.timeout_s, "the heartbeat series", proc, log)
        result["start_to_heartbeat_s"] = round(time.monotonic() - started, 1)
        text = log.read_text(errors="replace")
        ready = re.search(r"engine_ready .*", text)
        result["engine_ready"] = ready.group(0)[:400] if ready else None
        seqs = re.search(r"max_num_seqs=(\d+)", ready.group(0)) if ready else None
        result["max_num_seqs"] = int(seqs.group(1)) if seqs else None
        result["vllm_serve_max_num_seqs"] = vllm_serve_max_num_seqs(argv)
        result["dtype_given"], result["dtype_in_handshake"] = "float16", probe_dtype(port)
        result["dtype_overridden_logged"] = "dtype_overridden" in text
        model = str(args.model_dir)
        result["models"] = [m["id"] for m in httpx.get(f"{base}/v1/models", timeout=10).json()["data"]]

        prompt = "The network replays paid inferences token by token. " * 40
        usage = []
        for _ in range(2):
            r = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
                "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "priority": 1})
            r.raise_for_status()
            usage.append(r.json()["usage"])
        result["chat_usage"] = usage

        receiver = Receiver()
        body = {"block_hash": "LAUNCH", "block_height": 1, "public_key": "pk", "node_id": 3, "node_count": 2,
                "group_id": 1, "n_groups": 2, "batch_size": 32, "url": receiver.url,
                "params": {"model": model, "seq_len": 1024, "k_dim": 12}}
        result["gpu_mib_before_round"] = gpu_memory_mib()
        r = httpx.post(f"{base}/api/v1/pow/init/generate", json=body, timeout=60)
        result["init_generate"] = r.status_code
        before, mining = heartbeat(base), time.monotonic()
        wait(lambda: len(receiver.nonces) >= 64, 300, "64 mined nonces delivered", proc, log)
        first_64_s = time.monotonic() - mining
        result["first_64_nonces_s"] = round(first_64_s, 2)
        # The rate after the first callbacks: later batches, without the round's start.
        counted, since = len(receiver.nonces), time.monotonic()
        time.sleep(args.mine_s)
        result["mined_nonces_per_s"] = round((len(receiver.nonces) - counted) / (time.monotonic() - since), 1)
        result["gpu_mib_while_mining"] = gpu_memory_mib()
        after = heartbeat(base)
        result["heartbeat_moved_while_mining"] = bool(before and after and after[HEARTBEAT[0]] > before[HEARTBEAT[0]])
        result["mined_nonces_first"] = sorted(receiver.nonces)[:8]
        result["mined_nonces_fork_sequence"] = all((n - 5) % 4 == 0 and n >= 5 for n in receiver.nonces)
        validate = {**body, "node_id": 7, "nonces": sorted(receiver.nonces)[:4], "wait": True}
        del validate["url"]
        asked = time.monotonic()
        r = httpx.post(f"{base}/api/v1/pow/generate", json=validate, timeout=300)
        result["validation_during_round_s"] = round(time.monotonic() - asked, 2)
        result["validator_node_7_of_2"] = r.status_code, r.json().get("status")
        result["status_while_mining"] = httpx.get(f"{base}/api/v1/pow/status", timeout=10).json().get("status")
        httpx.post(f"{base}/api/v1/pow/stop", timeout=60)
        result["status_after_stop"] = httpx.get(f"{base}/api/v1/pow/status", timeout=10).json().get("status")
        receiver.server.shutdown()

        stopping = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        result["exit_code"] = proc.wait(30)
        result["sigint_to_exit_s"] = round(time.monotonic() - stopping, 2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="node-config")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--cpu", action="store_true", help="the CPU engine: KV cache 0.2 of RAM")
    parser.add_argument("--extra", default="", help="more flags for the command line, as one string")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--mine-s", type=float, default=10.0, help="seconds of mining timed after the first 64")
    parser.add_argument("--log", default="/tmp/pocserve-network-launch.log")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
