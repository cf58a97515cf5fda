"""PoC artifacts across parallel topologies: the same nonces on each, every pair's L2 distribution, and whether the
network's binomial test would pass an honest prover checked by a validator on the other topology.

    python -m bench.topologies                                       (CPU, tiny model: tp1 tp2 pp2 tp2xpp2)
    python -m bench.topologies --shape qwen3-0.6b --topologies tp1 tp2 tp4 pp2 tp2xpp2 --nonces 256 \
        --seq-len 1024 --gpu-memory-utilization 0.8                 (GPUs)
    python -m bench.topologies --shape qwen3-235b-a22b --num-layers 4 [--quant fp8] ...

One topology at a time, a backend and a frontend start with its sizes, compute the nonces' artifacts through
POST /api/v1/pow/generate (wait: true; a warm-up job first, then the timed one, whose rate is reported) and stop.
Then for every pair: L2 mean, p99 and max over the nonces, the fraction over each distance threshold, and the
verdict of the binomial test (poc/validation.py) a validator on one topology would reach on a prover on the other,
over all the nonces, at the fork's code defaults and at the chain's production values (poc/validation.py). On the CPU
engine every rank gets a core of its own when there are enough, and shares them otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from bench.procs import Proc, free_port, raise_on_signals, stop_all, wait_gpus_free, wait_http_ok
from poc.artifacts import vector_l2
from poc.validation import StatTest, fraud_test

NODE = {"block_hash": "TOPOLOGIES", "block_height": 1, "public_key": "bench_key", "node_id": 0, "node_count": 1}
# (name, stat test): the fork's code defaults, and the chain's production values (what dapi sends).
STAT_TESTS = (("defaults", StatTest()),
              ("chain", StatTest(dist_threshold=0.4, p_mismatch=0.1, fraud_threshold=0.05)))
_TOPOLOGY = re.compile(r"^(?:tp(\d+))?(?:x?pp(\d+))?(ep)?$")


@dataclass(frozen=True)
class Topology:
    name: str
    tp: int
    pp: int
    ep: bool = False  # vLLM's --enable-expert-parallel (MoE models): experts split over the TP ranks

    @property
    def ranks(self) -> int:
        return self.tp * self.pp

    @classmethod
    def parse(cls, name: str) -> Topology:
        m = _TOPOLOGY.match(name)
        if not name or m is None:
            raise argparse.ArgumentTypeError(f"{name!r}: write tpN, ppN or tpNxppM, with ep after for expert "
                                             "parallel")
        return cls(name, int(m.group(1) or 1), int(m.group(2) or 1), m.group(3) is not None)


def _cpu_bind(ranks: int) -> dict[str, str]:
    """On the CPU engine with more ranks than cores, the ranks share the cores (the backend keeps a binding it is
    given); with enough cores the backend binds them itself."""
    from backend.engine import compat

    cpus = sorted(os.sched_getaffinity(0))
    if not compat.is_cpu_build() or ranks <= 1 or ranks <= len(cpus):
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(str(cpus[r % len(cpus)]) for r in range(ranks))}


def _generate(base: str, nonces: list[int], args) -> dict[int, str]:
    body = {**NODE, "nonces": nonces, "params": {"model": "bench", "seq_len": args.seq_len},
            "batch_size": args.batch_size, "wait": True}
    r = httpx.post(f"{base}/api/v1/pow/generate", json=body, timeout=args.job_timeout_s)
    r.raise_for_status()
    answer = r.json()
    if answer.get("status") != "completed":
        raise RuntimeError(f"job not completed: {str(answer)[:300]}")
    return {a["nonce"]: a["vector_b64"] for a in answer["artifacts"]}


def run_topology(topology: Topology, model_dir: Path, args) -> dict:
    work = args.work_dir / topology.name
    address, port = f"ipc://{work}/backend.ipc", free_port()
    memory = args.gpu_memory_utilization
    from backend.engine import compat
    if compat.is_cpu_build():
        memory = min(memory, 0.9 / topology.ranks)  # each CPU rank reserves this share of RAM
    backend = Proc("backend", ["-m", "backend", "--model", str(model_dir), "--generate-model", "none",
                               "--address", address, "--served-model-name", "bench", "--state-dir",
                               str(work / "state"), "--tensor-parallel-size", str(topology.tp),
                               "--pipeline-parallel-size", str(topology.pp), "--gpu-memory-utilization", str(memory),
                               "--max-model-len", str(max(2048, args.seq_len)), "--log-level", "warning",
                               *(["--enforce-eager"] if args.enforce_eager else []),
                               *(["--enable-expert-parallel"] if topology.ep else [])],
                   work / "backend.log", env=_cpu_bind(topology.ranks))
    frontend = Proc("frontend", ["-m", "frontend", "--backend-address", address, "--port", str(port),
                                 "--log-level", "warning"], work / "frontend.log")
    waited_s, held = wait_gpus_free(args.gpu_free_timeout_s)  # the previous topology's ranks may still be exiting
    if held:
        print(f"{topology.name}: GPUs still held after {waited_s:.0f} s: {held}", flush=True)
    procs = [backend.start(), frontend.start()]
    try:
        started = time.monotonic()
        wait_http_ok(f"http://127.0.0.1:{port}/health", procs, args.startup_timeout_s)
        startup_s = time.monotonic() - started
        base = f"http://127.0.0.1:{port}"
        _generate(base, list(range(10**9, 10**9 + args.batch_size)), args)  # warm-up, other nonces
        started = time.perf_counter()
        artifacts = _generate(base, list(range(args.nonces)), args)
        elapsed = time.perf_counter() - started
    finally:
        stop_all(procs)
    print(f"{topology.name}: {len(artifacts)} artifacts, {args.nonces / elapsed:.1f} nonces/s, "
          f"ready after {startup_s:.0f} s", flush=True)
    return {"artifacts": artifacts, "nonces_per_s": args.nonces / elapsed, "startup_s": startup_s,
            "gpu_wait_s": waited_s, "gpu_held_at_start": held}


def compare(a: dict[int, str], b: dict[int, str]) -> dict:
    """L2 distribution between two topologies' artifacts, and the validation verdicts either way."""
    common = sorted(a.keys() & b.keys())
    distances = np.array([vector_l2(a[n], b[n]) for n in common])
    out: dict = {"n": len(common), "only_one_side": len(a.keys() ^ b.keys()), "mean": float(distances.mean()),
                 "p50": float(np.percentile(distances, 50)), "p99": float(np.percentile(distances, 99)),
                 "max": float(distances.max())}
    for name, test in STAT_TESTS:
        n_mismatch = int((distances > test.dist_threshold).sum()) + out["only_one_side"]
        p_value, fraud = fraud_test(n_mismatch, len(common) + out["only_one_side"], test.p_mismatch,
                                    test.fraud_threshold)
        out[name] = {"dist_threshold": test.dist_threshold, "over": n_mismatch / max(1, len(common)),
                     "n_mismatch": n_mismatch, "p_value": p_value, "honest_passes": not fraud}
    return out


