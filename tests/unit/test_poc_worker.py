"""The worker side's layer hooks on a pipeline stage: only the stage's own layers, with global layer indices."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from backend.engine.pocworker.extension import PocWorkerExtension, _InFlight
from backend.engine.pocworker.graphs import GraphedForward
from backend.engine.pocworker.hooks import own_layers, reflection_hooks
from poc.errors import PocInputError
from poc.spec import ForwardBatch, PocSpec
from poc.transforms import reflect_torch

HIDDEN = 8


class Layer(nn.Module):
    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return hidden, residual


class PPMissingLayer(nn.Identity):
    """Named like vLLM's placeholder for another stage's layer."""


def _stage(num_layers: int, start: int, end: int) -> nn.Module:
    """A vLLM-shaped model on one pipeline stage: model.model.layers holds every layer index, placeholders for
    the layers of other stages, and start_layer/end_layer say which are this stage's."""
    inner = nn.Module()
    inner.layers = nn.ModuleList([Layer() if start <= i < end else PPMissingLayer() for i in range(num_layers)])
    inner.start_layer, inner.end_layer = start, end
    model = nn.Module()
    model.model = inner
    return model


def test_poc_worker_own_layers_are_the_stage_range():
    assert own_layers(_stage(6, 2, 4)) == range(2, 4)
    single = _stage(3, 0, 3)
    del single.model.start_layer, single.model.end_layer  # a model without pipeline attributes: all its layers
    assert own_layers(single) == range(0, 3)


def test_poc_worker_hooks_only_own_layers_with_global_vectors():
    model = _stage(6, 2, 4)
    vectors = torch.nn.functional.normalize(torch.randn(6, HIDDEN), dim=-1)
    hidden, residual = torch.randn(3, HIDDEN), torch.randn(3, HIDDEN)
    with reflection_hooks(model, vectors):
        hooked = [i for i, layer in enumerate(model.model.layers) if layer._forward_hooks]
        out = model.model.layers[3](hidden, residual)
    assert hooked == [2, 3]
    assert torch.allclose(out[0], reflect_torch(hidden, vectors[3]))
    assert torch.allclose(out[1], reflect_torch(residual, vectors[3]))
    assert not any(layer._forward_hooks for layer in model.model.layers)


def test_poc_worker_layer_range_is_none_without_a_layer_list():
    no_list = nn.Module()
    no_list.model = nn.Module()
    no_list.model.decoder = nn.Module()  # OPT's shape: model.decoder.layers
    no_list.model.decoder.layers = nn.ModuleList([Layer()])
    worker = PocWorkerExtension()
    worker.model_runner = types.SimpleNamespace(get_model=lambda: no_list)
    assert worker.poc_layer_range() is None
    with pytest.raises(PocInputError):
        own_layers(no_list)
    stage = _stage(4, 2, 4)
    worker.model_runner = types.SimpleNamespace(get_model=lambda: stage)
    assert worker.poc_layer_range() == (2, 4)


def _batch(nonces: list[int]) -> ForwardBatch:
    return ForwardBatch(PocSpec("h", "pk", 16, k_dim=4), tuple(nonces), (1,))


class Event:
    """torch.cuda.Event's part poc_poll uses."""

    def __init__(self) -> None:
        self.stream, self.is_done = None, False

    def record(self, stream) -> None:
        self.stream = stream

    def query(self) -> bool:
        return self.is_done


def test_poc_worker_poll_waits_for_a_forward_queued_whole_at_launch(monkeypatch):
    """A graph replay is queued whole by poc_launch; poll must still answer "running" until its event says done,
    not read the artifacts at once (which blocks the engine thread until the forward ends)."""
    monkeypatch.setattr(torch.cuda, "Event", Event)
    worker = PocWorkerExtension()
    stream = object()
    worker._poc_in_flight.append(_InFlight(GraphedForward(torch.zeros(2, HIDDEN)), stream, 0, _batch([1, 2])))
    assert worker.poc_poll(wait=False, budget_s=0.001) == (False, None, True)
    done = worker._poc_in_flight[0].done
    assert done.stream is stream
    assert worker.poc_poll(wait=False, budget_s=0.001) == (False, None, True)
    assert worker._poc_in_flight[0].done is done


class Layerwise:
    """forward.LayerwiseForward's part poc_poll uses (backend/engine/pocworker/): `layers` more advance calls queue
    it wholly."""

    def __init__(self, layers: int, fail: bool = False) -> None:
        self.layers, self.fail = layers, fail
        self.last_hidden = torch.arange(2 * HIDDEN, dtype=torch.float32).reshape(2, HIDDEN) + 1

    @property
    def is_queued(self) -> bool:
        return self.layers == 0

    def advance(self, budget_s: float) -> bool:
        if self.fail:
            raise RuntimeError("kernel failed")
        self.layers = 0 if budget_s == float("inf") else max(0, self.layers - 1)
        return self.is_queued


def _in_flight(forward, nonces):
    return _InFlight(forward, None, 0, _batch(nonces))  # no stream: as off CUDA, done once queued


def test_poc_worker_polls_two_forwards_in_launch_order_queueing_the_newest():
    worker = PocWorkerExtension()
    worker._poc_in_flight.extend([_in_flight(Layerwise(0), [1, 2]), _in_flight(Layerwise(2), [3, 4])])
    finished, artifacts, is_queued = worker.poc_poll(wait=False, budget_s=0.001)
    assert finished and [n for n, _ in artifacts] == [1, 2] and not is_queued  # one of the newest's 2 layers
    finished, artifacts, is_queued = worker.poc_poll(wait=False, budget_s=0.001)
    assert finished and [n for n, _ in artifacts] == [3, 4] and is_queued and not worker._poc_in_flight


def test_poc_worker_poll_answers_running_until_the_forward_is_wholly_queued():
    worker = PocWorkerExtension()
    worker._poc_in_flight.append(_in_flight(Layerwise(3), [1, 2]))
    assert worker.poc_poll(wait=False, budget_s=0.001) == (False, None, False)
    finished, artifacts, is_queued = worker.poc_poll(wait=True, budget_s=0.001)
    assert finished and [n for n, _ in artifacts] == [1, 2] and is_queued


def test_poc_worker_refuses_a_launch_behind_a_forward_not_wholly_queued():
    worker = PocWorkerExtension()
    worker._poc_in_flight.append(_in_flight(Layerwise(3), [1, 2]))
    with pytest.raises(RuntimeError, match="not wholly queued"):
        worker.poc_launch(_batch([3]), True, 0.001)


def test_poc_worker_failed_poll_drops_every_forward_in_flight():
    worker = PocWorkerExtension()
    worker._poc_in_flight.extend([_in_flight(Layerwise(0), [1, 2]), _in_flight(Layerwise(2, fail=True), [3, 4])])
    with pytest.raises(RuntimeError, match="kernel failed"):
        worker.poc_poll(wait=False, budget_s=0.001)
    assert not worker._poc_in_flight
