"""The FP8 kernels a CUDA engine runs where the user names none: DeepGEMM for block-FP8 MoE and linear layers.

vLLM 0.26 on Hopper puts a block-FP8 MoE on its Triton kernel unless DeepGEMM is asked for, and its linear layers
on DeepGEMM (through FlashInfer) with the block scales re-quantised to powers of two (VLLM_USE_DEEP_GEMM_E8M0).
Measured on one H200 (docs/benchmarks-history.md, 2026-12-02, "the FP8 kernel paths on one H200", `scripts/gpu_check.sh
kernels`), the 235B shape:
- 12 layers: PoC 150–158 nonces/s on DeepGEMM (MoE and linear) against 99–100 on Triton MoE + CUTLASS linear,
  ~1.55x, at 32, 64 and 128 x 1024;
- 2 seeded layers, 256 nonces: DeepGEMM with the checkpoint's scales lies within 0.095 of Triton's artifacts (mean
  0.019); with E8M0 scales within 0.225 (mean 0.057), a different model's numbers; E8M0 was ~2% faster.
So where the user sets none of vLLM's flags or variables for these kernels, pocserve takes DeepGEMM for both with
the checkpoint's scales, and logs the choice with its reason; any of `--moe-backend`, `--linear-backend`,
VLLM_USE_DEEP_GEMM, VLLM_MOE_USE_DEEP_GEMM or VLLM_USE_DEEP_GEMM_E8M0 leaves vLLM's own choice alone. A backend
asked for by name that does not take the model fails the start in vLLM (no fallback), so pocserve asks only where
DeepGEMM's MoE kernel takes it: 128 x 128 blocks, SiLU, no expert parallel (unmeasured there). Shapes it cannot
run (token counts, or an expert slice not a multiple of 128, as 1536 / 8 at TP=8) fall back to Triton per call.
TP > 1 is not measured on it.

DeepGEMM compiles each kernel with nvcc the first time a shape needs it (4–7 s each on an H200). vLLM's own warm-up
of them (VLLM_DEEP_GEMM_WARMUP=relax) walks every token count up to max_num_batched_tokens: 4,715 of them at 65536,
not through in 200 s on a first start (2026-12-02). With the choice pocserve skips it where the user did not set
it: the kernels compile at their first forward (the PoC's first batch; chat's step sizes in pocserve's own kernel
warm-up, backend/engine/warmup.py) into DG_JIT_CACHE_DIR, under vLLM's cache root so that compose's compile-cache
volume keeps them across restarts (a restart measured 43 s against 71 s for the first start of the 12-layer slice).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import structlog

from backend.engine import compat

log = structlog.get_logger(__name__)

USER_FLAGS = ("moe_backend", "linear_backend")
USER_VARIABLES = ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0")
# The checkpoint's block scales as they are (no power-of-two re-quantisation): the numbers a Triton node computes.
DEEP_GEMM_ENV = {"VLLM_USE_DEEP_GEMM": "1", "VLLM_MOE_USE_DEEP_GEMM": "1", "VLLM_USE_DEEP_GEMM_E8M0": "0"}


def is_block_fp8(config: Mapping[str, Any]) -> bool:
    quant = config.get("quantization_config")
    return isinstance(quant, dict) and quant.get("quant_method") == "fp8" and bool(quant.get("weight_block_size"))


def _unsupported(config: Mapping[str, Any], given: frozenset[str]) -> str | None:
    """What DeepGEMM's MoE kernel would refuse at start once asked for by name (vLLM raises instead of falling
    back: vllm/model_executor/layers/fused_moe/oracle/fp8.py `_return_or_raise`), or a case not measured."""
    if list(config["quantization_config"]["weight_block_size"]) != [128, 128]:
        return "blocks other than 128 x 128"
    if config.get("hidden_act", "silu") != "silu":
        return f"activation {config.get('hidden_act')!r} (DeepGEMM's MoE kernel takes SiLU)"
    if "enable_expert_parallel" in given:
        return "expert parallel (not measured on DeepGEMM)"
    return None


def why_not(config: Mapping[str, Any], given: frozenset[str], environ: Mapping[str, str], *, is_hopper: bool,
            has_deep_gemm: bool, nvcc: str | None) -> str | None:
    """None where DeepGEMM is the default to take; else why vLLM's own choice stands (pure: tested on CPU)."""
    if not is_block_fp8(config):
        return "not a block-FP8 checkpoint"
    if named := [f"--{f.replace('_', '-')}" for f in USER_FLAGS if f in given] + \
            [v for v in USER_VARIABLES if v in environ]:
        return f"{', '.join(named)} given"
    if (refused := _unsupported(config, given)) is not None:
        return refused
    if not is_hopper:
        return "not a Hopper GPU (measured on Hopper only)"
    if not has_deep_gemm:
        return "vLLM's DeepGEMM is not installed"
    if nvcc is None:
        return "no nvcc (DeepGEMM compiles its kernels at run time): set CUDA_HOME"
    return None


def find_nvcc(environ: Mapping[str, str]) -> str | None:
    """Where DeepGEMM finds nvcc (vllm/third_party/deep_gemm/__init__.py `_find_cuda_home`)."""
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if home:
        candidates = [str(Path(home) / "bin" / "nvcc")]
    else:
        candidates = [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def choose(engine, config: Mapping[str, Any], given: frozenset[str], environ: MutableMapping[str, str]) -> dict:
    """Sets DeepGEMM on `engine` (vLLM's EngineArgs) and `environ` where it is the default; what was decided, for
    the log. CUDA builds only: vLLM's platform is read through NVML, so CUDA is not initialised here."""
    import vllm.envs as vllm_envs
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import has_deep_gemm

    nvcc = find_nvcc(environ)
    reason = why_not(config, given, environ, is_hopper=current_platform.is_device_capability(90),
                     has_deep_gemm=has_deep_gemm(), nvcc=nvcc)
    if reason is not None:
        return {"fp8_kernels": "vllm's choice", "reason": reason}
    return {**take_deep_gemm(engine, environ, Path(vllm_envs.VLLM_CACHE_ROOT)), "nvcc": nvcc}


def take_deep_gemm(engine, environ: MutableMapping[str, str], cache_root: Path) -> dict:
    """DeepGEMM for MoE and linear layers with the checkpoint's scales; its warm-up and cache as the module says."""
    engine.moe_backend = engine.linear_backend = "deep_gemm"
    environ.update(DEEP_GEMM_ENV)
    environ.setdefault("VLLM_DEEP_GEMM_WARMUP", "skip")
    environ.setdefault("DG_JIT_CACHE_DIR", str(cache_root / "deep_gemm"))
    return {"fp8_kernels": "deep_gemm", "reason": "block-FP8 on Hopper: 1.55x Triton MoE + CUTLASS (H200)",
            "e8m0": False, "warmup": environ["VLLM_DEEP_GEMM_WARMUP"], "jit_cache": environ["DG_JIT_CACHE_DIR"]}


def engine_args(settings, environ: MutableMapping[str, str] = os.environ):
    """backend/engine/args.py's engine arguments with the default FP8 kernels applied on a CUDA build (logged as
    `fp8_kernels` for a block-FP8 model); the head and every headless node decide alike from the same flags."""
    from backend.engine import args, parallel

    engine = args.engine_args(settings)
    if compat.is_cpu_build():  # no config.json read: the CPU engine has no such kernels
        return engine
    config = parallel.model_config(Path(settings.model))
    if is_block_fp8(config):
        log.info("fp8_kernels", **choose(engine, config, settings.vllm.given, environ))
    return engine
