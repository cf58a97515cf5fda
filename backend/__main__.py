"""Backend process entry: settings, logging, model, socket, engine, then the engine loop on this thread.

Shape copied from vLLM's run_engine_core: signal handlers only set a flag; any engine failure sends a dead
sentinel to every frontend and exits non-zero so the supervisor restarts the process.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import time
import uuid
from pathlib import Path

import structlog
import zmq

from backend.control import ControlPlane
from backend.curve import CurveGate
from backend.ipc import SocketServer, shut_down
from backend.peers import PeerTable
from backend.settings import BackendSettings, load_settings
from backend.store import StoreError
from backend.wiring import open_store
from protocol.config import SettingsError
from protocol.control import DeadEvent
from protocol.logs import configure_logging

log = structlog.get_logger("backend")

# After the engine died: how long the socket stays up answering every frame with the dead sentinel (see
# SocketServer.send_dead), two pings at the frontends' default interval.
_DEAD_LINGER_S = 1.0


def _prepare_address(address: str) -> None:
    if address.startswith("ipc://"):
        Path(address.removeprefix("ipc://")).parent.mkdir(parents=True, exist_ok=True)


def serve(settings: BackendSettings) -> int:
    if settings.generate_model != "none":
        from backend.modelgen import ensure_model
        ensure_model(settings.model, settings.generate_model)
    try:
        store = open_store(settings.state_dir)  # a locked or corrupt file fails here, before the engine loads
    except StoreError as e:
        log.error("state_store_unusable", error=str(e))
        return 2
    ctx = zmq.Context()  # ours alone: shut_down terminates it
    inbox: queue.Queue = queue.Queue()
    control = ControlPlane(instance_id=uuid.uuid4().hex)
    _prepare_address(settings.address)
    gate = (CurveGate(settings.curve_server_secret_key_file, settings.curve_clients_dir)
            if settings.curve_server_secret_key_file is not None else None)
    server = SocketServer(ctx, settings.address, inbox, control, gate=gate,
                          peers=PeerTable(settings.frontend_timeout_s))
    server.start()

    from backend.engine.adapter import Engine  # imports vLLM: after the socket is up, so probes see us early
    from backend.faults import FaultyEngine
    from backend.loop import BackendLoop
    from backend.wiring import make_pow_service

    loop = None
    try:
        engine = Engine(settings)
        if settings.fault_fail_on_step:
            engine = FaultyEngine(engine, settings.fault_fail_on_step)
        loop = BackendLoop(engine, server, inbox, control, poc_batches_per_step=settings.poc_batches_per_step)
        loop.use_pow(make_pow_service(settings, engine, loop, server, store))
        control.fingerprint = engine.fingerprint()

        def stop(signum, _frame) -> None:
            log.info("shutdown_requested", signal=signal.Signals(signum).name)
            loop.is_running = False

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info("backend_serving", address=settings.address, model=settings.model_name)
        loop.run()
        return 0
    except Exception as e:
        log.exception("engine_dead", error=str(e))
        server.send_dead(DeadEvent(reason=f"engine failed: {e}"[:500]))
        time.sleep(_DEAD_LINGER_S)
        return 1
    finally:
        shut_down(server, ctx)
        if loop is not None and loop.pow is not None:
            loop.pow.callbacks.close()  # before the store: acknowledged rows must still be deleted
        store.close()


def main(argv: list[str] | None = None) -> None:
    try:
        settings = load_settings(argv)
    except SettingsError as e:
        print(f"pocserve-backend: {e}", file=sys.stderr)
        sys.exit(2)
    configure_logging(settings.log_format, settings.log_level)
    try:
        import setproctitle
        setproctitle.setproctitle("pocserve-backend")
    except ImportError:
        pass
    code = serve(settings)
    sys.stdout.flush()
    # vLLM leaves non-daemon threads behind on some paths; the exit code is what the supervisor needs.
    os._exit(code)


if __name__ == "__main__":
    main()
