"""On a GPU: the CUDA engine's artifacts for the tiny model agree with the CPU engine's (L2 < 0.02)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from poc.artifacts import decode_vector
from tests.backend_client import RawBackend

GOLDEN = json.loads((Path(__file__).parent / "cpu_artifacts_tiny.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"L{c['seq_len']}-stronger{c['stronger_rng']}")
def test_gpu_artifacts_match_cpu_engine(stack, case, record_property):
    raw = RawBackend(stack.address)
    try:
        reply = raw.artifacts(case["nonces"], seq_len=case["seq_len"], stronger_rng=case["stronger_rng"])
    finally:
        raw.close()
    assert reply.error is None, reply.error
    got = {a.nonce: a.vector_b64 for a in reply.artifacts}
    distances = [float(np.linalg.norm(decode_vector(got[int(n)]) - decode_vector(v)))
                 for n, v in case["artifacts"].items()]
    record_property("l2", distances)
    print(f"GPU vs CPU L2 (L={case['seq_len']}, stronger={case['stronger_rng']}):",
          [round(d, 5) for d in distances])
    assert max(distances) < 0.02
