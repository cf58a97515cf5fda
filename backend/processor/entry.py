"""The processor process's entry (a multiprocessing spawn target): environment first, vLLM after."""

from __future__ import annotations

import os
import signal

from backend.startup.settings import BackendSettings
from common.process import die_with_parent, freeze_startup_heap, set_title


def run_processor(settings: BackendSettings, link_dir: str) -> None:
    die_with_parent()  # the engine process's end is ours, even when it is killed outright
    # The engine process decides when we stop (SIGTERM): a Ctrl-C or the ML node's SIGINT to the process group
    # must not kill us before the engine process has sent its last frames through us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["OMP_NUM_THREADS"] = "1"  # tokenizing needs no torch threads; set before torch is imported
    from backend.engine import compat
    compat.prepare_environment()

    import structlog
    import zmq

    from backend.processor import engine_address, link_address
    from backend.processor.build import build
    from backend.processor.direct import DirectDeltas, bind_address
    from backend.processor.main import Processor
    from common.logs import configure_logging, process_uptime_s
    from common.sockets import make_socket

    configure_logging(settings.log_format, settings.log_level)
    set_title("pocserve-processor")
    phases_s = {"imports_done_at": process_uptime_s()}  # after vLLM's import, from the spawn
    preparer, presenter, tokenizing, ready = build(settings, phases_s)
    ctx = zmq.Context()
    link, engine = make_socket(ctx, zmq.PAIR), make_socket(ctx, zmq.PAIR)
    link.connect(link_address(link_dir))
    engine.connect(engine_address(link_dir))
    direct = DirectDeltas.open(ctx, bind_address(settings.deltas_address, settings.address), _curve_gate(settings))
    ready.deltas_endpoint = direct.endpoint if direct is not None else None
    structlog.get_logger(__name__).info("processor_ready", pid=os.getpid(), uptime_s=process_uptime_s(),
                                        heap_frozen_objects=freeze_startup_heap(), **phases_s)
    Processor(ctx, link, engine, preparer, presenter, tokenizing, direct).run(ready)


def _curve_gate(settings: BackendSettings):
    """The same keys and clients as the backend's own socket (its gate is the engine process's)."""
    if settings.curve_server_secret_key_file is None or settings.curve_clients_dir is None:
        return None
    from backend.transport.curve import CurveGate
    return CurveGate(settings.curve_server_secret_key_file, settings.curve_clients_dir)
