"""The compilation settings pocserve gives vLLM: custom ops always, the TP all-reduce fusion only where it can run."""

from __future__ import annotations

import pytest
from vllm.config import CompilationConfig

from backend.engine.args import allreduce_fusion, compilation_config
from backend.settings import load_settings
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


def test_the_fusion_off_is_the_only_change_and_vllm_keeps_it():
    default = load_settings([], {})
    assert compilation_config(default, {}) == {"custom_ops": ["all"]}
    config = compilation_config(default, {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
    assert config == {"custom_ops": ["all"], "pass_config": {"fuse_allreduce_rms": False}}
    # vLLM's own config takes the dict as EngineArgs hands it on: the pass stays off, the others keep their defaults.
    built = CompilationConfig(**config)
    assert built.pass_config.fuse_allreduce_rms is False
    assert built.custom_ops == ["all"]


def test_an_unknown_allreduce_fusion_value_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        load_settings(["--allreduce-fusion", "maybe"], {})
    assert exc.value.code == 2
    assert "--allreduce-fusion: invalid choice: 'maybe'" in capsys.readouterr().err
    with pytest.raises(SettingsError, match="POCSERVE_ALLREDUCE_FUSION"):
        load_settings([], {"POCSERVE_ALLREDUCE_FUSION": "maybe"})
    assert load_settings([], {"POCSERVE_ALLREDUCE_FUSION": "off"}).allreduce_fusion == "off"
