"""/v1/responses (OpenAI's Responses API) as `vllm serve` serves it for a text chat model, on the chat path: the
request becomes the chat GenerateRequest (frontend/responses_convert.py) and goes through the same backend client,
so it meets the same errors and the same PoC gate as chat (503 while a round mines in exclusive mode, its stream
ended with an error event when a round starts). The answer is shaped by frontend/responses_shape.py and
frontend/responses_stream.py. Two refusals of the chat path that vLLM's Responses does not make are worked
around by sending the request again (`relaxed`): the backend checks them before the request reaches the engine.

No response is stored (vLLM stores none unless VLLM_ENABLE_RESPONSES_API_STORE is set): retrieving or cancelling a
response is a 404, as from `vllm serve` by default. Those two routes answer only for clients written against vLLM;
/openapi.json leaves them out, since no id is ever found there: stated, they promised a resource that a POST
"created" (schemathesis followed the id to them and reported the 404 as a lost resource).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from common.sampling_defaults import SamplingDefaults
from frontend import convert
from frontend.backend_client import BackendRequestError, BackendUnavailable
from frontend.body import OffloadRoute
from frontend.errors import ApiError, backend_error_body
from frontend.openapi import SSE, errors
from frontend.responses_convert import generate_request
from frontend.responses_models import ResponsesRequest
from frontend.responses_shape import ResponseShape
from frontend.responses_stream import ResponseEvents, frame
from frontend.routes.openai import _collect, _until_done, check_model
from protocol.common import Fingerprint
from protocol.generate import Delta, GenerateRequest

router = APIRouter(route_class=OffloadRoute)  # large bodies are parsed off the loop (frontend/body.py)

# The backend names chat's fields in its errors; these are their Responses names.
_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


def _renamed(e: BackendRequestError) -> ApiError:
    i = e.info
    return ApiError(i.status, i.message, param=_PARAMS.get(i.param or "", i.param), type=i.type or None)


def relaxed(e: BackendRequestError, gen: GenerateRequest) -> GenerateRequest | None:
    """The request again, without what the chat path refused but vLLM's Responses lets through; None when the
    refusal stands. Each change removes its own cause, so a request is sent at most three times.

    - max_tokens past the context's room: vLLM's Responses takes the room instead (min(max_output_tokens, room) in
      its to_sampling_params), which is what no limit gives. max_tokens < 1 never reaches the backend (the model
      refuses it), so the param alone tells.
    - tool_choice "auto" without a tool parser (vllm serve's chat refusal, copied by the processor): vLLM's
      Responses renders the tools and parses no calls, which is what "none" does on the chat path."""
    info = e.info
    if info.status != 400:
        return None
    if info.param == "max_tokens" and gen.sampling.max_tokens is not None:
        sampling = msgspec.structs.replace(gen.sampling, max_tokens=None)
        return msgspec.structs.replace(gen, sampling=sampling)
    if info.param == "tool_choice" and gen.tool_choice == "auto" and info.message.startswith('"auto" tool choice'):
        return msgspec.structs.replace(gen, tool_choice="none")
    return None


async def _whole(request: Request, gen: GenerateRequest) -> list[Delta]:
    while True:
        try:
            return await _collect(request, gen)
        except BackendRequestError as e:
            retry = relaxed(e, gen)
            if retry is None:
                raise _renamed(e) from None
        gen = msgspec.structs.replace(retry, rid=request.app.state.client.new_rid())


async def _start(request: Request, gen: GenerateRequest) -> tuple[Delta, AsyncGenerator[Delta, None]]:
    """The first delta and the rest; errors before the first delta are a plain HTTP error, as in chat."""
    client = request.app.state.client
    while True:
        rest = client.generate(gen)
        try:
            return await rest.__anext__(), rest
        except BackendRequestError as e:
            retry = relaxed(e, gen)
            if retry is None:
                raise _renamed(e) from None
        gen = msgspec.structs.replace(retry, rid=client.new_rid())


def _served(request: Request, body: ResponsesRequest) -> Fingerprint:
    fp = request.app.state.client.fingerprint
    if fp is None:
        raise BackendUnavailable("backend not ready")
    # The model may be left out, as vLLM allows; the response names the served model, as vLLM's does.
    if body.model is not None:
        check_model(request, body.model)
    return fp


@router.post("/v1/responses", responses={**SSE, **errors(400, 404, 413, 503)})
async def create_response(body: ResponsesRequest, request: Request):
    fp = _served(request, body)
    client = request.app.state.client
    gen = generate_request(client.new_rid(), body)
    shape = ResponseShape(body, model=fp.served_model_name, max_model_len=fp.max_model_len,
                          fmt=request.app.state.token_format,
                          defaults=SamplingDefaults.from_wire(fp.sampling_defaults, fp.max_tokens_cap))
    if not gen.stream:
        merged = convert.merge(await _whole(request, gen))
        return Response(msgspec.json.encode(shape.whole(merged)), media_type="application/json")
    started = time.monotonic()
    first, rest = await _start(request, gen)
    request.app.state.metrics.ttft.labels("responses").observe(time.monotonic() - started)
    events = ResponseEvents(shape.fmt, with_logprobs=shape.with_logprobs, include_reasoning=body.include_reasoning)

    async def stream() -> AsyncIterator[bytes]:
        begun = shape.response("in_progress", [], first.num_prompt_tokens)
        yield frame(events.event("response.created", response=begun))
        yield frame(events.event("response.in_progress", response=begun))
        deltas: list[Delta] = []
        try:
            async for d in _until_done(request, first, rest, 1):
                deltas.append(d)
                for event in events.feed(d):
                    yield frame(event)
        except (BackendUnavailable, BackendRequestError) as e:
            yield frame(_error_event(events, e))
            return
        if deltas[-1].finish_reason is None:
            return  # the client went away
        for event in events.close():
            yield frame(event)
        merged = convert.merge(deltas)
        whole = shape.whole(merged, events.items or None)
        yield frame(events.event("response.completed", response=whole))

    return StreamingResponse(stream(), media_type="text/event-stream")


def _error_event(events: ResponseEvents, e: BackendUnavailable | BackendRequestError) -> dict:
    """OpenAI's error event (ResponseErrorEvent): `code` is the error type, as the chat error body names it."""
    body = backend_error_body(e)["error"]
    return events.event("error", code=body["type"], message=body["message"],
                        param=_PARAMS.get(body["param"] or "", body["param"]))


# vLLM's answer without VLLM_ENABLE_RESPONSES_API_STORE: it stores nothing, so every id is unknown, those of
# responses it has just answered included; its cancel route looks the id up first, so cancelling is a 404 as well.


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", param="response_id",
                    type="invalid_request_error")


@router.get("/v1/responses/{response_id}", include_in_schema=False)
async def retrieve_response(response_id: str):
    raise _not_found(response_id)


@router.post("/v1/responses/{response_id}/cancel", include_in_schema=False)
async def cancel_response(response_id: str):
    raise _not_found(response_id)
