"""The compilation settings pocserve gives vLLM: custom ops always, the TP all-reduce fusion only where it can run."""

from __future__ import annotations

import pytest
from vllm.config import CompilationConfig

from backend.engine.args import allreduce_fusion, compilation_config
from backend.startup.settings import load_settings
from common.config import SettingsError


@pytest.mark.parametrize(("setting", "environ", "fused"), [
    ("auto", {}, True),
    ("auto", {"NCCL_NVLS_ENABLE": "0"}, False),
    ("auto", {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}, False),
    ("auto", {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}, True),
    ("on", {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}, True),
    ("off", {}, False),
], ids=["auto-multicast", "auto-nccl-nvls-off", "auto-symm-mem-multicast-off", "auto-multicast-on", "on", "off"])
def test_allreduce_fusion_table(setting, environ, fused):
    assert allreduce_fusion(setting, environ) is fused


def test_the_fusion_off_and_custom_ops_are_the_only_changes_to_the_given_config():
    given = CompilationConfig(mode=3, cudagraph_capture_sizes=[1, 2, 4])
    config = compilation_config(given, "auto", {})
    assert config.custom_ops == ["all"]
    assert config.pass_config.fuse_allreduce_rms == given.pass_config.fuse_allreduce_rms
    assert (config.mode, config.cudagraph_capture_sizes) == (3, [1, 2, 4])
    off = compilation_config(given, "auto", {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
    assert off.pass_config.fuse_allreduce_rms is False and given.custom_ops == []  # the given one is untouched
    # Through the command line: -cc reaches the engine with pocserve's two changes.
    e = load_settings(["--model", "m", "-cc", '{"mode": 0}', "--allreduce-fusion", "off"], {}).engine
    assert (e.compilation_config.mode, e.compilation_config.custom_ops) == (0, ["all"])
    assert e.compilation_config.pass_config.fuse_allreduce_rms is False


def test_an_unknown_allreduce_fusion_value_is_refused():
    with pytest.raises(SettingsError, match="--allreduce-fusion: invalid choice: 'maybe'"):
        load_settings(["--allreduce-fusion", "maybe"], {})
    with pytest.raises(SettingsError, match="POCSERVE_ALLREDUCE_FUSION"):
        load_settings([], {"POCSERVE_ALLREDUCE_FUSION": "maybe"})
    assert load_settings([], {"POCSERVE_ALLREDUCE_FUSION": "off"}).allreduce_fusion == "off"
