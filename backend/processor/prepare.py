"""GenerateRequest → vLLM EngineCoreRequests: chat template, tokenizer, our checks, then vLLM's InputProcessor.

`tokenize` is the heavy half (the tokenizer takes ~1.3 s per MB of text) and touches only the tokenizer and
settings, so long prompts may run it on a helper thread; `to_engine` runs vLLM's input checks and builds the
engine requests, on the processor's main thread: one per choice, fanned out as vLLM's AsyncLLM fans out n > 1.
"""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass

from vllm import SamplingParams
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.parallel_sampling import ParentRequest

from backend.engine import compat
from backend.errors import RequestError
from backend.processor import cost
from backend.processor.params import Vocab, check_lengths, render_prompt, sampling_params
from backend.processor.parsing import ChatParsers, RequestParsing, tool_dicts
from backend.startup.settings import BackendSettings
from common.sampling_defaults import NO_DEFAULTS, SamplingDefaults
from protocol.generate import GenerateRequest


@dataclass
class Tokenized:
    """A request as vLLM takes it: the prompt token ids and the sampling parameters."""

    prompt_ids: list[int]
    params: SamplingParams
    # Tool calls and reasoning: how its output is parsed (None: passed on as is).
    parsing: RequestParsing | None = None


@dataclass
class EngineRequests:
    """A request's engine requests, one per choice; with n > 1, vLLM's ParentRequest joins their outputs."""

    requests: list[EngineCoreRequest]
    parent: ParentRequest | None = None


class Preparer:
    def __init__(self, settings: BackendSettings, input_processor, vocab: Vocab, max_model_len: int,
                 parsers: ChatParsers, max_num_seqs: int, defaults: SamplingDefaults = NO_DEFAULTS) -> None:
        self._settings = settings
        # The model's sampling defaults (common/sampling_defaults.py), for what a request leaves out.
        self.defaults = defaults
        self._inputs = input_processor
        self.vocab = vocab
        self.max_model_len = max_model_len
        self.parsers = parsers
        self.max_num_seqs = max_num_seqs
        self._input_errors = compat.input_error_types()

    def engine_built(self, max_model_len: int) -> None:
        """The context the engine serves, once built (vLLM's client learns it in its handshake with the engine
        core, vllm/v1/engine/core_client.py `_apply_ready_response`): every length check reads it from then on."""
        if max_model_len <= 0 or max_model_len == self.max_model_len:
            return
        self.max_model_len = max_model_len
        self.vocab.set_max_model_len(max_model_len)
        self._inputs.model_config.max_model_len = max_model_len  # vLLM's own checks in InputProcessor

    def tokenize(self, req: GenerateRequest) -> Tokenized:
        """Tokenizes and checks one request; RequestError for client mistakes. Thread-safe."""
        n = req.sampling.n
        if not 1 <= n <= self.max_num_seqs:
            raise RequestError(f"n must be between 1 and {self.max_num_seqs} (this backend's "
                               f"--max-num-seqs), got {n}", param="n")
        # What can never fit is refused before the template or the tokenizer runs (backend/processor/cost.py).
        cost.check(cost.of_generate(req), self.vocab.max_model_len, self.vocab.max_text_bytes)
        prompt_param = "messages" if req.messages is not None else "prompt"
        parsing = self.parsers.prepare(req)
        prompt_ids = render_prompt(self.vocab, req, tool_dicts(req.tools) if req.tools else None)
        max_tokens = check_lengths(len(prompt_ids), req.sampling, self.max_model_len, prompt_param, self.defaults)
        grammar = skip_special_tokens = None
        if parsing is not None:
            parsing.prompt_ids = prompt_ids
            grammar, skip_special_tokens = parsing.request.structured_outputs, parsing.request.skip_special_tokens
        params = sampling_params(req.sampling, max_tokens, req.stream, self.vocab, self._settings.vllm.logprobs_mode,
                                 tool_grammar=grammar, skip_special_tokens=skip_special_tokens,
                                 defaults=self.defaults)
        if params.extra_args and not self._settings.enforced_sampling:
            raise RequestError("validator replay (enforced tokens, raw logprobs) is disabled on this backend",
                               param="enforced_tokens" if "enforced_token_ids" in params.extra_args
                               else "logprobs_mode")
        return Tokenized(prompt_ids, params, parsing)

    def to_engine(self, engine_rid: str, req: GenerateRequest, tokenized: Tokenized) -> EngineRequests:
        """vLLM's own input checks (logprobs limits, structured-output schemas, ...) and the engine requests,
        with their unique internal ids; RequestError for what the client got wrong."""
        is_grammar = req.sampling.response_format is not None or tokenized.params.structured_outputs is not None
        param = "response_format" if req.sampling.response_format is not None else "tools" if req.tools else None
        try:
            request = self._inputs.process_inputs(engine_rid, compat.token_prompt(tokenized.prompt_ids),
                                                  tokenized.params, supported_tasks=("generate",),
                                                  priority=req.priority)
        except self._input_errors as e:
            field = getattr(e, "parameter", None) or (param if is_grammar else None)
            raise RequestError(shorten(str(e)), param=field) from e
        except RuntimeError as e:  # xgrammar raises RuntimeError for schemas it cannot compile
            if not is_grammar:
                raise
            raise RequestError(f"invalid {param}: {e}", param=param) from e
        self._inputs.assign_request_id(request)
        return fan_out(request)


# vLLM's messages list every offending value (100,000 out-of-vocabulary stop_token_ids made a 1.4 MB body).
_MAX_MESSAGE_CHARS = 1000


def shorten(message: str) -> str:
    """A message cut in the middle, keeping its start (what is wrong) and its end (vLLM ends with the bound)."""
    if len(message) <= _MAX_MESSAGE_CHARS:
        return message
    return f"{message[:700]} … ({len(message) - 900} characters left out) … {message[-200:]}"


def fan_out(request: EngineCoreRequest) -> EngineRequests:
    """A request with its internal id, as the engine takes it: alone, or n > 1 fanned out as AsyncLLM.add_request
    does (child i gets id "i_<id>" and, with a seed, seed + i)."""
    assert request.sampling_params is not None
    n = request.sampling_params.n
    if n == 1:
        return EngineRequests([request])
    parent = ParentRequest(request)
    children = []
    for index in range(n):
        child_id, child_params = parent.get_child_info(index)
        child = request if index == n - 1 else copy(request)
        child.request_id = child_id
        child.sampling_params = child_params
        children.append(child)
    return EngineRequests(children, parent)
