"""vLLM's engine arguments as the backend builds them: pocserve's changes to the given compilation and
structured-output configs, and the one copy both backend processes build their config from."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Protocol

from vllm.config import CompilationConfig, StructuredOutputsConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext

# vllm serve's context: its defaults for max_num_seqs and max_num_batched_tokens where we pass none.
USAGE_CONTEXT = UsageContext.OPENAI_API_SERVER


def structured_outputs_config(config: StructuredOutputsConfig, json_whitespace: bool) -> StructuredOutputsConfig:
    """vLLM's structured outputs as given; --no-json-whitespace asks for compact JSON (an xgrammar/guidance
    option: xgrammar where vLLM would pick)."""
    if json_whitespace:
        return config
    backend = "xgrammar" if config.backend == "auto" else config.backend
    return dataclasses.replace(config, backend=backend, disable_any_whitespace=True)


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
    it (docs/benchmarks-history.md, 2026-11-25 late night; upstream: vllm-project/vllm#48071). Off, TP all-reduces go
    through vLLM's other all-reduce backends and the norm runs on its own; the PoC forward is eager either way."""
    if setting == "auto":
        return multicast_switched_off(environ) is None
    return setting == "on"


def compilation_config(config: CompilationConfig, fusion_setting: str,
                       environ: Mapping[str, str] = os.environ) -> CompilationConfig:
    """The given compilation config with the fork's custom ops (every vLLM custom op): the PoC forward's numerics,
    and its eager speed (native ops are ~2x slower there), follow this set on every node; and the fused all-reduce
    + RMSNorm off where allreduce_fusion says so."""
    config = copy.deepcopy(config)
    config.custom_ops = ["all"]
    if not allreduce_fusion(fusion_setting, environ):
        config.pass_config.fuse_allreduce_rms = False
    return config


# The key under vLLM's `additional_config` that carries --chat-ops to every process building the model
# (backend/engine/chat_ops.py reads it there).
CHAT_OPS_KEY = "pocserve_chat_ops"


def additional_config(given: Any, chat_ops: str) -> Any:
    """vLLM's additional_config as given, plus --chat-ops where it is not the default (the default leaves the
    config, and so vLLM's compile-cache key, as it was)."""
    if chat_ops == "custom":
        return given
    if given is not None and not isinstance(given, dict):
        raise ValueError("--chat-ops inductor needs --additional-config to be a JSON object")
    return {**(given or {}), CHAT_OPS_KEY: chat_ops}


class HoldsEngineArgs(Protocol):
    """What engine_args reads of the backend's settings (BackendSettings, backend/startup/settings.py). A protocol,
    not that class: the settings build their vLLM arguments with this module's configs (through
    backend/startup/vllm_args.py), so this module imports nothing of theirs, not even a type."""

    @property
    def engine(self) -> Any: ...


def engine_args(settings: HoldsEngineArgs) -> EngineArgs:
    """A copy of the settings' engine arguments (vLLM fills in defaults on the object it builds a config from)."""
    return copy.deepcopy(settings.engine)
