"""A worker node (`--node-rank` > 0): this host's share of the engine's ranks, driven by node 0's executor. This is
vLLM's own headless multi-node mode, as `vllm serve --headless --node-rank N` runs it: the same engine arguments
build the same config, and vLLM's MultiprocExecutor starts the local workers, which join node 0's torch.distributed
group and read its broadcast queue. Chat steps, PoC forwards and validation jobs reach them through the same
collective RPCs, so nothing of ours runs here besides the worker extension: no sockets, no processor, no PoC state.
"""

from __future__ import annotations

import signal
import socket
import time

import structlog

from backend.engine import parallel
from backend.startup.settings import BackendSettings

log = structlog.get_logger(__name__)

# Node 0's rendezvous port is served by its first worker for as long as node 0's engine lives. vLLM's headless
# workers would wait for a vanished node 0 forever; we leave once that port refuses connections this many times in
# a row, so that the supervisor restarts this node and it joins node 0's next engine.
_PROBE_INTERVAL_S = 5.0
_PROBE_MISSES = 3


def _reachable(host: str, port: int, timeout_s: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def run_worker_node(settings: BackendSettings) -> int:
    """Runs until a local worker dies or node 0 is gone (1), or SIGTERM/SIGINT (0). The process environment is
    prepared already (backend/__main__.py)."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from backend.engine import kernels
    from backend.engine.args import USAGE_CONTEXT

    parallel.bind_cpu_threads(settings)
    config = kernels.engine_args(settings).create_engine_config(USAGE_CONTEXT, headless=True)

    def stop(signum, _frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        log.info("shutdown_requested", signal=signal.Signals(signum).name)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    e = settings.engine
    log.info("worker_node_starting", node_rank=e.node_rank, nnodes=e.nnodes, master=f"{e.master_addr}:{e.master_port}",
             local_ranks=parallel.local_world_size(settings))
    executor = MultiprocExecutor(config, monitor_workers=False)  # returns once every rank has joined
    try:
        executor.start_worker_monitor()  # a thread: a dead worker marks the executor failed and shuts it down
        log.info("worker_node_ready", node_rank=e.node_rank)
        misses = 0
        while not executor.is_failed:
            time.sleep(_PROBE_INTERVAL_S)
            misses = 0 if _reachable(e.master_addr, e.master_port) else misses + 1
            if misses >= _PROBE_MISSES:
                log.error("worker_node_lost_node_0", master=f"{e.master_addr}:{e.master_port}",
                          after_s=misses * _PROBE_INTERVAL_S)
                return 1
        log.error("worker_node_worker_died", node_rank=e.node_rank)
        return 1
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        executor.shutdown()
