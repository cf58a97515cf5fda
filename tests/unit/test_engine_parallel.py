"""The parallel topology's start checks and the CPU engine's per-rank core lists (backend/engine/parallel.py)."""

from __future__ import annotations

import json
import re

import pytest

from backend.engine import compat, parallel
from backend.startup import settings as backend_settings
from common.config import SettingsError

# The tiny model's shape (4 heads, 2 KV heads, 4 layers) and a MoE one.
TINY = {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4, "intermediate_size": 768}
MOE = {"num_attention_heads": 64, "num_key_value_heads": 4, "num_hidden_layers": 94, "intermediate_size": 12288,
       "moe_intermediate_size": 1536}


def _settings(*argv: str) -> backend_settings.BackendSettings:
    return backend_settings.load_settings(list(argv), {})


@pytest.mark.parametrize(("config", "tp", "pp"), [
    (TINY, 1, 1), (TINY, 2, 1), (TINY, 4, 1), (TINY, 1, 4), (TINY, 2, 2),
    (MOE, 8, 1), (MOE, 4, 2), (MOE, 16, 1), ({}, 3, 7),
], ids=["tiny-1", "tiny-tp2", "tiny-tp4-kv-replicated", "tiny-pp4", "tiny-tp2pp2", "moe-tp8", "moe-tp4pp2",
        "moe-tp16-kv-replicated", "no-config"])
def test_engine_parallel_check_split_accepts(config, tp, pp):
    assert parallel.check_split(config, tp, pp) is None  # no SettingsError


@pytest.mark.parametrize(("config", "tp", "pp", "setting", "words"), [
    (TINY, 3, 1, parallel.TP, "4 attention heads"),
    ({**TINY, "num_attention_heads": 6, "num_key_value_heads": 3}, 2, 1, parallel.TP, "3 key-value heads"),
    ({**TINY, "intermediate_size": 770}, 4, 1, parallel.TP, "intermediate_size 770"),
    ({**MOE, "moe_intermediate_size": 1540}, 8, 1, parallel.TP, "moe_intermediate_size 1540"),
    (TINY, 1, 5, parallel.PP, "4 decoder layers"),
], ids=["heads", "kv-heads", "intermediate", "moe-intermediate", "layers"])
def test_engine_parallel_check_split_names_the_setting(config, tp, pp, setting, words):
    with pytest.raises(SettingsError) as e:
        parallel.check_split(config, tp, pp)
    assert str(e.value).startswith(setting) and words in str(e.value)
    assert "\n" not in str(e.value)


def test_engine_parallel_model_config_merges_text_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["X"], "num_hidden_layers": 1,
                                                      "text_config": {"num_hidden_layers": 32}}))
    assert parallel.model_config(tmp_path) == {"architectures": ["X"], "num_hidden_layers": 32,
                                               "text_config": {"num_hidden_layers": 32}}
    assert parallel.model_config(tmp_path / "missing") == {}


def test_engine_parallel_check_cpu_needs_a_core_per_rank():
    parallel.check_cpu(_settings("--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.1"), [0, 1], {})
    with pytest.raises(SettingsError, match="2 ranks, but this process may use 1 core and"):
        parallel.check_cpu(_settings("--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.1"), [0], {})
    with pytest.raises(SettingsError, match="4 ranks"):
        parallel.check_cpu(_settings("--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
                                     "--gpu-memory-utilization", "0.1"), [0, 1], {"VLLM_CPU_OMP_THREADS_BIND": "auto"})
    # The operator's own core lists may share cores; they must give one list per rank.
    parallel.check_cpu(_settings("--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
                                 "--gpu-memory-utilization", "0.1"), [0, 1], {"VLLM_CPU_OMP_THREADS_BIND": "0|1|0|1"})
    mismatch = re.escape("VLLM_CPU_OMP_THREADS_BIND='0|1' gives 2 core lists for 4 ranks")
    with pytest.raises(SettingsError, match=mismatch):
        parallel.check_cpu(_settings("--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
                                     "--gpu-memory-utilization", "0.1"), [0, 1, 2, 3],
                           {"VLLM_CPU_OMP_THREADS_BIND": "0|1"})


def test_engine_parallel_nodes_share_the_ranks_evenly():
    parallel.check_nodes(_settings("--tensor-parallel-size", "4", "--nnodes", "2"))
    with pytest.raises(SettingsError, match=re.escape("--nnodes / POCSERVE_NNODES: 3 hosts cannot share")):
        parallel.check_nodes(_settings("--tensor-parallel-size", "4", "--nnodes", "3"))


