"""Builds the in-process vLLM EngineCore and drives it; engine thread only (vLLM is not thread-safe).

This is vLLM's engine core alone, as `vllm serve` runs it in its engine process: requests arrive already
tokenized (EngineCoreRequests from the processor process), and what a step returns goes out as
EngineCoreOutputs for the processor to detokenize. Nothing here renders, tokenizes or detokenizes.
"""

from __future__ import annotations

import time

import structlog

from backend.engine import compat

compat.prepare_environment()

import torch  # noqa: E402  (after prepare_environment, on purpose)
import vllm  # noqa: E402
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.executor import Executor  # noqa: E402

from backend.engine import kernels, leak_check, parallel, warmup  # noqa: E402
from backend.engine.args import USAGE_CONTEXT  # noqa: E402
from backend.engine.poc import PocRunner  # noqa: E402
from backend.engine.prefill_window import PrefillWindow  # noqa: E402
from backend.startup.settings import BackendSettings  # noqa: E402
from common.config import SettingsError  # noqa: E402
from common.logs import process_uptime_s  # noqa: E402
from common.sampling_defaults import SamplingDefaults  # noqa: E402
from protocol.common import Fingerprint  # noqa: E402
from protocol.version import PROTOCOL_VERSION  # noqa: E402
from sampling import grammar as tolerant_grammars  # noqa: E402
from sampling.enforced import ENFORCED_KEY, MODE_KEY  # noqa: E402

log = structlog.get_logger(__name__)

POC_CODE_VERSION = "pocv2-1"


