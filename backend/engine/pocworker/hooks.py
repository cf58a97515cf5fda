"""The decoder layers of a vLLM model on this pipeline stage, and the hooks that reflect their outputs.

The PoC forward (forward.py, eager or layer by layer) and the worker extension (extension.py) both use these; they
import only the PoC math from poc/ (no vLLM), so every other module of this package can import them.
"""

from __future__ import annotations

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


def reflect_output(vector: torch.Tensor):
    """A forward hook reflecting one layer's output with `vector` (LayerwiseForward calls it directly)."""

    def hook(_module, _inputs, output):
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
    return hook


@contextmanager
def reflection_hooks(model: torch.nn.Module, vectors: torch.Tensor):
    """Reflects every decoder layer's (hidden, residual) output with that layer's Householder vector.

    vLLM layers return (hidden, residual) and the true residual stream is their sum, so reflecting both equals
    reflecting the whole stream after every layer (reflection is linear).

    Under pipeline parallel only this stage's layers are hooked; `vectors` is indexed by global layer index.
    """
    layers = decoder_layers(model)
    handles = []
    try:
        for i in own_layers(model):
            layer = layers[i]
            if isinstance(layer, torch.nn.Module) and type(layer).__name__ != "PPMissingLayer":
                handles.append(layer.register_forward_hook(reflect_output(vectors[i])))
        yield
    finally:
        for h in handles:
            h.remove()
