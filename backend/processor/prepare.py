"""GenerateRequest → vLLM EngineCoreRequests: chat template, tokenizer, our checks, then vLLM's InputProcessor.

`tokenize` is the heavy half (the tokenizer takes ~1.3 s per MB of text) and touches only the tokenizer and
settings, so long prompts may run it on a helper thread; `to_engine` runs vLLM's input checks and builds the
engine requests, on the processor's main thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm import SamplingParams
from vllm.v1.engine import EngineCoreRequest

from backend.engine import compat
from backend.errors import RequestError
from backend.processor.params import Vocab, check_lengths, render_prompt, sampling_params
from backend.settings import BackendSettings
from protocol.generate import GenerateRequest


@dataclass
class Tokenized:
    """A request as vLLM takes it: the prompt token ids and the sampling parameters."""

    prompt_ids: list[int]
    params: SamplingParams


class Preparer:
    def __init__(self, settings: BackendSettings, input_processor, vocab: Vocab, max_model_len: int) -> None:
        self._settings = settings
        self._inputs = input_processor
        self.vocab = vocab
        self.max_model_len = max_model_len
        self._input_errors = compat.input_error_types()

    def tokenize(self, req: GenerateRequest) -> Tokenized:
        """Tokenizes and checks one request; RequestError for client mistakes. Thread-safe."""
        prompt_param = "messages" if req.messages is not None else "prompt"
        prompt_ids = render_prompt(self.vocab, req)
        max_tokens = check_lengths(len(prompt_ids), req.sampling, self.max_model_len, prompt_param)
        params = sampling_params(req.sampling, max_tokens, req.stream, self.vocab, self._settings.logprobs_mode)
        if params.extra_args and not self._settings.enforced_sampling:
            raise RequestError("validator replay (enforced tokens, raw logprobs) is disabled on this backend",
                               param="enforced_tokens" if "enforced_token_ids" in params.extra_args
                               else "logprobs_mode")
        return Tokenized(prompt_ids, params)

    def to_engine(self, engine_rid: str, req: GenerateRequest, tokenized: Tokenized) -> EngineCoreRequest:
        """vLLM's own input checks (logprobs limits, structured-output schemas, ...) and the engine request,
        with its unique internal id; RequestError for what the client got wrong."""
        try:
            request = self._inputs.process_inputs(engine_rid, compat.token_prompt(tokenized.prompt_ids),
                                                  tokenized.params, supported_tasks=("generate",),
                                                  priority=req.priority)
        except self._input_errors as e:
            param = "response_format" if req.sampling.response_format is not None else None
            raise RequestError(str(e), param=param) from e
        except RuntimeError as e:  # xgrammar raises RuntimeError for schemas it cannot compile
            if req.sampling.response_format is None:
                raise
            raise RequestError(f"invalid response_format: {e}", param="response_format") from e
        self._inputs.assign_request_id(request)
        return request
