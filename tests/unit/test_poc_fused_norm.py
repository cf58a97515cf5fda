"""A layer's reflection left to the norm that next adds its pair (backend/engine/pocworker/hooks.py Reflections),
on the CPU with the fused kernel's torch definition (poc/transforms.py reflect_add_rms_norm_torch) in its place:
the same values as reflecting at once, only where the layer loop is known, never outside the PoC forward, and
never silently lost. The CUDA kernel against that definition is tests/unit/test_poc_cuda.py's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from backend.engine.pocworker import hooks
from backend.engine.pocworker.hooks import Reflections, reflection_hooks
from poc import cuda_kernels
from poc.transforms import reflect_add_rms_norm_torch

HIDDEN, LAYERS, EPS = 16, 4, 1e-6


class RMSNorm(nn.Module):
    """Named and shaped like vLLM's: (x) → norm; (x, residual) → (norm of the sum, the sum)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(HIDDEN, dtype=torch.bfloat16) + 0.5)
        self.variance_epsilon, self.has_weight, self.variance_size_override = EPS, True, None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        z = x if residual is None else x + residual
        zf = z.float()
        out = (zf * torch.rsqrt(zf.pow(2).sum(-1, keepdim=True) / HIDDEN + self.variance_epsilon)).to(z.dtype)
        out = out * self.weight
        return out if residual is None else (out, z)


class GemmaRMSNorm(RMSNorm):
    """Another norm's math under another name: never given a reflection."""


class Layer(nn.Module):
    """vLLM's decoder layer shape: the input norm adds the previous pair, the layer returns (hidden, residual)."""

    def __init__(self, norm: type[nn.Module] = RMSNorm, copies_input: bool = False) -> None:
        super().__init__()
        self.input_layernorm = norm()
        self.mix = nn.Linear(HIDDEN, HIDDEN, dtype=torch.bfloat16)
        self.copies_input = copies_input

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual, hidden = hidden_states, self.input_layernorm(hidden_states)
        else:
            hidden_states = hidden_states.clone() if self.copies_input else hidden_states
            hidden, residual = self.input_layernorm(hidden_states, residual)
        return self.mix(hidden), residual


class Qwen3Model(nn.Module):
    def __init__(self, start: int = 0, end: int = LAYERS, layer=Layer) -> None:
        super().__init__()
        self.layers = nn.ModuleList([layer() if start <= i < end else nn.Identity() for i in range(LAYERS)])
        self.norm = RMSNorm()
        self.start_layer, self.end_layer = start, end

    def forward(self, positions, hidden_states):
        residual = None
        for i in range(self.start_layer, self.end_layer):
            hidden_states, residual = self.layers[i](positions, hidden_states, residual)
        if self.end_layer < LAYERS:
            return hidden_states, residual  # a stage before another: its pair goes on
        return self.norm(hidden_states, residual)[0]


class Model(nn.Module):
    def __init__(self, stack: nn.Module) -> None:
        super().__init__()
        self.model = stack

    def forward(self, positions, hidden_states):
        return self.model(positions, hidden_states)


@pytest.fixture
def fused_calls(monkeypatch) -> list[int]:
    """The fused kernel replaced by its definition, taking every CPU tensor; each call's row count."""
    calls: list[int] = []

    def fused(hidden, residual, v, weight, eps):
        calls.append(hidden.shape[0])
        return reflect_add_rms_norm_torch(hidden, residual, v, weight, eps)

    monkeypatch.setattr(cuda_kernels, "reflect_add_rms_norm", fused)
    monkeypatch.setattr(cuda_kernels, "can_reflect_into_norm", lambda *_: True)
    return calls


def _model(**kwargs) -> Model:
    torch.manual_seed(0)
    return Model(Qwen3Model(**kwargs))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    vectors = torch.nn.functional.normalize(torch.randn(LAYERS, HIDDEN), dim=-1).to(torch.bfloat16)
    return torch.randn(5, HIDDEN, dtype=torch.bfloat16), vectors


