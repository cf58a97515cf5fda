"""Paced PoC forwards (backend/engine/pocworker/pacing.py, extension.py): how far ahead of the GPU layers are queued,
the layer time learned from the chunks' own events, and the move onto PoC's SMs when chat comes."""

from __future__ import annotations

import pytest
import torch

from backend.engine.pocworker import pacing
from backend.engine.pocworker.extension import PocWorkerExtension, _InFlight
from poc.spec import ForwardBatch, PocSpec

SHAPE = (32, 1024)


class Clock:
    """The GPU's clock: events recorded at a device time, done once the clock passes it."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.queued_until_ms = 0.0


class Event:
    def __init__(self, clock: Clock, layer_ms: float, layers: list[int]) -> None:
        self.clock, self.layer_ms, self.layers = clock, layer_ms, layers
        self.at_ms: float | None = None

    def record(self, stream) -> None:
        # The GPU runs the chunk's layers after whatever is queued (or now, if it idles).
        start = max(self.clock.now_ms, self.clock.queued_until_ms)
        self.at_ms = self.clock.queued_until_ms = start + self.layer_ms * self.layers[0]

    def query(self) -> bool:
        assert self.at_ms is not None
        return self.clock.now_ms >= self.at_ms

    def elapsed_time(self, end: Event) -> float:
        assert self.at_ms is not None and end.at_ms is not None
        return end.at_ms - self.at_ms


def _pacer(layer_ms: float) -> tuple[pacing.Pacer, Clock, list[int]]:
    clock, layers = Clock(), [0]  # layers: what the next recorded chunk holds (set before `queued`)
    return pacing.Pacer(lambda: Event(clock, layer_ms, layers)), clock, layers


def _queue(pacer: pacing.Pacer, layers: list[int]) -> int:
    n = pacer.layers_to_queue(SHAPE)
    layers[0] = n
    pacer.queued(SHAPE, n, stream=None)
    return n


def test_pacing_keeps_its_first_layers_ahead_until_the_layer_time_is_known():
    pacer, clock, layers = _pacer(layer_ms=3.0)
    assert _queue(pacer, layers) == pacing.FIRST_AHEAD_LAYERS
    assert pacer.layers_to_queue(SHAPE) == 0  # the GPU has enough ahead
    clock.now_ms = 3.0  # one layer done; its chunk (two layers) is not
    assert pacer.layers_to_queue(SHAPE) == 0


def test_pacing_learns_the_layer_time_from_back_to_back_chunks_and_bounds_the_work_ahead():
    pacer, clock, layers = _pacer(layer_ms=1.0)
    _queue(pacer, layers)  # 2 layers, done at 2 ms
    clock.now_ms = 1.5
    assert _queue(pacer, layers) == 0  # still 2 ahead
    clock.now_ms = 2.0
    assert _queue(pacer, layers) == 2  # the first chunk retired; the next is queued behind nothing: not timed
    clock.now_ms = 3.0
    assert _queue(pacer, layers) == 0
    clock.now_ms = 3.5  # the second chunk still runs: the next one is queued back to back
    layers[0] = 1
    pacer.queued(SHAPE, 1, stream=None)  # ends at 5 ms
    clock.now_ms = 5.0
    n = pacer.layers_to_queue(SHAPE)  # both retired: the last one timed at 1 ms a layer
    assert pacer.layer_s[SHAPE] == pytest.approx(0.001)
    assert n == round(pacing.AHEAD_S / 0.001)  # AHEAD_S of device work, in layers


def test_pacing_skips_a_forward_shorter_than_the_bound():
    pacer, _, _ = _pacer(layer_ms=1.0)
    assert pacer.is_worth_pacing(SHAPE, num_layers=28)  # not measured yet
    pacer.layer_s[SHAPE] = 0.0001  # 28 layers: 2.8 ms, within AHEAD_S
    assert not pacer.is_worth_pacing(SHAPE, num_layers=28)
    pacer.layer_s[SHAPE] = 0.003
    assert pacer.is_worth_pacing(SHAPE, num_layers=28)


class Stream:
    def __init__(self, name: str) -> None:
        self.name, self.waited_for = name, []

    def wait_stream(self, other) -> None:
        self.waited_for.append(other)


class Forward:
    """forward.LayerwiseForward's part a paced forward uses."""

    def __init__(self, layers: int) -> None:
        self.left, self.max_layers, self.recorded_on = layers, [], []
        self.last_hidden = None

    @property
    def layers_left(self) -> int:
        return self.left

    @property
    def is_queued(self) -> bool:
        return self.left == 0

    def advance(self, budget_s: float, max_layers: int | None = None) -> bool:
        self.max_layers.append(max_layers)
        self.left -= self.left if max_layers is None else min(self.left, max_layers)
        return self.is_queued

    def record_stream(self, stream) -> None:
        self.recorded_on.append(stream)


class Streams:
    def __init__(self) -> None:
        self.alone, self.beside, self.carveout = Stream("alone"), Stream("beside"), 84


def test_a_paced_forward_moves_onto_pocs_sms_when_chat_runs(monkeypatch):
    """Queued as its pacing allows while chat is idle; once chat runs, the rest goes beside chat (after the layers
    queued so far, whose activations it keeps alive there) and is queued as any forward."""
    worker = PocWorkerExtension()
    worker._poc_streams = Streams()
    pacer, _, layers = _pacer(layer_ms=3.0)
    worker._poc_pacer = pacer
    monkeypatch.setattr(worker, "_on_poc_stream", lambda stream, carveout: _nothing())
    forward = Forward(layers=28)
    batch = ForwardBatch(PocSpec("h", "pk", SHAPE[1], k_dim=4), tuple(range(SHAPE[0])), (1,))
    f = _InFlight(forward, worker._poc_streams.alone, 0, batch, paced=True)
    worker._poc_in_flight.append(f)
    layers[0] = 1  # what each of the pacer's events records: one layer
    assert worker.poc_poll(wait=False, budget_s=float("inf")) == (False, None, False)
    assert forward.max_layers == [1] * pacing.FIRST_AHEAD_LAYERS and forward.left == 26
    assert worker.poc_poll(wait=False, budget_s=float("inf")) == (False, None, False)
    assert forward.left == 26  # nothing more until the GPU has run some
    monkeypatch.setattr(torch.cuda, "Event", lambda **kw: _Done())
    assert worker.poc_poll(wait=False, budget_s=0.0015, is_chat_running=True) == (False, None, False)
    assert not f.paced and f.stream is worker._poc_streams.beside and f.carveout == 84
    assert worker._poc_streams.beside.waited_for == [worker._poc_streams.alone]
    assert forward.recorded_on == [worker._poc_streams.beside] and forward.left == 26  # chat's step goes first
    assert worker.poc_poll(wait=False, budget_s=0.0015, is_chat_running=True) == (False, None, True)
    assert forward.max_layers[-1] is None


class _Done:
    def record(self, stream) -> None:
        pass

    def query(self) -> bool:
        return False


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None
