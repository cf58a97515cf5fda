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


# Golden files of larger shapes (tests/gpu/make_cpu_golden.py --shape S --num-layers N): the model is generated
# here from the same seed and served by its own backend.
LARGE = sorted(Path(__file__).parent.glob("cpu_artifacts_*-*l.json"))
# A start logs a line at least every few seconds (weights, profile, KV cache), a forward of these shapes takes
# well under a second: two silent minutes is a stalled backend.
STALL_S = 120.0


@pytest.fixture(scope="module", params=LARGE, ids=lambda p: p.stem.removeprefix("cpu_artifacts_"))
def large(request, tmp_path_factory):
    from backend.tools.modelgen import ensure_model
    from tests.stack import Proc, backend_args

    golden = json.loads(request.param.read_text())
    tmp = tmp_path_factory.mktemp("large")
    model = ensure_model(tmp / golden["shape"], golden["shape"], num_layers=golden["num_layers"])
    address = f"ipc://{tmp}/b.ipc"
    backend = Proc(backend_args(model, address, "--gpu-memory-utilization", "0.6"), tmp / "backend.log").start()
    raw = RawBackend(address)
    yield golden, raw, backend
    raw.close()
    backend.stop()
    print(f"{golden['shape']} {golden['num_layers']}l backend log (tail):\n{backend.tail(30)}")


def test_large_shape_artifacts_match_cpu_engine(large, record_property):
    """The bulk of the nonces agree within the fork's 0.02, and a validator with the chain's thresholds passes the
    GPU prover. A MoE nonce whose router scores nearly tie can take another expert on the other device and jump
    (docs/decisions.md, "MoE near-tie routing"), so the fork's code default of 0.02 is not asserted per nonce."""
    from bench.topologies import compare
    golden, raw, backend = large
    for case in golden["cases"]:
        # A backend that dies or goes quiet (no log line for STALL_S) fails now, with its log and stacks.
        reply = raw.wait_for(raw.submit_artifacts(case["nonces"], seq_len=case["seq_len"],
                                                  stronger_rng=case["stronger_rng"]), timeout_s=900,
                             watch=lambda: backend.check(STALL_S))
        assert reply.error is None, reply.error
        got = {a.nonce: a.vector_b64 for a in reply.artifacts}
        result = compare(got, {int(n): v for n, v in case["artifacts"].items()})
        record_property(f"L{case['seq_len']}", result)
        print(f"{golden['shape']} {golden['num_layers']}l GPU vs CPU, L={case['seq_len']}:", json.dumps(result))
        assert result["only_one_side"] == 0
        assert result["p50"] < 0.02, result
        assert result["chain"]["honest_passes"], result
