"""Builds the in-process vLLM engine and drives it; engine thread only (vLLM is not thread-safe)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from backend.engine import compat

compat.prepare_environment()

import vllm  # noqa: E402  (after prepare_environment, on purpose)
from vllm.config import StructuredOutputsConfig  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.usage.usage_lib import UsageContext  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402

from backend.engine.outputs import to_delta  # noqa: E402
from backend.engine.poc import PocRunner  # noqa: E402
from backend.engine.stats import RecorderFactory  # noqa: E402
from backend.engine.params import Vocab, check_lengths, render_prompt, sampling_params  # noqa: E402
from sampling import grammar as tolerant_grammars  # noqa: E402
from sampling.enforced import ENFORCED_KEY, MODE_KEY  # noqa: E402
from backend.errors import RequestError  # noqa: E402
from backend.settings import BackendSettings  # noqa: E402
from protocol.common import Fingerprint  # noqa: E402
from protocol.generate import Delta, GenerateRequest  # noqa: E402
from protocol.version import PROTOCOL_VERSION  # noqa: E402

log = structlog.get_logger(__name__)

POC_CODE_VERSION = "pocv2-1"


@dataclass
class _Tracked:
    num_prompt_tokens: int
    num_top_logprobs: int
    num_generated: int = 0
    # vLLM's internal request id, when registered with the workers' enforced-sampling hooks.
    registered_as: str = ""


@dataclass
class Prepared:
    """A request as vLLM takes it: the tokenized prompt and the sampling parameters."""

    prompt_ids: list[int]
    params: vllm.SamplingParams


def _structured_outputs_config(settings: BackendSettings) -> StructuredOutputsConfig:
    if settings.json_whitespace:
        return StructuredOutputsConfig()
    # Compact JSON is an xgrammar/guidance option; xgrammar is what vLLM picks by default anyway.
    return StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)


class Engine:
    """The vLLM LLMEngine plus tokenizer, with our request conversion; engine thread only."""

    def __init__(self, settings: BackendSettings) -> None:
        compat.check_version(vllm.__version__)
        self.settings = settings
        args = EngineArgs(
            model=str(settings.model), served_model_name=[settings.model_name], dtype=settings.dtype,
            max_model_len=settings.max_model_len, max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            tensor_parallel_size=settings.tensor_parallel_size, enforce_eager=settings.enforce_eager,
            # The engine always computes processed logprobs; rows asking for raw ones get them from the
            # enforced-sampling wrapper (sampling/enforced.py), so the mode can differ per request.
            logprobs_mode="processed_logprobs", seed=settings.seed,
            block_size=settings.block_size or None, enable_prefix_caching=True,
            structured_outputs_config=_structured_outputs_config(settings),
            worker_extension_cls="backend.engine.worker_extension.WorkerExtension",
            # The fork runs every model with vLLM's custom ops (spec §1.6): the PoC forward's numerics, and
            # its eager speed (native ops are ~2x slower there), follow this set on every node.
            compilation_config={"custom_ops": ["all"]},
        )
        started = time.monotonic()
        factory = RecorderFactory()
        self.stats = factory.recorder
        self.llm = LLMEngine.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER,
                                              stat_loggers=[factory], enable_multiprocessing=False)
        self.tokenizer = self.llm.get_tokenizer()
        if settings.enforced_sampling:
            self.llm.collective_rpc("install_enforced_sampling")
            tolerant_grammars.install(compat.engine_core(self.llm).structured_output_manager)
        self.max_model_len = int(self.llm.model_config.max_model_len)
        self.vocab = Vocab(self.tokenizer, int(self.llm.model_config.get_vocab_size()), self.max_model_len)
        self.poc = PocRunner(self.llm, settings.max_num_seqs, settings.max_num_batched_tokens)
        log.info("engine_ready", model=str(settings.model), vllm_version=vllm.__version__,
                 block_size=compat.block_size(self.llm), elapsed_s=round(time.monotonic() - started, 1))
        self._tracked: dict[str, _Tracked] = {}
        self._input_errors = compat.input_error_types()

    def fingerprint(self) -> Fingerprint:
        cfg = self.llm.vllm_config
        return Fingerprint(
            protocol_version=PROTOCOL_VERSION, served_model_name=self.settings.model_name,
            model_path=str(self.settings.model), max_model_len=self.max_model_len,
            block_size=compat.block_size(self.llm), dtype=str(cfg.model_config.dtype).removeprefix("torch."),
            vllm_version=vllm.__version__, engine_device=str(cfg.device_config.device_type),
            poc_code_version=POC_CODE_VERSION, python_hash_seed=compat.ENGINE_ENV_DEFAULTS["PYTHONHASHSEED"],
            prefix_caching_hash_algo=str(cfg.cache_config.prefix_caching_hash_algo),
            scheduling_mode=self.settings.scheduling_mode,
        )

    def prepare(self, req: GenerateRequest) -> Prepared:
        """Tokenizes and validates one request; raises RequestError for client mistakes. Touches only the
        tokenizer and settings, never the engine, so it may run on another thread (long prompts do)."""
        prompt_param = "messages" if req.messages is not None else "prompt"
        prompt_ids = render_prompt(self.vocab, req)
        max_tokens = check_lengths(len(prompt_ids), req.sampling, self.max_model_len, prompt_param)
        params = sampling_params(req.sampling, max_tokens, req.stream, self.vocab, self.settings.logprobs_mode)
        if params.extra_args and not self.settings.enforced_sampling:
            raise RequestError("validator replay (enforced tokens, raw logprobs) is disabled on this backend",
                               param="enforced_tokens" if "enforced_token_ids" in params.extra_args
                               else "logprobs_mode")
        return Prepared(prompt_ids, params)

    def add(self, engine_rid: str, req: GenerateRequest, prepared: Prepared | None = None) -> None:
        """Queues one request (prepared here unless given); raises RequestError for client mistakes."""
        prepared = prepared or self.prepare(req)
        prompt_ids, params = prepared.prompt_ids, prepared.params
        try:
            internal_id = self.llm.add_request(engine_rid, compat.token_prompt(prompt_ids), params,
                                               priority=req.priority)
        except self._input_errors as e:  # vLLM's input checks: logprobs limits, structured-output schema, ...
            param = "response_format" if req.sampling.response_format is not None else None
            raise RequestError(str(e), param=param) from e
        except RuntimeError as e:  # xgrammar raises RuntimeError for schemas it cannot compile
            if req.sampling.response_format is None:
                raise
            raise RequestError(f"invalid response_format: {e}", param="response_format") from e
        self._tracked[engine_rid] = _Tracked(len(prompt_ids), req.sampling.logprobs or 0)
        if params.extra_args:
            # Registered before its first step: the sampler hooks match rows by this id.
            extra = params.extra_args
            self.llm.collective_rpc("register_enforced", args=(
                internal_id, list(extra.get(ENFORCED_KEY, ())), extra.get(MODE_KEY) == "raw_logprobs"))
            self._tracked[engine_rid].registered_as = internal_id

    def abort(self, engine_rids: list[str]) -> None:
        self.llm.abort_request(engine_rids)
        self._forget([t for rid in engine_rids if (t := self._tracked.pop(rid, None)) is not None])

    def _forget(self, tracked: list["_Tracked"]) -> None:
        registered = [t.registered_as for t in tracked if t.registered_as]
        if registered:
            self.llm.collective_rpc("forget_enforced", args=(registered,))

    def load(self) -> tuple[int, int, float]:
        """(running, waiting, kv usage) as of now; engine thread only."""
        running, waiting = compat.request_counts(self.llm)
        return running, waiting, compat.kv_cache_usage(self.llm)

    def has_work(self) -> bool:
        return self.llm.has_unfinished_requests()

    def step(self) -> list[tuple[str, Delta]]:
        """One engine step; (engine request id, delta) for every request that advanced."""
        deltas: list[tuple[str, Delta]] = []
        for out in self.llm.step():
            rid = out.request_id
            t = self._tracked.get(rid)
            if t is None:  # aborted by us after this step was scheduled
                continue
            delta = to_delta(out, t.num_prompt_tokens, t.num_generated, t.num_top_logprobs, self.tokenizer)
            t.num_generated = delta.num_generated_tokens
            deltas.append((rid, delta))
            if out.finished:
                self._forget([self._tracked.pop(rid)])
        return deltas
