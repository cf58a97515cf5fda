"""Large request bodies are parsed and validated in a worker process, off the event loop (issue 33).

The event loop serves every stream of this frontend, and JSON parsing and pydantic validation are single C calls
that hold the GIL from start to end: a 15 MB chat of 500,000 empty messages kept the loop for ~12 s here, every
stream on it froze, and past `--frontend-timeout-s` the backend declared the frontend lost and aborted them all.
A thread cannot help (it would hold the GIL as long), so a body over INLINE_BODY_BYTES goes to one worker process
per frontend: it parses the JSON with the same decoder FastAPI uses, refuses lists longer than the served context
before validating their items (`check_counts`), validates with the route's pydantic model, and sends back the
model (bounded by those counts) or the first error (without its input). FastAPI then takes the model as it is
(pydantic does not validate an instance of the model again). Smaller bodies take FastAPI's own path, inline:
64 KiB parse and validate in about a millisecond.

One worker, at a lower priority (nice 10), bounds the CPU that parsing can take to one core, and yields it to the
processes that serve streams; big bodies wait for each other there, small ones never do. A worker that dies is
replaced, and the request it had is answered 503.
"""

from __future__ import annotations

import asyncio
import email.message
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from frontend.errors import ApiError

INLINE_BODY_BYTES = 64 * 1024


def check_counts(messages: int, tokens: int, max_model_len: int | None,
                 messages_param: str = "messages") -> ApiError | None:
    """The lists that cost per item and can never fit the context: the same 400s as the backend's processor
    (backend/processor/cost.py), refused here before their items are validated or sent."""
    if max_model_len is None:  # no backend yet: the route answers 503
        return None
    if messages > max_model_len:
        return ApiError(400, f"{messages} messages: more than this model's maximum context length "
                             f"({max_model_len} tokens) can hold", param=messages_param)
    if tokens > max_model_len:
        return ApiError(400, f"{tokens} tokens: more than this model's maximum context length ({max_model_len})",
                        param="tokens")
    return None


def _length(obj: Any, key: str) -> int:
    value = obj.get(key) if isinstance(obj, dict) else None
    return len(value) if isinstance(value, list) else 0


def parse(model: type[BaseModel], body: bytes, max_model_len: int | None, counted: tuple[str, ...]):
    """In the worker: ("ok", model instance), ("error", first validation error) or ("refused", ApiError args)."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:  # the error FastAPI makes of it
        return "error", {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                         "input": {}, "ctx": {"error": e.msg}}
    # /v1/responses' `input` items become chat messages.
    listed = "input" if "input" in counted else "messages"
    refusal = check_counts(_length(obj, listed) if listed in counted else 0,
                           _length(obj, "tokens") if "tokens" in counted else 0, max_model_len, listed)
    if refusal is not None:
        return "refused", (refusal.status, refusal.message, refusal.param)
    try:
        return "ok", model.model_validate(obj)
    except ValidationError as e:
        first = e.errors(include_url=False, include_input=False)[0]
        # ctx may hold the validator's exception object: its text is what the error handler reads.
        ctx = {k: str(v) for k, v in first.get("ctx", {}).items()}
        return "error", {**first, "loc": ("body", *first["loc"]), "ctx": ctx}


# The worker's nice value: on a machine of few cores, parsing a hostile body yields the CPU to the processes
# that serve streams (the engine, the processor, this frontend's loop).
WORKER_NICE = 10


def _init_worker() -> None:
    """In the worker, once: a lower priority, and the models imported before the first big body."""
    import os

    os.nice(WORKER_NICE)
    import frontend.openai_models  # noqa: F401


class BodyWorker:
    """The worker process, started at the app's start; replaced if it dies."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        # spawn: a fork of a process with a running event loop and ZMQ sockets is not safe.
        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_init_worker)
        self._pool.submit(int)  # starts the worker now rather than at the first big body

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def parse(self, model: type[BaseModel], body: bytes, max_model_len: int | None,
                    counted: tuple[str, ...]):
        if self._pool is None:
            self.start()
        assert self._pool is not None
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, parse, model, body, max_model_len,
                                                                    counted)
        except BrokenProcessPool:
            self.close()
            raise ApiError(503, "the request body's parser process failed; try again") from None


class _Parsed(Request):
    """The request with its body already read and its model built (FastAPI's documented way to change how a
    route reads its body: a Request subclass)."""

    def __init__(self, request: Request, body: bytes, value: BaseModel) -> None:
        super().__init__(request.scope, request.receive)
        self._raw, self._value = body, value

    async def body(self) -> bytes:
        return self._raw

    async def json(self) -> Any:
        return self._value


def _is_json(request: Request) -> bool:
    """The bodies FastAPI parses as JSON (a content type application/json or application/*+json); the others take
    FastAPI's own path."""
    value = request.headers.get("content-type")
    if not value:
        return False
    message = email.message.Message()
    message["content-type"] = value
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


class OffloadRoute(APIRoute):
    """An APIRoute whose large JSON bodies are parsed in the worker (the app's `state.body_worker`). The lists
    named `messages`, `input` (/v1/responses' items, which become messages) or `tokens` in the body model are held
    to the served context there."""

    def get_route_handler(self):
        handler = super().get_route_handler()
        annotation = self.body_field.field_info.annotation if self.body_field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return handler
        model: type[BaseModel] = annotation
        counted = tuple(name for name in ("messages", "input", "tokens") if name in model.model_fields)

        async def route_handler(request: Request):
            if _is_json(request):
                body = await request.body()
                if len(body) > INLINE_BODY_BYTES:
                    client = getattr(request.app.state, "client", None)
                    fingerprint = getattr(client, "fingerprint", None)
                    max_len = fingerprint.max_model_len if fingerprint is not None else None
                    outcome, value = await request.app.state.body_worker.parse(model, body, max_len, counted)
                    if outcome == "refused":
                        status, message, param = value
                        raise ApiError(status, message, param=param)
                    if outcome == "error":
                        raise RequestValidationError([value])
                    request = _Parsed(request, body, value)
            return await handler(request)

        return route_handler
