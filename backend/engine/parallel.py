"""The engine's parallel topology, checked before vLLM starts: the model splits by the TP and PP sizes, and on the
CPU engine every rank gets cores of its own.

No vLLM import: the checks run in the backend's entry, before any worker process exists, so that a bad size is
one line naming the setting (exit code 2) instead of an assertion in a worker. They read the model's config.json
only; what vLLM itself checks later (a shard that does not divide, a missing layer list, see
backend/engine/poc.py) then cannot be reached with these sizes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from backend.engine import compat
from backend.startup.settings import BackendSettings
from common.config import SettingsError

log = structlog.get_logger(__name__)

TP = "--tensor-parallel-size / POCSERVE_TENSOR_PARALLEL_SIZE"
PP = "--pipeline-parallel-size / POCSERVE_PIPELINE_PARALLEL_SIZE"
NNODES = "--nnodes / POCSERVE_NNODES"
# vLLM's CPU workers: one core list per rank, "|"-separated (vllm/utils/ompmultiprocessing.py). Without it vLLM
# binds one NUMA node per rank and asserts there are enough nodes, which a one-node machine never has.
CPU_BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
# Set: a fixed KV cache of this many GiB per CPU rank instead of --gpu-memory-utilization's share of RAM.
CPU_KV_SPACE_VAR = "VLLM_CPU_KVCACHE_SPACE"


def world_size(settings: BackendSettings) -> int:
    return settings.vllm.world_size


def local_world_size(settings: BackendSettings) -> int:
    """The ranks this host runs (vLLM splits them evenly over the nodes, in rank order)."""
    return world_size(settings) // settings.engine.nnodes


def check_nodes(settings: BackendSettings) -> None:
    world = world_size(settings)
    nnodes = settings.engine.nnodes
    if world % nnodes:
        raise SettingsError(f"{NNODES}: {nnodes} hosts cannot share {TP} x {PP} = {world} ranks evenly")


def model_config(model_dir: Path) -> dict[str, Any]:
    """The text model's config.json fields (a multimodal config's text_config merged over its top level); empty
    when there is no readable config.json (vLLM then reports the model itself)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def check_split(config: Mapping[str, Any], tp: int, pp: int) -> None:
    """SettingsError naming the setting if the model cannot be split into `tp` shards and `pp` stages (vLLM's
    rules: heads divide by TP, KV heads divide by TP or are replicated to it, every stage holds a layer)."""
    heads = config.get("num_attention_heads")
    if isinstance(heads, int) and heads % tp:
        raise SettingsError(f"{TP}: {tp} does not divide the model's {heads} attention heads")
    kv_heads = config.get("num_key_value_heads", heads)
    if isinstance(kv_heads, int) and kv_heads % tp and tp % kv_heads:
        raise SettingsError(f"{TP}: {tp} neither divides the model's {kv_heads} key-value heads nor is a multiple "
                            "of them")
    for name in ("intermediate_size", "moe_intermediate_size"):
        size = config.get(name)
        if isinstance(size, int) and size % tp:
            raise SettingsError(f"{TP}: {tp} does not divide the model's {name} {size}")
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and pp > layers:
        raise SettingsError(f"{PP}: {pp} stages for the model's {layers} decoder layers (every stage needs one)")


def check_cpu(settings: BackendSettings, cpus: Sequence[int], environ: Mapping[str, str]) -> None:
    """SettingsError if this host's CPU engine ranks cannot each have a core and a share of memory."""
    world = local_world_size(settings)
    if world <= 1:
        return
    bind = environ.get(CPU_BIND_VAR, "auto")
    if bind == "auto" and world > len(cpus):
        raise SettingsError(f"{_ranks_here(settings, world)}, but this process may use {_cores(len(cpus))} and "
                            f"every CPU rank needs one of its own (to share cores on purpose, set {CPU_BIND_VAR})")
    if bind not in ("auto", "nobind") and len(bind.split("|")) != world:
        where = f"({TP} x {PP})" if settings.engine.nnodes == 1 else f"on this host ({TP} x {PP} over {NNODES} " \
            f"{settings.engine.nnodes})"
        raise SettingsError(f"{CPU_BIND_VAR}={bind!r} gives {len(bind.split('|'))} core lists for {world} ranks "
                            f"{where}; give one per rank, or unset it to have them chosen")
    share = settings.engine.gpu_memory_utilization
    explicit = environ.get(CPU_KV_SPACE_VAR) or settings.engine.kv_cache_memory_bytes is not None  # no share read
    if not explicit and world * share > 1.0:
        raise SettingsError(f"--gpu-memory-utilization / POCSERVE_GPU_MEMORY_UTILIZATION: each of the {world} CPU "
                            f"ranks reserves {share:g} of RAM, more than all of it; use "
                            f"at most {1.0 / world:.3g}")


def _ranks_here(settings: BackendSettings, world: int) -> str:
    if settings.engine.nnodes == 1:
        return f"{TP} x {PP} = {world} ranks"
    return f"{world} ranks on this host ({TP} x {PP} over {NNODES} {settings.engine.nnodes})"


def _cores(n: int) -> str:
    return f"{n} core" if n == 1 else f"{n} cores"


def check_topology(settings: BackendSettings) -> None:
    """Every start check of the parallel sizes against the model and, on the CPU engine, the machine."""
    check_nodes(settings)
    check_split(model_config(settings.model), settings.engine.tensor_parallel_size,
                settings.engine.pipeline_parallel_size)
    if compat.is_cpu_build():
        check_cpu(settings, sorted(os.sched_getaffinity(0)), os.environ)


def cpu_core_lists(world: int, cpus: Sequence[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `world` ranks over `cpus`: contiguous, even shares ("0|1", "0-3|4-6").

    As vLLM's own auto binding does, one core is kept from the last rank for the engine process (scheduler,
    sockets) when that rank has more than one."""
    if not 0 < world <= len(cpus):
        raise ValueError(f"{world} ranks over {len(cpus)} cores")
    shares = [list(cpus[r * len(cpus) // world:(r + 1) * len(cpus) // world]) for r in range(world)]
    if len(shares[-1]) > 1:
        shares[-1].pop()
    return "|".join(_id_list(share) for share in shares)


def _id_list(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the list syntax vLLM parses)."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def numa_nodes(cpus: Sequence[int], root: Path = Path("/sys/devices/system/node")) -> int:
    """How many NUMA nodes hold at least one of `cpus` (1 where the kernel does not say)."""
    wanted, count = set(cpus), 0
    for node in root.glob("node[0-9]*"):
        try:
            ids = _parse_id_list((node / "cpulist").read_text().strip())
        except OSError:
            continue
        count += bool(wanted & ids)
    return max(count, 1)


def _parse_id_list(text: str) -> set[int]:
    ids: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    return ids


def bind_cpu_threads(settings: BackendSettings) -> None:
    """On the CPU engine with several ranks, sets one core list per rank where vLLM's own binding would fail:
    vLLM gives each rank a NUMA node of its own, so it is left to do so on a machine with enough nodes, and an
    operator's own lists are kept. Before the engine is built (vLLM reads it when it starts the workers). Across
    hosts, each host binds the ranks it runs."""
    world = local_world_size(settings)
    if world <= 1 or not compat.is_cpu_build() or os.environ.get(CPU_BIND_VAR, "auto") != "auto":
        return
    cpus = sorted(os.sched_getaffinity(0))
    if numa_nodes(cpus) >= world:
        return
    os.environ[CPU_BIND_VAR] = cpu_core_lists(world, cpus)
    log.info("cpu_threads_bound", ranks=world, core_lists=os.environ[CPU_BIND_VAR])
