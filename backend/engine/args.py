"""vLLM's engine arguments from the backend settings: the one place both backend processes build them from."""

from __future__ import annotations

import os
from collections.abc import Mapping

from vllm.config import StructuredOutputsConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext

from backend.settings import BackendSettings

# vllm serve's context: its defaults for max_num_seqs and max_num_batched_tokens where we pass none.
USAGE_CONTEXT = UsageContext.OPENAI_API_SERVER


def _structured_outputs_config(settings: BackendSettings) -> StructuredOutputsConfig:
    if settings.json_whitespace:
        return StructuredOutputsConfig()
    # Compact JSON is an xgrammar/guidance option; xgrammar is what vLLM picks by default anyway.
    return StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)


def multicast_switched_off(environ: Mapping[str, str]) -> str | None:
    """The variable that switches NVLink multicast off in this environment, if one does."""
    for name, off in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
        if environ.get(name, "").strip() == off:
            return name
    return None


def allreduce_fusion(setting: str, environ: Mapping[str, str]) -> bool:
    """Whether vLLM may fuse TP all-reduces with the RMSNorm after them (its default at TP > 1).

    On one node vLLM 0.26 picks FlashInfer's multicast ("mnnvl") kernel for it. Without NVLink multicast that
    kernel hits an illegal memory access in the engine's first (profiling) forward: `vllm serve` and our backend
    both died that way at TP=2 on an H100 host with multicast off, and `vllm serve` with the fusion off got past
    it (docs/benchmarks.md, 2026-11-25 late night; upstream: vllm-project/vllm#48071). Off, TP all-reduces go
    through vLLM's other all-reduce backends and the norm runs on its own; the PoC forward is eager either way."""
    if setting == "auto":
        return multicast_switched_off(environ) is None
    return setting == "on"


def compilation_config(settings: BackendSettings, environ: Mapping[str, str] = os.environ) -> dict:
    # The fork runs every model with vLLM's custom ops (spec §1.6): the PoC forward's numerics, and its eager
    # speed (native ops are ~2x slower there), follow this set on every node.
    config: dict = {"custom_ops": ["all"]}
    if not allreduce_fusion(settings.allreduce_fusion, environ):
        config["pass_config"] = {"fuse_allreduce_rms": False}
    return config


def engine_args(settings: BackendSettings) -> EngineArgs:
    return EngineArgs(
        model=str(settings.model), served_model_name=[settings.model_name], dtype=settings.dtype,
        kv_cache_dtype=settings.kv_cache_dtype, quantization=settings.quantization or None,
        max_model_len=settings.max_model_len or None, max_num_seqs=settings.max_num_seqs,
        # Unset: as many as the largest PoC forward, so vLLM's profile and workspaces cover it (engine/poc.py).
        max_num_batched_tokens=settings.max_num_batched_tokens or settings.poc_max_batch_tokens,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size, enforce_eager=settings.enforce_eager,
        # Across hosts: vLLM's multiprocessing executor on node 0 drives every rank; the other nodes run theirs
        # headless (backend/engine/headless.py). One node: vLLM's defaults.
        nnodes=settings.nnodes, node_rank=settings.node_rank, master_addr=settings.master_addr,
        master_port=settings.master_port,
        # The engine always computes processed logprobs; rows asking for raw ones get them from the
        # enforced-sampling wrapper (sampling/enforced.py), so the mode can differ per request.
        logprobs_mode="processed_logprobs", seed=settings.seed,
        block_size=settings.block_size or None, enable_prefix_caching=True,
        structured_outputs_config=_structured_outputs_config(settings),
        worker_extension_cls="backend.engine.worker_extension.WorkerExtension",
        compilation_config=compilation_config(settings),
    )
