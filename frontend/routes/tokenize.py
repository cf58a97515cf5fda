"""/tokenize and /detokenize, as `vllm serve` answers them (its serving_tokenization): the backend's processor
holds the tokenizer and answers. Like vllm serve's, these routes are outside the /v1 prefix that --api-key guards.
"""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from frontend import convert
from frontend.backend_client import BackendRequestError
from frontend.body import OffloadRoute
from frontend.openai_models import DetokenizeRequest, TokenizeRequest
from frontend.openapi import errors
from frontend.routes.openai import check_model
from protocol.tokenize import DetokenizeReply, TokenizeReply

router = APIRouter(route_class=OffloadRoute)  # large bodies are parsed off the loop (frontend/body.py)
# One reply from the processor; it answers in milliseconds unless it is gone.
_CALL_TIMEOUT_S = 30.0


@router.post("/tokenize", responses=errors(400, 404, 413, 503))
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    """vllm serve's /tokenize: {count, max_model_len, tokens, token_strs}."""
    if body.model is not None:
        check_model(request, body.model)
    client = request.app.state.client
    reply: TokenizeReply = await client.call(convert.tokenize_request(client.new_rid(), body), _CALL_TIMEOUT_S)
    if reply.error is not None:
        raise BackendRequestError(reply.error)
    # Encoded by msgspec: up to ~10^6 ids, which FastAPI's jsonable_encoder walks one by one on the event loop.
    return Response(msgspec.json.encode({"count": len(reply.tokens), "max_model_len": reply.max_model_len,
                                         "tokens": reply.tokens, "token_strs": reply.token_strs}),
                    media_type="application/json")


@router.post("/detokenize", responses=errors(400, 404, 413, 503))
async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
    """vllm serve's /detokenize: {prompt}."""
    if body.model is not None:
        check_model(request, body.model)
    client = request.app.state.client
    reply: DetokenizeReply = await client.call(convert.detokenize_request(client.new_rid(), body), _CALL_TIMEOUT_S)
    if reply.error is not None:
        raise BackendRequestError(reply.error)
    return {"prompt": reply.prompt}