def _run(model: Model, fuse: bool):
    x, vectors = _inputs()
    with torch.no_grad(), reflection_hooks(model, vectors, fuse=fuse):
        return model(None, x)


def test_each_reflection_rides_on_the_next_norm_with_the_same_values(fused_calls):
    model = _model()
    apart = _run(model, fuse=False)
    assert fused_calls == []
    fused = _run(model, fuse=True)
    # Layers 0-2 into the next layer's input norm, layer 3 into the final norm; bf16 bit for bit.
    assert fused_calls == [5] * LAYERS
    assert torch.equal(fused, apart)
    assert not any("forward" in vars(m) for m in model.modules())


def test_a_stage_before_another_sends_its_last_pair_reflected(fused_calls):
    first, last = _model(start=0, end=2), _model(start=2, end=LAYERS)
    assert all(torch.equal(a, b) for a, b in zip(_run(first, fuse=True), _run(first, fuse=False), strict=True))
    assert fused_calls == [5]  # layer 0 into layer 1's norm; layer 1 leaves for the next stage reflected
    fused_calls.clear()
    assert torch.equal(_run(last, fuse=True), _run(last, fuse=False))
    assert fused_calls == [5, 5]  # the last stage: layer 2 into layer 3's norm, layer 3 into the final norm


def test_between_parts_of_a_forward_the_norms_are_their_own(fused_calls):
    """A layer-by-layer forward leaves a reflection pending across a chat step: the chat's call of the norm gets
    the norm's own result, and the PoC forward's next part still reflects its pair."""
    model = _model()
    x, vectors = _inputs()
    reflections = Reflections(model, vectors, fuse=True)
    layers = model.model.layers
    with torch.no_grad():
        with reflections.applied():
            hidden, residual = reflections.output(0, layers[0](None, x, None))
        norm = layers[1].input_layernorm
        assert "forward" not in vars(norm)
        other = torch.randn_like(x), torch.randn_like(x)
        assert all(torch.equal(a, b) for a, b in zip(norm(*other), RMSNorm.forward(norm, *other), strict=True))
        with reflections.applied():
            for i in range(1, LAYERS):
                hidden, residual = reflections.output(i, layers[i](None, hidden, residual))
            out = model.model.norm(hidden, residual)[0]
            reflections.check_applied()
    assert torch.equal(out, _run(model, fuse=False))
    assert fused_calls == [5] * LAYERS


def test_a_layer_that_does_not_norm_the_pair_it_was_given_fails_the_forward(fused_calls):
    with pytest.raises(RuntimeError, match="was not called on its output pair"):
        _run(_model(layer=lambda: Layer(copies_input=True)), fuse=True)


@pytest.mark.parametrize("change", ["another norm", "another stack", "switched off", "batch invariant"])
def test_reflections_are_done_at_once_where_the_norm_is_not_known(fused_calls, monkeypatch, change):
    model = _model(layer=lambda: Layer(GemmaRMSNorm)) if change == "another norm" else _model()
    if change == "another norm":
        model.model.norm = GemmaRMSNorm()
    if change == "another stack":
        model.model.__class__ = type("Qwen3NextModel", (Qwen3Model,), {})
    if change == "switched off":
        monkeypatch.setenv("POCSERVE_POC_FUSED_NORM", "0")
    if change == "batch invariant":
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    x, vectors = _inputs()
    with torch.no_grad(), reflection_hooks(model, vectors):  # fuse unset: the environment decides
        fused = model(None, x)
    assert fused_calls == []
    assert torch.equal(fused, _run(model, fuse=False))


def test_fusion_is_on_by_default(monkeypatch):
    monkeypatch.delenv("POCSERVE_POC_FUSED_NORM", raising=False)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    assert hooks.fused_norms_enabled()
