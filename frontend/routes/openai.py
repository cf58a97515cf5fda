"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.

Both generation routes share one request path (`_generate`): validate → convert → await the backend client →
shape. What differs between chat and completions is only the shape of the JSON, in a `Shape` object
(frontend/shape.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from frontend import convert, sse
from frontend.backend_client import BackendRequestError, BackendUnavailable
from frontend.body import OffloadRoute
from frontend.errors import ApiError, backend_error_body
from frontend.openai_models import ChatCompletionRequest, CompletionRequest
from frontend.openapi import SSE, errors
from frontend.shape import ChatShape, CompletionShape
from protocol.generate import Delta, GenerateRequest

router = APIRouter(route_class=OffloadRoute)  # large bodies are parsed off the loop (frontend/body.py)

# A non-streaming request starts watching for a client disconnect once it has taken this long.
_WATCH_AFTER_S = 0.05


def _served_names(request: Request) -> list[str]:
    fp = request.app.state.client.fingerprint
    if fp is None:
        raise BackendUnavailable("backend not ready")
    return [fp.served_model_name, fp.model_path, *fp.model_aliases]


def check_model(request: Request, model: str) -> None:
    if model not in _served_names(request):
        raise ApiError(404, f"The model `{model}` does not exist.", param="model")


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _until_done(request: Request, first: Delta, rest: AsyncGenerator[Delta, None], n: int
                      ) -> AsyncIterator[Delta]:
    """Streaming: the request's deltas until each of its `n` choices has finished, ending early if the client goes
    away.

    Closing `rest` (in every case) aborts the request in the backend when it has not finished. The watcher
    does not rely on a failed write noticing the disconnect, which can lag behind a closed socket."""
    gone = asyncio.ensure_future(_wait_disconnect(request))
    num_running = n
    try:
        d = first
        while True:
            yield d
            if d.finish_reason is not None:
                num_running -= 1
            if num_running == 0 or gone.done():
                return
            d = await rest.__anext__()
    finally:
        gone.cancel()
        await rest.aclose()


async def _collect(request: Request, gen: GenerateRequest) -> list[Delta]:
    """Non-streaming: gathers all deltas; a client that goes away cancels this handler, which aborts the
    request in the backend. The disconnect watcher (a task) starts only once the answer has taken
    _WATCH_AFTER_S: most short answers come sooner, and for them the task was a tenth of the frontend's cost. A
    disconnect that came earlier is still seen, since the watcher reads the queued http.disconnect first."""
    client = request.app.state.client
    handler = asyncio.current_task()
    assert handler is not None, "a route handler runs in a task"
    gone: asyncio.Future | None = None

    def on_gone(watcher: asyncio.Future) -> None:
        if not watcher.cancelled():
            handler.cancel()

    def watch() -> None:
        nonlocal gone
        gone = asyncio.ensure_future(_wait_disconnect(request))
        gone.add_done_callback(on_gone)

    timer = asyncio.get_running_loop().call_later(_WATCH_AFTER_S, watch)
    try:
        deltas = [d async for d in client.generate(gen)]
    except asyncio.CancelledError:
        if gone is not None and gone.done() and not gone.cancelled():
            raise ApiError(499, "client disconnected") from None
        raise
    finally:
        timer.cancel()
        if gone is not None:
            gone.remove_done_callback(on_gone)
            gone.cancel()
    return deltas


async def _generate(request: Request, body: ChatCompletionRequest | CompletionRequest,
                    shape: ChatShape | CompletionShape):
    check_model(request, body.model)
    client = request.app.state.client
    if isinstance(body, ChatCompletionRequest):
        gen = convert.chat_request(client.new_rid(), body)
    else:
        gen = convert.completion_request(client.new_rid(), body)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if not gen.stream:
        deltas = await _collect(request, gen)
        # Encoded here, by msgspec: the body is plain data, FastAPI's encoder pass and json.dumps only cost time.
        return Response(msgspec.json.encode(shape.response(convert.merge_choices(deltas), deltas[-1])),
                        media_type="application/json")
    started = time.monotonic()
    rest = client.generate(gen)
    first = await rest.__anext__()  # errors before the first delta are a plain HTTP error, not a broken stream
    request.app.state.metrics.ttft.labels(shape.route).observe(time.monotonic() - started)

    async def stream() -> AsyncIterator[bytes]:
        last: dict[int, Delta] = {first.index: first}
        try:
            for chunk in shape.preamble(gen.sampling.n, first.num_prompt_tokens):
                yield sse.event(chunk)
            async for d in _until_done(request, first, rest, gen.sampling.n):
                for chunk in shape.chunks(d):
                    yield sse.event(chunk)
                last[d.index] = d
            if include_usage:
                yield sse.event(shape.usage_chunk(last, first))
            yield sse.DONE
        except (BackendUnavailable, BackendRequestError) as e:
            yield sse.event(backend_error_body(e))  # as the same error would answer before the stream
            yield sse.DONE

    return StreamingResponse(stream(), media_type="text/event-stream")


def _continuous_usage(body: ChatCompletionRequest | CompletionRequest) -> bool:
    """vllm serve's rule: usage on every chunk needs both include_usage and continuous_usage_stats."""
    options = body.stream_options
    return bool(body.stream and options and options.include_usage and options.continuous_usage_stats)


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
    shape = ChatShape("chat", body.model, request.app.state.token_format,
                      is_continuous_usage=_continuous_usage(body),
                      is_prompt_details=request.app.state.is_prompt_details)
    return await _generate(request, body, shape)


@router.post("/v1/completions", responses={**SSE, **errors(400, 404, 413, 503)})
async def completions(body: CompletionRequest, request: Request):
    shape = CompletionShape("completions", body.model, request.app.state.token_format,
                            is_continuous_usage=_continuous_usage(body),
                            is_prompt_details=request.app.state.is_prompt_details)
    return await _generate(request, body, shape)
