"""The FP8 kernel paths side by side: the FP8 matmul peak, each path's artifacts, and their distances.

    python -m bench.poc_forward ... --artifacts-out FILE                 (one path: its artifacts)
    python -m bench.kernel_paths FILE... --reference triton             (every pair: L2 and verdicts)

Each path is one engine start with other kernels (vLLM's --moe-backend and --linear-backend, VLLM_USE_DEEP_GEMM,
VLLM_USE_DEEP_GEMM_E8M0: scripts/gpu_check.sh kernels). They load the same dummy weights (vLLM's dummy loader is
seeded), so their artifacts differ only by the kernels' numerics. A validator recomputes a prover's nonces on its
own path: for each pair, how many artifacts lie past 0.02 (the reference default) and past the chain's
`dist_threshold` 0.4, and the binomial fraud test at the chain's `p_mismatch` 0.1, which an honest prover on
either path must pass.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np

from poc.artifacts import decode_vector
from poc.spec import ArtifactJob, PocSpec
from poc.validation import StatTest, validate_artifacts

CHAIN = StatTest(dist_threshold=0.4, p_mismatch=0.1, fraud_threshold=0.01)  # the chain's PoC v2 parameters
NEAR = 0.02  # the reference default threshold: how many pairs are not simply equal


def peak_fp8_tflops(worker) -> float:
    """e4m3 × e4m3 → bf16 matmul with per-tensor scales (torch._scaled_mm, cuBLASLt) at 8192³; 0 off CUDA."""
    import torch
    if not torch.cuda.is_available():
        return 0.0
    n, iters = 8192, 20
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants it
    one = torch.ones((), device="cuda")
    for _ in range(3):
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - started) / 1e12


def dump_artifacts(runner, path: Path, num_nonces: int, seq_len: int, batch: int) -> None:
    """Nonces 0..num_nonces-1 at seq_len through the production PoC path, `batch` a forward, as {nonce: base64
    fp16 vector} (batches of one size: a path's artifacts do not depend on what else its forward held)."""
    job = ArtifactJob(PocSpec("BENCH_BLOCK", "bench_key", seq_len), tuple(range(num_nonces)))
    found: dict[int, str] = {}
    pending = list(job.nonces)
    while pending:
        artifacts, taken = runner.run(job, pending[:batch])
        found.update(artifacts)
        pending = pending[taken:]
    path.write_text(json.dumps({str(n): v for n, v in sorted(found.items())}))


def compare(ours: dict[str, str], theirs: dict[str, str]) -> dict:
    """One path's artifacts validated against another's, as a validator on `theirs` judges a prover on `ours`."""
    nonces = sorted(set(ours) & set(theirs), key=int)
    distances = [float(np.linalg.norm(decode_vector(ours[n]) - decode_vector(theirs[n]))) for n in nonces]
    computed = [(int(n), theirs[n]) for n in nonces]  # the validator's own recomputation
    verdict = validate_artifacts(computed, {int(n): ours[n] for n in nonces}, [int(n) for n in nonces], 12, CHAIN)
    return {"nonces": len(nonces), "past_0.02": sum(d > NEAR for d in distances),
            "past_0.4": sum(d > CHAIN.dist_threshold for d in distances), "max": max(distances, default=0.0),
            "mean": float(np.mean(distances)) if distances else 0.0, "fraud_detected": verdict["fraud_detected"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="artifact files, one per path (name: kernels-PATH.json)")
    p.add_argument("--reference", default="", help="the path a stock node computes: listed first")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    paths = {f.stem.removeprefix("kernels-"): json.loads(f.read_text()) for f in args.files}
    names = sorted(paths, key=lambda name: (name != args.reference, name))
    rows = []
    for a, b in itertools.combinations(names, 2):
        row = {"prover": a, "validator": b, **compare(paths[a], paths[b])}
        rows.append(row)
        print(f"{a:>24} vs {b:<24} n={row['nonces']}  past 0.02: {row['past_0.02']:3d}  past 0.4: "
              f"{row['past_0.4']:3d}  max {row['max']:.4f}  mean {row['mean']:.4f}  "
              f"fraud {'DETECTED' if row['fraud_detected'] else 'no'}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
