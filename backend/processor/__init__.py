"""The processor process: vLLM's input and output processing (chat template, tokenizer, detokenizer, stop strings,
logprobs) beside the engine process, as `vllm serve`'s API server sits beside its engine core.

Process entry: `entry.run_processor`; its loop: `main.Processor`. The engine process talks to it over a PAIR
socket (`link.py`, `protocol/processor.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.processor import Prepared


@dataclass
class PreparedRequests:
    """A Prepared header with the vLLM EngineCoreRequests that followed it, as the engine thread receives them."""

    header: Prepared
    requests: list
