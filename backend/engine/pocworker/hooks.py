"""The decoder layers of a vLLM model on this pipeline stage, and the reflection of their outputs.

The PoC forward (forward.py, eager or layer by layer) and the worker extension (extension.py) both use these; they
import only the PoC math from poc/ (no vLLM), so every other module of this package can import them.

On CUDA a layer's reflection rides on the norm that next adds its (hidden, residual) pair, the next layer's input
norm or the stack's final norm (`Reflections`, poc/cuda_kernels.py reflect_add_rms_norm): reflecting them apart
read and wrote both tensors once more per layer, 2-3% of the forward at memory speed and nearly all that PoC
costs over the bare forward (docs/benchmarks.md). POCSERVE_POC_FUSED_NORM=0 reflects apart, as on the CPU.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

import torch

from poc import cuda_kernels
from poc.errors import PocInputError
from poc.transforms import reflect

_LAYER_PATHS = (("model", "layers"), ("transformer", "h"), ("layers",))


def find_layers(model: torch.nn.Module) -> tuple[torch.nn.Module, Any] | None:
    """(the module holding it, the decoder layer list): the first of model.model.layers / model.transformer.h /
    model.layers that exists (the fork's rule); None if there is none."""
    for path in _LAYER_PATHS:
        holder, obj = model, model
        for name in path:
            holder, obj = obj, getattr(obj, name, None)
            if obj is None:
                break
        if obj is not None:
            return holder, obj
    return None


def _require_layers(model: torch.nn.Module) -> tuple[torch.nn.Module, Any]:
    found = find_layers(model)
    if found is None:
        raise PocInputError("model", f"{type(model).__name__} has no decoder layer list to reflect")
    return found


def decoder_layers(model: torch.nn.Module):
    """The decoder layer list; on a pipeline stage it is the whole model's, other stages' layers placeholders."""
    return _require_layers(model)[1]


def own_layers(model: torch.nn.Module) -> range:
    """Global indices of the decoder layers this pipeline stage holds (vLLM's start_layer/end_layer; all of them
    without pipeline parallel)."""
    holder, layers = _require_layers(model)
    return range(int(getattr(holder, "start_layer", 0)), int(getattr(holder, "end_layer", len(layers))))


# Decoder stacks whose forward is exactly: hidden = inputs_embeds, residual = None; for each layer
# hidden, residual = layer(positions=, hidden_states=, residual=); then norm(hidden, residual) (vLLM 0.26 / 0.29
# source for the first four, 0.29 for the others; gpt-oss's blocks take hidden_states first, hence the keywords).
# DeepseekV2Model (DeepSeek-V2, V3) also scales attention by position where its config sets llama_4_scaling (it
# then runs whole), and gathers sequence-parallel MoE outputs only with data parallel, which pocserve refuses.
LAYERWISE_MODELS = ("Qwen2Model", "Qwen3Model", "Qwen3MoeModel", "LlamaModel", "Glm4MoeModel", "MiniMaxM2Model",
                    "GptOssModel", "DeepseekV2Model")


def is_layerwise(stack) -> bool:
    """The PoC forward may run this decoder stack layer by layer (see LAYERWISE_MODELS)."""
    return (type(stack).__name__ in LAYERWISE_MODELS
            and getattr(getattr(stack, "config", None), "llama_4_scaling", None) is None)


def reflected(output, vector: torch.Tensor):
    """One layer's output (a tensor, or a tuple whose first two are hidden and residual) reflected with `vector`."""
    if isinstance(output, tuple):
        if len(output) >= 2:
            hidden, residual = output[0], output[1]
            if (hidden.shape == residual.shape and hidden.dtype == residual.dtype
                    and cuda_kernels.can_reflect_rows(hidden, vector)
                    and cuda_kernels.can_reflect_rows(residual, vector)):
                return (*cuda_kernels.reflect_pair(hidden, residual, vector), *output[2:])
            return (reflect(hidden, vector), reflect(residual, vector), *output[2:])
        return (reflect(output[0], vector),)
    return reflect(output, vector)


def fused_norms_enabled() -> bool:
    """Reflections may ride on the next norm (POCSERVE_POC_FUSED_NORM, on by default; never with vLLM's
    batch-invariant mode, whose norms are kernels of their own)."""
    return (os.environ.get("POCSERVE_POC_FUSED_NORM", "1") != "0"
            and os.environ.get("VLLM_BATCH_INVARIANT", "0") in ("", "0"))


def _is_plain_rms_norm(norm: Any) -> bool:
    """vLLM's RMSNorm itself with its weight: the math the fused kernel does (not a subclass, nor Gemma's 1 + w)."""
    return (type(norm).__name__ == "RMSNorm" and bool(getattr(norm, "has_weight", False))
            and bool(getattr(norm, "pass_weight_add", True)) and getattr(norm, "variance_size_override", None) is None
            and isinstance(getattr(norm, "weight", None), torch.Tensor)
            and isinstance(getattr(norm, "variance_epsilon", None), float))


def _next_norms(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Own layer index → the norm that next adds its output pair, for the stacks whose layer loop is known: the next
    layer's input norm, or the final norm after the model's last layer. A stage's last layer before another
    stage has none (its pair leaves for the next stage reflected)."""
    stack = getattr(model, "model", None)
    if stack is None or not is_layerwise(stack):
        return {}
    layers, own = stack.layers, own_layers(model)
    norms = {}
    for i in own:
        if i + 1 in own:
            norm = getattr(layers[i + 1], "input_layernorm", None)
        elif i + 1 == len(layers):
            norm = getattr(stack, "norm", None)
        else:
            continue
        if _is_plain_rms_norm(norm):
            norms[i] = norm
    return norms


class Reflections:
    """Each decoder layer's output pair reflected with that layer's vector: at once, or left to the norm that next
    adds the pair, which then reflects and normalises in one kernel (poc/cuda_kernels.py reflect_add_rms_norm,
    where can_reflect_into_norm takes the tensors).

    The norm is given an instance `forward` only within `applied()`, so a chat step run between two parts of a
    layer-by-layer forward never meets it. It reflects only the very pair it was left (any other call is the norm's
    own), and `check_applied` raises if the forward ended with a reflection not done: its result would be wrong."""

    def __init__(self, model: torch.nn.Module, vectors: torch.Tensor, fuse: bool | None = None) -> None:
        self.vectors = vectors
        self._next_norms = _next_norms(model) if (fused_norms_enabled() if fuse is None else fuse) else {}
        self._fused_norm, self._can_fuse = cuda_kernels.reflect_add_rms_norm, cuda_kernels.can_reflect_into_norm
        self._pending: tuple[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._active = False

    def output(self, i: int, out):
        """What layer i's output becomes: reflected, or as it is with its reflection left to the next norm."""
        vector, norm = self.vectors[i], self._next_norms.get(i)
        if (norm is not None and self._pending is None and isinstance(out, tuple) and len(out) == 2
                and self._can_fuse(out[0], out[1], vector, norm.weight)):
            self._pending = (norm, out[0], out[1], vector)
            if self._active:
                self._install()
            return out
        return reflected(out, vector)

    @contextmanager
    def applied(self):
        """Within it, a reflection left to a norm is done by that norm's call on the pair."""
        self._active = True
        if self._pending is not None:
            self._install()
        try:
            yield self
        finally:
            self._active = False
            if self._pending is not None:
                self._pending[0].__dict__.pop("forward", None)

    def check_applied(self) -> None:
        if self._pending is not None:
            raise RuntimeError(f"a decoder layer's reflection was left to {type(self._pending[0]).__name__}, which "
                               "was not called on its output pair: the forward would be wrong (set "
                               "POCSERVE_POC_FUSED_NORM=0 and report the model)")

    def _install(self) -> None:
        assert self._pending is not None
        norm = self._pending[0]

        def forward(x: torch.Tensor, residual: torch.Tensor | None = None):
            pending = self._pending
            if pending is None or x is not pending[1] or residual is not pending[2]:
                return type(norm).forward(norm, x, residual)
            norm.__dict__.pop("forward", None)
            self._pending = None
            return self._fused_norm(x, residual, pending[3], norm.weight, norm.variance_epsilon)

        norm.forward = forward


@contextmanager
def reflection_hooks(model: torch.nn.Module, vectors: torch.Tensor, fuse: bool | None = None):
    """Reflects every decoder layer's (hidden, residual) output with that layer's Householder vector, during a
    whole forward of `model` (Reflections: on CUDA within the next norm).

    vLLM layers return (hidden, residual) and the true residual stream is their sum, so reflecting both equals
    reflecting the whole stream after every layer (reflection is linear).

    Under pipeline parallel only this stage's layers are hooked; `vectors` is indexed by global layer index.
    """
    layers = decoder_layers(model)
    reflections = Reflections(model, vectors, fuse)
    handles = []
    try:
        for i in own_layers(model):
            layer = layers[i]
            if isinstance(layer, torch.nn.Module) and type(layer).__name__ != "PPMissingLayer":
                handles.append(layer.register_forward_hook(
                    lambda _module, _inputs, out, i=i: reflections.output(i, out)))
        with reflections.applied():
            yield
        reflections.check_applied()
    finally:
        for h in handles:
            h.remove()