class Engine:
    """vLLM's EngineCore with the worker extension installed; engine thread only."""

    def __init__(self, settings: BackendSettings) -> None:
        compat.check_version(vllm.__version__)
        self.settings = settings
        started = time.monotonic()
        parallel.bind_cpu_threads(settings)
        try:
            self.vllm_config = kernels.engine_args(settings).create_engine_config(USAGE_CONTEXT)
        except ValueError as e:  # vLLM's own checks of its flags (pydantic's ValidationError is one too)
            raise SettingsError(" ".join(str(e).split())) from e
        model_max_len = int(self.vllm_config.model_config.max_model_len)
        try:
            self.core = EngineCore(self.vllm_config, Executor.get_class(self.vllm_config), log_stats=True)
        except ValueError as e:
            if (refusal := compat.cpu_share_too_small(e)) is not None:
                raise SettingsError(refusal) from e
            raise
        try:
            if settings.engine.pipeline_parallel_size > 1:
                self.core.collective_rpc("prepare_pipeline_stage")
            if settings.chat_ops != "custom":
                wrapped = self.core.collective_rpc("chat_ops_wrapped")
                (log.info if min(wrapped) > 0 else log.warning)("chat_ops", chat_ops=settings.chat_ops,
                                                                 ops_traced_native=wrapped)
            if settings.enforced_sampling:
                self.core.collective_rpc("install_enforced_sampling")
                tolerant_grammars.install(self.core.structured_output_manager)
            self.max_model_len = int(self.vllm_config.model_config.max_model_len)
            # Set by EngineCore once it has sized the KV cache.
            self.num_gpu_blocks = int(self.vllm_config.cache_config.num_gpu_blocks or 0)
            if settings.vllm.engine.max_model_len == -1:  # vLLM's auto-fit (the CPU engine's default)
                log.info("max_model_len_fitted", max_model_len=self.max_model_len, model_max_len=model_max_len,
                         kv_cache_tokens=self.num_gpu_blocks * compat.block_size(self.core),
                         note="--max-model-len sets it")
            scheduler = self.vllm_config.scheduler_config
            self.max_num_seqs = int(scheduler.max_num_seqs)  # vLLM's default for this device where not given
            step_tokens = int(scheduler.max_num_batched_tokens)
            self._hold_prefills(settings.prefill_window_ms / 1000)
            self.poc = PocRunner(self.core, self.max_num_seqs, min(settings.poc_max_batch_tokens, step_tokens))
            self.poc.overlaps = self._prepare_overlap(settings)
            self.poc.max_in_flight = settings.poc_forwards_in_flight
            self.poc.parks = settings.vllm.world_size == 1 and not self.poc.overlaps
            self.poc.pipelines = self._prepare_pipeline(settings)
            self._warm_up_kernels(settings, step_tokens)
            self._warm_up_poc_kernels()
            self._check_kv_write_leak()
        except BaseException:
            self.core.shutdown()  # the workers are processes of their own under TP/PP
            raise
        # Internal ids registered with the workers' enforced-sampling hooks, until they finish.
        self._enforced: set[str] = set()
        log.info("engine_ready", model=str(settings.model), vllm_version=vllm.__version__,
                 block_size=compat.block_size(self.core), tensor_parallel_size=settings.engine.tensor_parallel_size,
                 pipeline_parallel_size=settings.engine.pipeline_parallel_size, max_num_seqs=self.max_num_seqs,
                 dtype=str(self.vllm_config.model_config.dtype).removeprefix("torch."),
                 poc_layer_ranges=self.poc.layer_ranges,
                 poc_overlap=self.poc.overlaps, poc_parks=self.poc.parks, poc_pipelines=self.poc.pipelines,
                 poc_forwards_in_flight=settings.poc_forwards_in_flight, prefill_window_ms=settings.prefill_window_ms,
                 torch_threads=torch.get_num_threads(), elapsed_s=round(time.monotonic() - started, 1),
                 uptime_s=process_uptime_s())

    def _hold_prefills(self, window_s: float) -> None:
        """--prefill-window-ms (backend/engine/prefill_window.py)."""
        window = PrefillWindow(window_s)
        if window_s > 0 and not compat.defer_prefills_when(
                self.core, lambda: window.should_defer(compat.request_counts(self.core)[1])):
            log.warning("prefill_window_off", reason="this vLLM's EngineCore has no _should_throttle_prefills")

    def _warm_up_kernels(self, settings: BackendSettings, step_tokens: int) -> None:
        """--kernel-warmup (backend/engine/warmup.py): the first chat of each step size compiles nothing."""
        if warmup.wanted(settings.kernel_warmup, str(self.vllm_config.device_config.device_type),
                         self.vllm_config.model_config.is_moe):
            sizes = warmup.warmup_sizes(step_tokens)
            done = self.core.collective_rpc("warm_up_kernels", args=(sizes,))
            log.info("kernel_warmup", sizes=len(sizes), largest=sizes[0],
                     triton_builds=max(int(d["triton_builds"]) for d in done),
                     elapsed_s=round(max(d["elapsed_s"] for d in done), 2))

    def _warm_up_poc_kernels(self) -> None:
        """PoC's Triton kernels built before ready (pocworker/extension.py poc_warm_up_kernels): a round's first
        forward would otherwise compile them, in the round's time, and trip vLLM's "JIT compilation during
        inference" warning."""
        if str(self.vllm_config.device_config.device_type) != "cuda":
            return
        done = self.core.collective_rpc("poc_warm_up_kernels")
        log.info("poc_kernel_warmup", triton_builds=max(int(d["triton_builds"]) for d in done),
                 elapsed_s=round(max(d["elapsed_s"] for d in done), 2))

    def _check_kv_write_leak(self) -> None:
        """A CUDA build whose KV-cache write leaks on every eager call says so once at start (leak_check.py)."""
        if str(self.vllm_config.device_config.device_type) == "cuda":
            leak_check.report(self.core.collective_rpc("kv_write_leak"))

    def _prepare_overlap(self, settings: BackendSettings) -> bool:
        """Whether PoC forwards run beside chat steps (--poc-overlap); sets up the worker's streams if so."""
        one_rank = settings.vllm.world_size == 1
        if settings.poc_overlap == "off" or not one_rank:
            return False
        streams = self.core.collective_rpc("poc_prepare_overlap", args=(settings.chat_share,))[0]
        if streams is not None:
            log.info("poc_streams", chat_share=settings.chat_share, **streams)
        return streams is not None or settings.poc_overlap == "on"

    def _prepare_pipeline(self, settings: BackendSettings) -> bool:
        """Whether a time-sliced engine launches an exclusive round's forwards back to back (PocRunner.pipelines):
        one pipeline stage (a stage receives its input from the previous one's send, which `run` pairs per forward).
        The workers make their side stream for the artifacts (CUDA); elsewhere a forward runs as it is launched, the
        same path with nothing to overlap."""
        if self.poc.overlaps or settings.engine.pipeline_parallel_size > 1:
            return False
        self.core.collective_rpc("poc_prepare_pipeline")
        return True

    def fingerprint(self) -> Fingerprint:
        cfg = self.vllm_config
        sampling_defaults, max_tokens_cap = SamplingDefaults.from_model_config(cfg.model_config).wire()
        return Fingerprint(
            protocol_version=PROTOCOL_VERSION, served_model_name=self.settings.vllm.served_names[0],
            model_path=str(self.settings.model), model_aliases=list(self.settings.vllm.served_names[1:]),
            max_model_len=self.max_model_len,
            block_size=compat.block_size(self.core), dtype=str(cfg.model_config.dtype).removeprefix("torch."),
            vllm_version=vllm.__version__, engine_device=str(cfg.device_config.device_type),
            poc_code_version=POC_CODE_VERSION, python_hash_seed=compat.ENGINE_ENV_DEFAULTS["PYTHONHASHSEED"],
            prefix_caching_hash_algo=str(cfg.cache_config.prefix_caching_hash_algo),
            scheduling_mode=self.settings.scheduling_mode, vocab_size=int(cfg.model_config.get_vocab_size()),
            sampling_defaults=sampling_defaults, max_tokens_cap=max_tokens_cap,
        )

    def add(self, request: EngineCoreRequest) -> None:
        """Queues one prepared request (the processor validated it)."""
        extra = request.sampling_params.extra_args if request.sampling_params is not None else None
        if extra and (ENFORCED_KEY in extra or MODE_KEY in extra):
            # Registered before its first step: the sampler hooks match rows by this id.
            self.core.collective_rpc("register_enforced", args=(
                request.request_id, list(extra.get(ENFORCED_KEY, ())), extra.get(MODE_KEY) == "raw_logprobs"))
            self._enforced.add(request.request_id)
        req, wave = self.core.preprocess_add_request(request)
        self.core.add_request(req, wave)

    def abort(self, internal_ids: list[str]) -> None:
        if internal_ids:
            self.core.abort_requests(internal_ids)
            self._forget(internal_ids)

    def _forget(self, internal_ids: list[str]) -> None:
        registered = [i for i in internal_ids if i in self._enforced]
        if registered:
            self._enforced.difference_update(registered)
            self.core.collective_rpc("forget_enforced", args=(registered,))

    def load(self) -> tuple[int, int, float]:
        """(running, waiting, kv usage) as of now."""
        running, waiting = compat.request_counts(self.core)
        return running, waiting, compat.kv_cache_usage(self.core)

    def has_work(self) -> bool:
        return compat.has_work(self.core)

    def step(self) -> EngineCoreOutputs | None:
        """One engine step, as vLLM's in-process client takes it; None when it produced no outputs."""
        self.poc.release()  # PoC's blocks back to the pool before the scheduler allocates
        outputs, model_executed = self.core.step_fn()
        self.core.post_step(model_executed)
        result = outputs.get(0) if outputs else None
        if result is not None and self._enforced:
            self._forget([o.request_id for o in result.outputs if o.finish_reason is not None])
        return result
