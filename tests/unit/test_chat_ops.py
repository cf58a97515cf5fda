"""--chat-ops (backend/engine/chat_ops.py): a vLLM custom op built under `inductor` is traced native by Dynamo and
runs its own kernel when called; under `custom`, or off in the op set, nothing changes. And the settings reach
vLLM's additional_config only where they differ from the default."""

from __future__ import annotations

import pytest
import torch
from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.custom_op import CustomOp

from backend.engine import chat_ops
from backend.engine.args import CHAT_OPS_KEY, additional_config
from backend.startup.settings import load_settings
from common.config import SettingsError

chat_ops.install()


@CustomOp.register("pocserve_test_plus")
class Plus(CustomOp):
    """Native adds 1; the 'kernel' (every platform's method) adds 100, so a result tells which one ran."""

    def forward_native(self, x):
        return x + 1

    def forward_cuda(self, x):
        return x + 100

    forward_cpu = forward_cuda


@CustomOp.register("pocserve_test_static")
class StaticPlus(CustomOp):
    """As vLLM's SiluAndMul: forward_native a staticmethod."""

    @staticmethod
    def forward_native(x):
        return x + 1

    def forward_cuda(self, x):
        return x + 100

    forward_cpu = forward_cuda


def test_a_static_native_form_is_told_apart_too() -> None:
    config = VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"]),
                        additional_config={CHAT_OPS_KEY: "inductor"})
    with set_current_vllm_config(config):
        op = StaticPlus()
    x = torch.zeros(1)
    assert op(x).tolist() == [100.0] and _traced(op, x).tolist() == [1.0]


def _built(custom_ops: list[str], extra: dict) -> Plus:
    config = VllmConfig(compilation_config=CompilationConfig(custom_ops=custom_ops), additional_config=extra)
    with set_current_vllm_config(config):
        return Plus()


def _traced(op: Plus, x: torch.Tensor) -> torch.Tensor:
    torch._dynamo.reset()
    return torch.compile(lambda t: op(t), backend="eager", fullgraph=True)(x)


def test_inductor_traces_native_and_runs_the_kernel() -> None:
    before = chat_ops.num_wrapped
    op = _built(["all"], {CHAT_OPS_KEY: "inductor"})
    x = torch.zeros(3)
    assert op(x).tolist() == [100.0] * 3  # eager: the kernel, as under custom
    assert _traced(op, x).tolist() == [1.0] * 3  # what Dynamo put in the graph: the PyTorch form
    assert chat_ops.num_wrapped == before + 1


@pytest.mark.parametrize(("custom_ops", "extra", "eager", "traced"), [
    (["all"], {}, 100.0, 100.0),  # custom: traced through the kernel, as before
    (["all"], {CHAT_OPS_KEY: "custom"}, 100.0, 100.0),
    (["none"], {CHAT_OPS_KEY: "inductor"}, 1.0, 1.0),  # off in the set: native both ways, not wrapped
], ids=["no-key", "custom", "op-off"])
def test_otherwise_nothing_changes(custom_ops, extra, eager, traced) -> None:
    before = chat_ops.num_wrapped
    op = _built(custom_ops, extra)
    x = torch.zeros(2)
    assert op(x).tolist() == [eager] * 2 and _traced(op, x).tolist() == [traced] * 2
    assert chat_ops.num_wrapped == before


def test_install_wraps_once() -> None:
    wrapped = CustomOp.dispatch_forward
    chat_ops.install()
    assert CustomOp.dispatch_forward is wrapped


def test_the_setting_reaches_additional_config_only_off_the_default() -> None:
    assert additional_config({"other": 1}, "custom") == {"other": 1}
    assert additional_config(None, "inductor") == {CHAT_OPS_KEY: "inductor"}
    assert additional_config({"other": 1}, "inductor") == {"other": 1, CHAT_OPS_KEY: "inductor"}
    settings = load_settings(["--chat-ops", "inductor"], {})
    assert settings.engine.additional_config == {CHAT_OPS_KEY: "inductor"}
    assert load_settings([], {}).engine.additional_config == {}
    with pytest.raises(SettingsError):
        load_settings(["--chat-ops", "fast"], {})
