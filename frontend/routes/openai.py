"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from frontend import convert, sse
from frontend.backend_client import BackendRequestError, BackendUnavailable
from frontend.errors import ApiError, error_body
from frontend.openai_models import ChatCompletionRequest, CompletionRequest
from frontend.openapi import SSE, errors
from protocol.generate import Delta, GenerateRequest

router = APIRouter()


def _served_names(request: Request) -> list[str]:
    fp = request.app.state.client.fingerprint
    if fp is None:
        raise BackendUnavailable("backend not ready")
    return [fp.served_model_name, fp.model_path, *fp.model_aliases]


def _check_model(request: Request, model: str) -> None:
    if model not in _served_names(request):
        raise ApiError(404, f"The model `{model}` does not exist.", param="model", type="NotFoundError")


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _first_and_rest(agen: AsyncIterator[Delta]) -> tuple[Delta, AsyncIterator[Delta]]:
    """Awaits the first delta so errors become a plain HTTP error instead of a broken stream."""
    first = await agen.__anext__()
    return first, agen


async def _until_done(request: Request, first: Delta, rest: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    """Streaming: the request's deltas until the finishing one, ending early if the client goes away.

    Closing `rest` (in every case) aborts the request in the backend when it has not finished. The watcher
    does not rely on a failed write noticing the disconnect, which can lag behind a closed socket."""
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        d = first
        while True:
            yield d
            if d.finish_reason is not None or gone.done():
                return
            d = await rest.__anext__()
    finally:
        gone.cancel()
        await rest.aclose()


async def _collect(request: Request, gen: GenerateRequest) -> Delta:
    """Non-streaming: gathers all deltas; a client that goes away cancels this handler, which aborts the
    request in the backend (one watcher task per request, no second task for the work itself)."""
    client = request.app.state.client
    handler = asyncio.current_task()

    def on_gone(watcher: asyncio.Future) -> None:
        if not watcher.cancelled():
            handler.cancel()

    gone = asyncio.ensure_future(_wait_disconnect(request))
    gone.add_done_callback(on_gone)
    try:
        deltas = [d async for d in client.generate(gen)]
    except asyncio.CancelledError:
        if gone.done() and not gone.cancelled():
            raise ApiError(499, "client disconnected") from None
        raise
    finally:
        gone.remove_done_callback(on_gone)
        gone.cancel()
    return convert.merge(deltas)


def _error_event(e: Exception) -> bytes:
    status = 503 if isinstance(e, BackendUnavailable) else e.info.status
    return sse.event(error_body(status, str(e)))


def _observe_ttft(request: Request, route: str, started: float) -> None:
    request.app.state.metrics.ttft.labels(route).observe(time.monotonic() - started)


@router.get("/v1/models", responses=errors(503))
async def list_models(request: Request) -> dict:
    fp = request.app.state.client.fingerprint
    if fp is None:
        raise BackendUnavailable("backend not ready")
    card = {"id": fp.served_model_name, "object": "model", "created": 0, "owned_by": "pocserve",
            "root": fp.model_path, "max_model_len": fp.max_model_len}
    return {"object": "list", "data": [card]}


@router.post("/v1/chat/completions", responses={**SSE, **errors(400, 404, 413, 503)})
async def chat_completions(body: ChatCompletionRequest, request: Request):
    _check_model(request, body.model)
    client, fmt = request.app.state.client, request.app.state.token_format
    gen = convert.chat_request(client.new_rid(), body)
    rid, created, started = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), time.monotonic()

    def chunk(delta: dict, finish: str | None = None, logprobs=None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": body.model,
                "choices": [choice]}

    if not body.stream:
        d = await _collect(request, gen)
        logprobs = {"content": fmt.chat_logprobs(d.logprobs)} if d.logprobs is not None else None
        choice = {"index": 0, "message": {"role": "assistant", "content": d.text}, "logprobs": logprobs,
                  "finish_reason": d.finish_reason, "stop_reason": d.stop_reason}
        # A ready JSONResponse: the body is plain data, FastAPI's encoder pass would only cost time.
        return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": body.model,
                             "choices": [choice], "usage": convert.usage(d)})

    first, rest = await _first_and_rest(client.generate(gen))
    _observe_ttft(request, "chat", started)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def stream():
        last = first
        try:
            yield sse.event(chunk({"role": "assistant", "content": ""}))
            async for d in _until_done(request, first, rest):
                lp = {"content": fmt.chat_logprobs(d.logprobs)} if d.logprobs is not None else None
                if d.text or lp or d.finish_reason:
                    yield sse.event(chunk({"content": d.text} if d.text else {}, d.finish_reason, lp))
                last = d
            if include_usage:
                yield sse.event({"id": rid, "object": "chat.completion.chunk", "created": created,
                                 "model": body.model, "choices": [], "usage": convert.usage(last)})
            yield sse.DONE
        except (BackendUnavailable, BackendRequestError) as e:
            yield _error_event(e)
            yield sse.DONE

    return StreamingResponse(stream(), media_type="text/event-stream")


@router.post("/v1/completions", responses={**SSE, **errors(400, 404, 413, 503)})
async def completions(body: CompletionRequest, request: Request):
    _check_model(request, body.model)
    client, fmt = request.app.state.client, request.app.state.token_format
    gen = convert.completion_request(client.new_rid(), body)
    rid, created, started = f"cmpl-{uuid.uuid4().hex}", int(time.time()), time.monotonic()

    def choice(d: Delta, offset: int) -> dict:
        lp = fmt.completion_logprobs(d.logprobs, offset) if d.logprobs is not None else None
        return {"index": 0, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason,
                "stop_reason": d.stop_reason}

    if not body.stream:
        d = await _collect(request, gen)
        return JSONResponse({"id": rid, "object": "text_completion", "created": created, "model": body.model,
                             "choices": [choice(d, 0)], "usage": convert.usage(d)})

    first, rest = await _first_and_rest(client.generate(gen))
    _observe_ttft(request, "completions", started)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def stream():
        offset, last = 0, first
        try:
            async for d in _until_done(request, first, rest):
                yield sse.event({"id": rid, "object": "text_completion", "created": created,
                                 "model": body.model, "choices": [choice(d, offset)]})
                offset, last = offset + len(d.text), d
            if include_usage:
                yield sse.event({"id": rid, "object": "text_completion", "created": created,
                                 "model": body.model, "choices": [], "usage": convert.usage(last)})
            yield sse.DONE
        except (BackendUnavailable, BackendRequestError) as e:
            yield _error_event(e)
            yield sse.DONE

    return StreamingResponse(stream(), media_type="text/event-stream")