def test_engine_parallel_check_cpu_counts_this_hosts_ranks():
    two_nodes = ("--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--nnodes", "2",
                 "--gpu-memory-utilization", "0.1")
    parallel.check_cpu(_settings(*two_nodes), [0, 1], {})  # 4 ranks, 2 on this host
    with pytest.raises(SettingsError, match=re.escape("2 ranks on this host (")):
        parallel.check_cpu(_settings(*two_nodes), [0], {})
    parallel.check_cpu(_settings(*two_nodes), [0], {"VLLM_CPU_OMP_THREADS_BIND": "0|0"})


def test_engine_parallel_check_cpu_memory_share():
    with pytest.raises(SettingsError, match=r"^--gpu-memory-utilization .* use at most 0.333"):
        parallel.check_cpu(_settings("--pipeline-parallel-size", "3", "--gpu-memory-utilization", "0.4"),
                           [0, 1, 2, 3], {})
    # A fixed KV cache per rank (vLLM's VLLM_CPU_KVCACHE_SPACE) replaces the share of RAM.
    parallel.check_cpu(_settings("--pipeline-parallel-size", "3", "--gpu-memory-utilization", "0.4"),
                       [0, 1, 2, 3], {"VLLM_CPU_KVCACHE_SPACE": "1"})
    parallel.check_cpu(_settings("--pipeline-parallel-size", "3", "--kv-cache-memory-bytes", "64M"),
                       [0, 1, 2, 3], {})  # so does vLLM's flag for it: the default share of 0.3 is not read
    parallel.check_cpu(_settings("--gpu-memory-utilization", "0.9"), [0], {})  # one rank: nothing to share


@pytest.mark.parametrize(("world", "cpus", "expected"), [
    (2, [0, 1], "0|1"),
    (2, [0, 1, 2, 3], "0-1|2"),
    (3, list(range(8)), "0-1|2-4|5-6"),
    (4, [0, 1, 2, 3], "0|1|2|3"),
    (2, [0, 2, 4, 6, 7, 8], "0,2,4|6-7"),
])
def test_engine_parallel_cpu_core_lists_are_even_contiguous_shares(world, cpus, expected):
    assert parallel.cpu_core_lists(world, cpus) == expected


def test_engine_parallel_numa_nodes_counts_nodes_holding_our_cores(tmp_path):
    for node, cpulist in (("node0", "0-3,8"), ("node1", "4-7"), ("node2", "")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpulist + "\n")
    assert parallel.numa_nodes([0, 1], tmp_path) == 1
    assert parallel.numa_nodes([3, 4], tmp_path) == 2
    assert parallel.numa_nodes([8], tmp_path / "missing") == 1


@pytest.fixture
def cpu_engine(monkeypatch):
    """A CPU build with two allowed cores on one NUMA node and no binding set."""
    monkeypatch.setattr(compat, "is_cpu_build", lambda: True)
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(parallel, "numa_nodes", lambda _cpus: 1)
    monkeypatch.delenv(parallel.CPU_BIND_VAR, raising=False)


def test_engine_parallel_bind_cpu_threads_sets_one_list_per_rank(cpu_engine):
    parallel.bind_cpu_threads(_settings("--pipeline-parallel-size", "2"))
    assert parallel.os.environ[parallel.CPU_BIND_VAR] == "0|1"


@pytest.mark.parametrize("preset", ["0|0", "nobind"])
def test_engine_parallel_bind_cpu_threads_keeps_the_operators(cpu_engine, monkeypatch, preset):
    monkeypatch.setenv(parallel.CPU_BIND_VAR, preset)
    parallel.bind_cpu_threads(_settings("--tensor-parallel-size", "2"))
    assert parallel.os.environ[parallel.CPU_BIND_VAR] == preset


def test_engine_parallel_bind_cpu_threads_leaves_one_rank_and_numa_machines_alone(cpu_engine, monkeypatch):
    parallel.bind_cpu_threads(_settings())
    assert parallel.CPU_BIND_VAR not in parallel.os.environ
    monkeypatch.setattr(parallel, "numa_nodes", lambda _cpus: 2)  # vLLM binds a node per rank itself
    parallel.bind_cpu_threads(_settings("--tensor-parallel-size", "2"))
    assert parallel.CPU_BIND_VAR not in parallel.os.environ