def main(argv: list[str] | None = None) -> int:
    from backend.tools.modelgen import QUANTS, SHAPES, ensure_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--num-layers", type=int, default=None, help="decoder layers (default: the shape's)")
    p.add_argument("--quant", default=None, choices=QUANTS)
    p.add_argument("--model-dir", type=Path, default=None, help="default: models/SHAPE[-NL][-QUANT]")
    p.add_argument("--topologies", nargs="+", type=Topology.parse,
                   default=[Topology.parse(t) for t in ("tp1", "tp2", "pp2", "tp2xpp2")])
    p.add_argument("--nonces", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--startup-timeout-s", type=float, default=1800.0)
    p.add_argument("--gpu-free-timeout-s", type=float, default=60.0,
                   help="before each topology, wait this long at most for other processes to leave the GPUs")
    p.add_argument("--job-timeout-s", type=float, default=3600.0)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/pocserve-bench-topologies"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    raise_on_signals()
    suffix = "".join([f"-{args.num_layers}l" if args.num_layers else "", f"-{args.quant}" if args.quant else ""])
    model_dir = ensure_model(args.model_dir or Path(f"models/{args.shape}{suffix}"), args.shape,
                             num_layers=args.num_layers, quant=args.quant)
    runs: dict[str, dict] = {}
    for topology in args.topologies:
        # Written after each topology: a run cut by a time limit keeps the pairs it finished.
        runs[topology.name] = run_topology(topology, model_dir, args)
        pairs = {f"{a} vs {b}": compare(runs[a]["artifacts"], runs[b]["artifacts"])
                 for a, b in itertools.combinations(runs, 2)}
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({
                "shape": args.shape, "num_layers": args.num_layers, "quant": args.quant, "nonces": args.nonces,
                "seq_len": args.seq_len, "pairs": pairs, "runs": runs}, indent=2) + "\n")
    print(f"\n{args.shape}{suffix}, {args.nonces} nonces at seq_len {args.seq_len}")
    print(f"{'pair':<20}{'mean':>9}{'p50':>9}{'p99':>9}{'max':>9}{'>0.02':>8}{'defaults':>10}{'>0.4':>7}{'chain':>8}")
    for pair, c in pairs.items():
        d, ch = c["defaults"], c["chain"]
        print(f"{pair:<20}{c['mean']:>9.4f}{c['p50']:>9.4f}{c['p99']:>9.4f}{c['max']:>9.4f}{d['over']:>8.3f}"
              f"{'pass' if d['honest_passes'] else 'FRAUD':>10}{ch['over']:>7.3f}"
              f"{'pass' if ch['honest_passes'] else 'FRAUD':>8}")
    print("nonces/s: " + ", ".join(f"{name} {r['nonces_per_s']:.1f}" for name, r in runs.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
