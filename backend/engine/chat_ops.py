"""`--chat-ops`: what chat's compiled graph is traced from, while every eager forward keeps vLLM's custom kernels.

The engine runs with `custom_ops: ["all"]` (backend/engine/args.py): the PoC forward is eager, and its numerics
and its speed follow the fork's custom kernels. Under that set, torch.compile traces chat's graph through the same
kernels, as opaque calls Inductor cannot fuse; `vllm serve` (`custom_ops: ["none"]`) traces their PyTorch forms
and lets Inductor fuse them with their neighbours (rotary embedding with the q/k norms, for one), which leaves
fewer kernels in each decode step.

- `custom` (the default): chat's graph is traced through the custom kernels, as before.
- `inductor`: every custom op vLLM builds answers `forward_native` while Dynamo traces and its own kernel
  otherwise. So chat's compiled graph is `vllm serve`'s, and everything run eagerly (the PoC forward, eager chat,
  the logits) runs exactly the kernels it ran before, chosen at construction under the same op set: PoC
  artifacts stay the same bytes (tests/integration/test_architectures.py restarts with it).

It works by wrapping `CustomOp.dispatch_forward`, the one place vLLM picks an op's method, in every process that
builds the model (the engine's, and each worker's: vLLM imports the worker extension there before it loads the
model). The wrapper reads the choice from the vLLM config the model is built under (`additional_config`, which
vLLM hashes into its compile cache's key, so a graph compiled one way is never loaded for the other).
"""

from __future__ import annotations

from typing import Any

import torch

from backend.engine.args import CHAT_OPS_KEY

# Ops given the compile-time switch in this process: the RPC `chat_ops_wrapped` reports it.
num_wrapped = 0


def wanted(config: Any) -> bool:
    """Whether the config the model is being built under asks for Inductor-traced chat."""
    extra = getattr(config, "additional_config", None)
    return isinstance(extra, dict) and extra.get(CHAT_OPS_KEY) == "inductor"


def traced_native(native, chosen):
    """`native` while Dynamo traces (torch.compiler.is_compiling() is a constant there), `chosen` when run."""

    def forward(*args, **kwargs):
        if torch.compiler.is_compiling():
            return native(*args, **kwargs)
        return chosen(*args, **kwargs)

    return forward


def install() -> None:
    """Wraps CustomOp.dispatch_forward in this process, once; ops built under a config without the key are
    unchanged."""
    from backend.engine.compat import current_vllm_config, custom_op_class

    custom_op = custom_op_class()
    if getattr(custom_op.dispatch_forward, "pocserve_chat_ops", False):
        return
    original = custom_op.dispatch_forward

    def dispatch_forward(self, compile_native: bool):
        global num_wrapped
        chosen = original(self, compile_native=compile_native)
        native = self.forward_native
        # An op off in this set answers forward_native (or a compiled form of it): traced and run native already.
        # (forward_native may be a staticmethod: compare the functions.)
        is_kernel = (getattr(chosen, "__self__", None) is self
                     and getattr(chosen, "__func__", chosen) is not getattr(native, "__func__", native))
        if not is_kernel or not wanted(current_vllm_config()):
            return chosen
        num_wrapped += 1
        return traced_native(native, chosen)

    dispatch_forward.pocserve_chat_ops = True  # type: ignore[attr-defined]
    custom_op.dispatch_forward = dispatch_forward
