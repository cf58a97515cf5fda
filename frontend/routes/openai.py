"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.

Both generation routes share one request path (`_generate`): validate → convert → await the backend client →
shape. What differs between chat and completions is only the shape of the JSON, in a `Shape` object.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from frontend import convert, sse
from frontend.backend_client import BackendRequestError, BackendUnavailable
from frontend.convert import TokenFormat
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


async def _until_done(request: Request, first: Delta, rest: AsyncGenerator[Delta, None]) -> AsyncIterator[Delta]:
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
    assert handler is not None, "a route handler runs in a task"

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


def _error_event(e: BackendUnavailable | BackendRequestError) -> bytes:
    status = 503 if isinstance(e, BackendUnavailable) else e.info.status
    return sse.event(error_body(status, str(e)))


class Shape:
    """How one route shapes its answers: the JSON of a whole response, of stream chunks, of the usage chunk."""

    def __init__(self, kind: str, model: str, fmt: TokenFormat) -> None:
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.fmt = fmt

    def envelope(self, obj: str, choices: list[dict], **extra: Any) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}


class ChatShape(Shape):
    route = "chat"
    chunk_object = "chat.completion.chunk"

    def response(self, d: Delta) -> dict:
        logprobs = {"content": self.fmt.chat_logprobs(d.logprobs)} if d.logprobs is not None else None
        choice = {"index": 0, "message": {"role": "assistant", "content": d.text}, "logprobs": logprobs,
                  "finish_reason": d.finish_reason, "stop_reason": d.stop_reason}
        return self.envelope("chat.completion", [choice], usage=convert.usage(d))

    def preamble(self) -> list[dict]:
        """The first chunk gives the role, as OpenAI's does."""
        return [self._chunk({"role": "assistant", "content": ""})]

    def chunks(self, d: Delta) -> list[dict]:
        lp = {"content": self.fmt.chat_logprobs(d.logprobs)} if d.logprobs is not None else None
        if not (d.text or lp or d.finish_reason):
            return []
        return [self._chunk({"content": d.text} if d.text else {}, d.finish_reason, lp)]

    def _chunk(self, delta: dict, finish: str | None = None, logprobs: dict | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return self.envelope(self.chunk_object, [choice])


class CompletionShape(Shape):
    route = "completions"
    chunk_object = "text_completion"

    def __init__(self, kind: str, model: str, fmt: TokenFormat) -> None:
        super().__init__(kind, model, fmt)
        self._offset = 0  # characters streamed so far: logprobs text_offset continues from here

    def response(self, d: Delta) -> dict:
        return self.envelope("text_completion", [self._choice(d, 0)], usage=convert.usage(d))

    def preamble(self) -> list[dict]:
        return []

    def chunks(self, d: Delta) -> list[dict]:
        chunk = self.envelope(self.chunk_object, [self._choice(d, self._offset)])
        self._offset += len(d.text)
        return [chunk]

    def _choice(self, d: Delta, offset: int) -> dict:
        lp = self.fmt.completion_logprobs(d.logprobs, offset) if d.logprobs is not None else None
        return {"index": 0, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason,
                "stop_reason": d.stop_reason}


async def _generate(request: Request, body: ChatCompletionRequest | CompletionRequest,
                    shape: ChatShape | CompletionShape):
    _check_model(request, body.model)
    client = request.app.state.client
    if isinstance(body, ChatCompletionRequest):
        gen = convert.chat_request(client.new_rid(), body)
    else:
        gen = convert.completion_request(client.new_rid(), body)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if not gen.stream:
        # A ready JSONResponse: the body is plain data, FastAPI's encoder pass would only cost time.
        return JSONResponse(shape.response(await _collect(request, gen)))
    started = time.monotonic()
    rest = client.generate(gen)
    first = await rest.__anext__()  # errors before the first delta are a plain HTTP error, not a broken stream
    request.app.state.metrics.ttft.labels(shape.route).observe(time.monotonic() - started)

    async def stream() -> AsyncIterator[bytes]:
        last = first
        try:
            for chunk in shape.preamble():
                yield sse.event(chunk)
            async for d in _until_done(request, first, rest):
                for chunk in shape.chunks(d):
                    yield sse.event(chunk)
                last = d
            if include_usage:
                yield sse.event(shape.envelope(shape.chunk_object, [], usage=convert.usage(last)))
            yield sse.DONE
        except (BackendUnavailable, BackendRequestError) as e:
            yield _error_event(e)
            yield sse.DONE

    return StreamingResponse(stream(), media_type="text/event-stream")


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
    return await _generate(request, body, ChatShape("chat", body.model, request.app.state.token_format))


@router.post("/v1/completions", responses={**SSE, **errors(400, 404, 413, 503)})
async def completions(body: CompletionRequest, request: Request):
    return await _generate(request, body, CompletionShape("completions", body.model, request.app.state.token_format))
