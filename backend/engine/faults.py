"""Fault injection for tests: an engine wrapper that fails on a chosen step, as a real engine crash would."""

from __future__ import annotations


class InjectedEngineFault(RuntimeError):
    pass


class FaultyEngine:
    """Delegates to the real engine; raises from step() on step number `fail_on_step` (1-based)."""

    def __init__(self, engine, fail_on_step: int) -> None:
        self._engine = engine
        self._fail_on_step = fail_on_step
        self._num_steps = 0

    def step(self):
        self._num_steps += 1
        if self._num_steps == self._fail_on_step:
            raise InjectedEngineFault(f"injected failure on engine step {self._num_steps}")
        return self._engine.step()

    def __getattr__(self, name: str):
        return getattr(self._engine, name)
