"""vLLM's engine core, behind one door for the engine thread (`adapter.Engine`, whose shape `EngineApi` states).

Every module that imports vLLM, and why:
- backend/engine/: the EngineCore and its arguments (adapter.py, args.py), the PoC runner's KV leases (poc.py),
  the worker extension class (worker_extension.py), and the PoC forward inside vLLM's workers (pocworker/);
- backend/processor/: vLLM's input and output processors, in the processor process;
- sampling/enforced.py and sampling/grammar.py: the sampler and grammar hooks, installed through the worker
  extension and on the engine core's structured-output manager.
Differences between the vLLM versions we run (0.26 on CUDA, 0.29 on CPU) live in compat.py only, and every
private vLLM symbol used is listed there and pinned by tests/unit/test_engine_compat.py.
"""

from __future__ import annotations

from typing import Any, Protocol

from protocol.common import Fingerprint


class EngineApi(Protocol):
    """What the engine loop, the chat table and the PoC service use of the engine (the tests' fakes too)."""

    # The PoC runner: artifact forwards on leased KV blocks (backend/engine/poc.py).
    poc: Any

    def fingerprint(self) -> Fingerprint: ...

    def add(self, request: Any) -> None:
        """One prepared vLLM EngineCoreRequest."""

    def abort(self, internal_ids: list[str]) -> None: ...

    def has_work(self) -> bool: ...

    def step(self) -> Any:
        """One engine step: its EngineCoreOutputs, or None."""

    def load(self) -> tuple[int, int, float]:
        """(running, waiting, KV cache usage)."""
