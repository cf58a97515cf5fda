"""Backend process entry: settings, logging, model, sockets, the processor process, the engine, then the engine
loop on this thread. On a worker node of a multi-node engine (--node-rank > 0), only that node's workers.

Shape copied from vLLM's run_engine_core: signal handlers only set a flag; any engine failure (or the
processor's death) sends a dead sentinel to every frontend and exits non-zero so the supervisor restarts us.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import tempfile
import time
import uuid
from multiprocessing.context import SpawnProcess
from pathlib import Path

import structlog
import zmq

from backend.core.heap import HeapTrimmer
from backend.core.heap_profile import HeapProfiler
from backend.engine import compat
from backend.errors import fatal_reason
from backend.pow.store import StoreError, open_store
from backend.processor import engine_address, link_address
from backend.startup import fork_env
from backend.startup.settings import BackendSettings, load_settings
from backend.transport.control import ControlPlane
from backend.transport.curve import CurveGate
from backend.transport.peers import PeerTable
from backend.transport.server import SocketServer, shut_down
from common.config import SettingsError
from common.logs import configure_logging, process_uptime_s
from common.process import REFUSED, freeze_startup_heap, refuse, set_title
from protocol.control import DeadEvent
from protocol.processor import EngineBuilt

log = structlog.get_logger("backend")

# How this process names itself: in `ps` and at the head of a refusal on stderr.
PROG = "pocserve-backend"

# After the engine died: how long the socket stays up answering every frame with the dead sentinel (see
# SocketServer.send_dead), two pings at the frontends' default interval.
_DEAD_LINGER_S = 1.0
# How long a stopping processor process gets before it is killed.
_PROCESSOR_STOP_S = 5.0


class ProcessorDied(RuntimeError):
    pass


def _prepare_address(address: str) -> None:
    if address.startswith("ipc://"):
        Path(address.removeprefix("ipc://")).parent.mkdir(parents=True, exist_ok=True)


def start_processor(settings: BackendSettings, link_dir: str) -> SpawnProcess:
    """The processor process; it connects to both of our sockets in `link_dir` (backend/processor/__init__.py)
    whenever they are bound."""
    from backend.processor.entry import run_processor
    proc = multiprocessing.get_context("spawn").Process(target=run_processor, args=(settings, link_dir),
                                                        name="pocserve-processor", daemon=True)
    proc.start()
    return proc


def stop_processor(proc: SpawnProcess) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(_PROCESSOR_STOP_S)
        if proc.is_alive():
            proc.kill()
            proc.join(_PROCESSOR_STOP_S)


def build_loop(settings: BackendSettings, engine, server: SocketServer, inbox: queue.Queue, control: ControlPlane,
               store, processor: SpawnProcess, to_processor):
    """The engine loop with its collaborators; frontends are admitted once the processor is ready. What chat sends
    the processor goes out on the engine thread's own socket, `to_processor` (an EngineOut,
    backend/processor/link.py); its replies to frontends through the io thread."""
    from backend.core.chat import ChatRequests
    from backend.core.loop import BackendLoop
    from backend.core.share import ChatShare
    from backend.engine.faults import FaultyEngine
    from backend.pow.artifact_queue import ArtifactQueue
    from backend.pow.service import build_pow_service

    built = EngineBuilt(num_gpu_blocks=engine.num_gpu_blocks, max_model_len=engine.max_model_len)
    if settings.fault_fail_on_step:
        engine = FaultyEngine(engine, settings.fault_fail_on_step)
    fingerprint = engine.fingerprint()

    def on_processor_ready() -> None:
        to_processor.send(built)
        control.fingerprint = fingerprint  # frontends are admitted (Hello → Ready) from now on

    def check_processor() -> None:
        if not processor.is_alive():
            raise ProcessorDied(f"the processor process exited with code {processor.exitcode}")

    chat = ChatRequests(engine, server.send, to_processor.send, on_ready=on_processor_ready)
    artifacts = ArtifactQueue(engine.poc)
    pow_service = build_pow_service(settings, artifacts, chat, server.send, store,
                                    [fingerprint.served_model_name, fingerprint.model_path])
    return BackendLoop(engine, inbox, control, chat=chat, pow=pow_service, artifacts=artifacts, send=server.send,
                       share=ChatShare(settings.chat_share),
                       timers=(pow_service.on_timer, check_processor))


def serve(settings: BackendSettings) -> int:
    from backend.engine.parallel import check_topology

    if settings.generate_model != "none":
        from backend.tools.modelgen import ensure_model
        ensure_model(settings.model, settings.generate_model)
    try:
        check_topology(settings)  # the parallel sizes against the model and the machine, before any worker
    except SettingsError as e:
        return refuse(PROG, e)
    if settings.engine.node_rank > 0:
        from backend.engine.headless import run_worker_node
        return run_worker_node(settings)
    try:
        store = open_store(settings.state_dir)  # a locked or corrupt file fails here, before the engine loads
    except StoreError as e:
        log.error("state_store_unusable", error=str(e))
        return REFUSED
    ctx = zmq.Context()  # ours alone: shut_down terminates it
    inbox: queue.Queue = queue.Queue()
    control = ControlPlane(instance_id=uuid.uuid4().hex)
    _prepare_address(settings.address)
    gate = None
    if settings.curve_server_secret_key_file is not None and settings.curve_clients_dir is not None:
        gate = CurveGate(settings.curve_server_secret_key_file, settings.curve_clients_dir)
    link_dir = tempfile.mkdtemp(prefix="pocserve-")
    server = SocketServer(ctx, settings.address, inbox, control, gate=gate,
                          peers=PeerTable(settings.frontend_timeout_s), link_address=link_address(link_dir))
    server.start()

    # The processor first: its own vLLM import and config take as long as ours, and it is on the start's critical
    # path (frontends are admitted once it is ready). It connects to our sockets whenever they are bound.
    processor = start_processor(settings, link_dir)
    from backend.processor.link import EngineOut, EngineSide  # import vLLM: after the socket is up (probes see us)
    server.attach_link(EngineSide())
    to_processor = EngineOut(ctx, engine_address(link_dir))  # the engine loop's, on this thread

    from backend.engine.adapter import Engine
    from backend.engine.args import allreduce_fusion, multicast_switched_off
    from backend.processor.parsing import check_parser_names

    engine = loop = None
    trimmer = HeapTrimmer(settings.heap_trim_interval_s).start()
    profiler = HeapProfiler.from_env()  # a leak hunt's figures (docs/troubleshooting.md); None normally
    if profiler is not None:
        profiler.start()
    try:
        # vLLM's registries, so not earlier
        check_parser_names(settings.vllm.tool_call_parser, settings.engine.reasoning_parser or "")
        if settings.engine.tensor_parallel_size > 1 and not allreduce_fusion(settings.allreduce_fusion, os.environ):
            log.info("allreduce_fusion_off", setting=settings.allreduce_fusion,
                     multicast_switched_off_by=multicast_switched_off(os.environ))
        log.info("engine_starting", uptime_s=process_uptime_s())
        engine = Engine(settings)
        loop = build_loop(settings, engine, server, inbox, control, store, processor, to_processor)
        if profiler is not None:
            profiler.counters = loop.work_counts

        def stop(signum, _frame) -> None:
            log.info("shutdown_requested", signal=signal.Signals(signum).name)
            loop.is_running = False

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info("backend_serving", address=settings.address, model=settings.vllm.served_names[0],
                 heap_frozen_objects=freeze_startup_heap())
        loop.run()
        return 0
    except SettingsError as e:  # found once the engine was built (vLLM's own checks, a model without layers)
        return refuse(PROG, e)
    except Exception as e:
        log.exception("engine_dead", error=str(e))
        server.send_dead(DeadEvent(reason=fatal_reason(e)[:500]))
        time.sleep(_DEAD_LINGER_S)
        return 1
    finally:
        trimmer.stop()
        if profiler is not None:
            profiler.stop()
        to_processor.close()  # before shut_down: terminating the context waits for every socket of it
        shut_down(server, ctx)
        stop_processor(processor)
        if loop is not None:
            loop.pow.callbacks.close()  # before the store: acknowledged rows must still be deleted
        store.close()
        if engine is not None:
            engine.core.shutdown()  # TP/PP workers are processes of their own: stop them, never leave them behind
        _remove_dir(link_dir)


def _remove_dir(path: str) -> None:
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


def main(argv: list[str] | None = None) -> None:
    # First of all: torch reads the CPU engine's OpenMP thread count once, when it loads, and the link codec, the
    # model generator and the engine all import it. Set later, the engine ran two spinning threads on two cores
    # and its steps slowed ~10x whenever anything else ran.
    compat.prepare_environment()
    try:
        settings = load_settings(argv)
    except SettingsError as e:
        sys.exit(refuse(PROG, e))
    configure_logging(settings.log_format, settings.log_level)
    fork_env.warn_if_set(os.environ)  # the fork's variables that do nothing here (README: "The fork's variables")
    for flag, note in settings.vllm.notes:  # e.g. dtype_overridden: the fork's dtype rule
        log.warning(flag.removeprefix("--").replace("-", "_") + "_overridden", note=note)
    set_title(PROG)
    code = serve(settings)
    sys.stdout.flush()
    # vLLM leaves non-daemon threads behind on some paths; the exit code is what the supervisor needs.
    os._exit(code)


if __name__ == "__main__":
    main()
