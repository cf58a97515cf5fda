"""The processor process: vLLM's input and output processing (chat template, tokenizer, detokenizer, stop strings,
logprobs) beside the engine process, as `vllm serve`'s API server sits beside its engine core.

Process entry: `entry.run_processor`; its loop: `main.Processor`. The engine process talks to it over two PAIR
sockets (`link.py`, `protocol/processor.py`): the link, the io thread's (prepared requests and deltas from the
processor, metrics jobs to it), and the engine thread's own, on which that thread sends everything it has for the
processor, a step's outputs above all (`link.EngineOut`).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.processor import Prepared


def link_address(link_dir: str) -> str:
    """The io thread's socket to the processor, in the engine process's private directory."""
    return f"ipc://{link_dir}/link.ipc"


def engine_address(link_dir: str) -> str:
    """The engine thread's own socket to the processor."""
    return f"ipc://{link_dir}/engine.ipc"


@dataclass
class PreparedRequests:
    """A Prepared header with the vLLM EngineCoreRequests that followed it, as the engine thread receives them."""

    header: Prepared
    requests: list
