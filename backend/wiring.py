"""Builds the PoC API's collaborators from settings (store, queue, callback sender, service)."""

from __future__ import annotations

from pathlib import Path

import structlog

from backend.settings import BackendSettings
from backend.store import Store

log = structlog.get_logger(__name__)

DB_NAME = "pocserve.db"


def open_store(state_dir: Path) -> Store:
    state_dir.mkdir(parents=True, exist_ok=True)
    return Store(state_dir / DB_NAME)


def make_pow_service(settings: BackendSettings, engine, loop, server, store: Store):
    from backend.callbacks import CallbackSender
    from backend.jobs import GenerateQueue
    from backend.pow_service import PowService

    jobs = GenerateQueue(store, max_queued_nonces=settings.max_queued_nonces, result_ttl_s=settings.result_ttl_s)
    jobs.load()
    callbacks = CallbackSender(store, interval_s=settings.callback_interval_s,
                               max_retries=settings.callback_max_retries, max_outbox=settings.callback_queue_size,
                               max_concurrent=settings.callback_max_concurrent)
    fp = engine.fingerprint()
    log.info("pow_state_loaded", num_queued_jobs=jobs.num_queued, num_undelivered_callbacks=callbacks.backlog)
    return PowService(artifacts=loop.artifacts, jobs=jobs, callbacks=callbacks, send=server.send,
                      abort_chat=loop.abort_all_chat, model_names=[fp.served_model_name, fp.model_path],
                      mode=settings.scheduling_mode, default_batch_size=settings.batch_size_default,
                      stop_flush_timeout_s=settings.stop_flush_timeout_s)
