"""A two-node engine on one machine: node 0 (the backend that serves) and node 1 (a worker node, `--node-rank 1`)
on loopback, TP=2 with one rank on each, through vLLM's multiprocessing executor across nodes. Chat, PoC artifacts
and validation must agree with the shared single-node stack, and a worker node must leave once node 0 is gone
(so that its supervisor restarts it and it joins node 0's next engine).

Each node binds its rank to a core of its own (VLLM_CPU_OMP_THREADS_BIND; on GPUs, a GPU of its own), as two hosts
would have, and names its loopback address for vLLM's cross-node queues (VLLM_HOST_IP).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend.engine import compat
from tests.integration.pow_util import (
    TOPOLOGY_NONCES,
    TOPOLOGY_SEQ_LEN,
    artifacts_of,
    generate,
    greedy_tokens,
    l2,
    validation,
)
from tests.stack import Proc, backend_args, free_port, frontend_args, wait_healthy

pytestmark = pytest.mark.slow

MAX_L2 = 0.02
CPUS = sorted(os.sched_getaffinity(0))


@dataclass
class TwoNodes:
    base_url: str
    head: Proc
    worker: Proc
    frontend: Proc

    @property
    def pow(self) -> str:
        return f"{self.base_url}/api/v1/pow"




def _node_args(model_dir: Path, work: Path, address: str, master_port: int, rank: int) -> list[str]:
    return backend_args(model_dir, address, "--state-dir", str(work / "state"), "--max-model-len", "512",
                        "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", str(rank),
                        "--master-addr", "127.0.0.1", "--master-port", str(master_port))


@pytest.fixture(scope="module")
def nodes(model_dir, tmp_path_factory) -> Iterator[TwoNodes]:
    if compat.is_cpu_build() and len(CPUS) < 2:
        pytest.skip("needs two cores")
    work = tmp_path_factory.mktemp("two-nodes")
    address, master_port, port = f"ipc://{work}/backend.ipc", free_port(), free_port()

    def env(rank: int) -> dict[str, str]:
        # Each "host" its own core (CPU engine) or GPU, as two machines would have.
        device = {"VLLM_CPU_OMP_THREADS_BIND": str(CPUS[rank])} if compat.is_cpu_build() else \
            {"CUDA_VISIBLE_DEVICES": str(rank)}
        return {"VLLM_HOST_IP": "127.0.0.1", **device}

    worker = Proc(_node_args(model_dir, work, address, master_port, 1), work / "node1.log", env=env(1)).start()
    head = Proc(_node_args(model_dir, work, address, master_port, 0), work / "node0.log", env=env(0)).start()
    frontend = Proc(frontend_args(address, port), work / "frontend.log").start()
    two = TwoNodes(f"http://127.0.0.1:{port}", head, worker, frontend)
    try:
        wait_healthy(two.base_url, frontend, head, worker)
        yield two
    finally:
        for proc in (frontend, head, worker):
            proc.stop()


def test_multinode_greedy_chat_matches_single_node(nodes, single_rank_reference):
    assert greedy_tokens(nodes.base_url) == single_rank_reference[1]


def test_multinode_artifacts_match_single_node(nodes, single_rank_reference):
    expected, _ = single_rank_reference
    got = artifacts_of(nodes.pow, TOPOLOGY_NONCES, seq_len=TOPOLOGY_SEQ_LEN)
    assert got.keys() == expected.keys()
    assert max(l2(got[n], expected[n]) for n in expected) < MAX_L2


def test_multinode_validation_accepts_single_node_artifacts(nodes, single_rank_reference):
    expected, _ = single_rank_reference
    r = generate(nodes.pow, TOPOLOGY_NONCES, seq_len=TOPOLOGY_SEQ_LEN, validation=validation(expected))
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["status"], body["n_mismatch"], body["fraud_detected"]) == ("completed", 0, False), body


def test_multinode_worker_node_leaves_once_node_0_is_gone(nodes):
    """Last in the module: it stops node 0."""
    assert nodes.worker.proc is not None and nodes.worker.proc.poll() is None
    nodes.frontend.stop()
    assert nodes.head.stop() == 0
    stopped = time.monotonic()
    # Three missed probes 5 s apart (backend/engine/headless.py), then vLLM's worker shutdown (up to ~10 s).
    code = nodes.worker.proc.wait(60)
    assert code == 1, nodes.worker.tail()
    assert "worker_node_lost_node_0" in nodes.worker.tail(200)
    print(f"worker node left {time.monotonic() - stopped:.1f} s after node 0 stopped")
