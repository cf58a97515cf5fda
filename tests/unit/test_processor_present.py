"""Unit tests for backend/processor/present.py: engine outputs → each frontend's deltas through vLLM's own
OutputProcessor (detokenizer, stop strings, n choices), with the tiny model's tokenizer (no engine)."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.metrics.stats import PrefillStats
from vllm.v1.outputs import LogprobsLists

from backend.processor.parsing import ChoiceOutput
from backend.processor.prepare import EngineRequests, fan_out
from backend.processor.present import Presenter

PROMPT = [1, 2, 3]


class FakeMetrics:
    """VllmMetrics as the Presenter feeds it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def record(self, scheduler_stats, iteration_stats) -> None:
        self.calls.append((scheduler_stats, iteration_stats))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def presenter(tokenizer) -> Presenter:
    return Presenter(OutputProcessor(tokenizer, log_stats=True), tokenizer, FakeMetrics())


def _engine(engine_rid: str, n: int = 1, stream: bool = True, **params) -> EngineRequests:
    """What Preparer.to_engine hands over: vLLM's internal ids assigned, n > 1 fanned out under a ParentRequest."""
    kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    request = EngineCoreRequest(request_id=engine_rid, prompt_token_ids=list(PROMPT), mm_features=None,
                                sampling_params=SamplingParams(n=n, max_tokens=16, output_kind=kind, **params),
                                pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                                data_parallel_rank=None)
    InputProcessor.assign_request_id(request)
    return fan_out(request)


def _step(*outputs: tuple[EngineRequests | str, list[int]], finished: bool = False, **kw) -> EngineCoreOutputs:
    """One engine step: new tokens of each request (its first choice, or the internal id given)."""
    return EngineCoreOutputs(outputs=[
        EngineCoreOutput(request_id=r if isinstance(r, str) else r.requests[0].request_id, new_token_ids=ids,
                         finish_reason=FinishReason.LENGTH if finished else None, **kw)
        for r, ids in outputs])


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_present_streams_each_frontends_deltas(tokenizer, presenter):
    a, b = _engine("ea"), _engine("eb")
    presenter.add(a, b"fe-1", "ra", 0, is_stream=True)
    presenter.add(b, b"fe-2", "rb", 0, is_stream=True)
    assert len(presenter) == 2
    hello, world = _ids(tokenizer, "Hello"), _ids(tokenizer, " world")
    by_frontend, stopped = presenter.present(_step((a, hello), (b, world)))
    assert stopped == [] and set(by_frontend) == {(b"fe-1", False), (b"fe-2", False)}
    [da], [db] = by_frontend[b"fe-1", False], by_frontend[b"fe-2", False]
    assert (da.rid, da.text, da.token_ids, da.num_prompt_tokens, da.num_generated_tokens, da.finish_reason) == (
        "ra", "Hello", hello, len(PROMPT), len(hello), None)
    assert (db.rid, db.text) == ("rb", " world")
    by_frontend, _ = presenter.present(_step((a, world), finished=True))
    [da] = by_frontend[b"fe-1", False]
    assert (da.text, da.num_generated_tokens, da.finish_reason) == (" world", len(hello) + len(world), "length")
    assert len(presenter) == 1  # the finished request's route is gone


def test_present_keeps_a_frontends_direct_and_forwarded_requests_apart(tokenizer, presenter):
    """The path is the request's, decided when it was prepared (backend/processor/direct.py): one frontend's
    requests of either path come as two groups, so none of them switches path mid-stream."""
    a, b = _engine("ea"), _engine("eb")
    presenter.add(a, b"fe", "ra", 0, is_stream=True, is_direct=True)
    presenter.add(b, b"fe", "rb", 0, is_stream=True)
    hello = _ids(tokenizer, "Hello")
    by_frontend, _ = presenter.present(_step((a, hello), (b, hello)))
    assert {key: [d.rid for d in deltas] for key, deltas in by_frontend.items()} == {
        (b"fe", True): ["ra"], (b"fe", False): ["rb"]}


def test_present_non_stream_sends_one_final_delta(tokenizer, presenter):
    engine = _engine("e1", stream=False)
    presenter.add(engine, b"fe", "r1", 0, is_stream=False)
    hello, world = _ids(tokenizer, "Hello"), _ids(tokenizer, " world")
    assert presenter.present(_step((engine, hello)))[0] == {}
    [delta] = presenter.present(_step((engine, world), finished=True))[0][b"fe", False]
    assert (delta.text, delta.token_ids, delta.finish_reason) == ("Hello world", hello + world, "length")


def test_present_a_stop_string_finishes_the_choice_and_asks_the_engine_to_abort_it(tokenizer, presenter):
    engine = _engine("e1", stop=["lo"])
    presenter.add(engine, b"fe", "r1", 0, is_stream=True)
    by_frontend, stopped = presenter.present(_step((engine, _ids(tokenizer, "Hello"))))
    [delta] = by_frontend[b"fe", False]
    assert (delta.text, delta.finish_reason, delta.stop_reason) == ("Hel", "stop", "lo")
    assert stopped == [engine.requests[0].request_id] and len(presenter) == 0


def test_present_n_choices_share_the_route_and_count_tokens_each(tokenizer, presenter):
    engine = _engine("e1", n=2, seed=1)
    presenter.add(engine, b"fe", "r1", 0, is_stream=True)
    first, second = (r.request_id for r in engine.requests)
    hello = _ids(tokenizer, "Hello")
    deltas = presenter.present(_step((first, hello), (second, hello + hello)))[0][b"fe", False]
    assert sorted((d.index, d.num_generated_tokens) for d in deltas) == [(0, len(hello)), (1, 2 * len(hello))]
    assert all(d.rid == "r1" for d in deltas)
    presenter.present(_step((first, hello), (second, hello), finished=True))
    assert len(presenter) == 0


def _prefilled(num_cached: int) -> PrefillStats:
    """The engine's report of the prompt's prefill: `num_cached` of its tokens from the prefix cache."""
    stats = PrefillStats()
    stats.set(len(PROMPT), num_cached, 0)
    stats.num_cache_creation_tokens = len(PROMPT) - num_cached
    return stats


def test_present_passes_the_cached_token_counts(tokenizer, presenter):
    engine = _engine("e1")
    presenter.add(engine, b"fe", "r1", 0, is_stream=True)
    [delta] = presenter.present(_step((engine, _ids(tokenizer, "Hello")), prefill_stats=_prefilled(2)))[0][b"fe", False]
    assert (delta.num_cached_tokens, delta.num_cache_creation_tokens) == (2, 1)


def test_present_top_logprobs_are_cut_to_what_the_request_asked(tokenizer, presenter):
    engine = _engine("e1", logprobs=2)
    presenter.add(engine, b"fe", "r1", 1, is_stream=True)
    [token] = _ids(tokenizer, "Hello")
    # vLLM's lists: the sampled token first, then its top-2.
    logprobs = LogprobsLists(np.array([[token, 5, token]]), np.array([[-0.5, -0.1, -0.5]], dtype=np.float32),
                             np.array([2]))
    [delta] = presenter.present(_step((engine, [token]), new_logprobs=logprobs))[0][b"fe", False]
    [position] = delta.logprobs or []
    assert (position.token_id, position.logprob, position.rank) == (token, -0.5, 2)
    assert [t.token_id for t in position.top] == [token]


def test_forget_drops_the_route_and_later_outputs(tokenizer, presenter):
    engine = _engine("e1")
    presenter.add(engine, b"fe", "r1", 0, is_stream=True)
    presenter.forget(["e1"])
    assert len(presenter) == 0
    assert presenter.present(_step((engine, _ids(tokenizer, "Hello")))) == ({}, [])


def test_present_records_stats_and_metrics(tokenizer, presenter):
    engine = _engine("e1")
    presenter.add(engine, b"fe", "r1", 0, is_stream=True)
    presenter.present(_step((engine, _ids(tokenizer, "Hello world")), finished=True, prefill_stats=_prefilled(1)))
    presenter.present(EngineCoreOutputs(outputs=[]))  # a step without chat outputs: no iteration
    stats = presenter.stats
    assert (stats.num_prompt_tokens, stats.num_generation_tokens, stats.num_finished) == (
        len(PROMPT) - 1, len(_ids(tokenizer, "Hello world")), 1)  # prompt tokens computed, not cached
    assert stats.iterations.count == 1
    assert [iteration is None for _, iteration in presenter.metrics.calls] == [False, True]


# --- the tool and reasoning parsers' part ---

class FakeParsing:
    """A RequestParsing that upper-cases text, holds back "<" and fails on "!"."""

    def __init__(self) -> None:
        self.calls = 0

    def _parse(self, text: str, finish_reason: str | None) -> ChoiceOutput:
        self.calls += 1
        if "!" in text:
            raise RuntimeError("parser bug")
        return ChoiceOutput(text.upper(), "thought", None, finish_reason and "tool_calls")

    def delta(self, index, text, token_ids, finish_reason) -> ChoiceOutput | None:
        return None if text == "<" else self._parse(text, finish_reason)

    def whole(self, text, token_ids, finish_reason) -> ChoiceOutput:
        return self._parse(text, finish_reason)


def test_present_streamed_deltas_go_through_the_parsing(tokenizer, presenter):
    engine, parsing = _engine("e1"), FakeParsing()
    presenter.add(engine, b"fe", "r1", 0, is_stream=True, parsing=parsing)
    [delta] = presenter.present(_step((engine, _ids(tokenizer, "hi"))))[0][b"fe", False]
    assert (delta.text, delta.reasoning, delta.finish_reason) == ("HI", "thought", None)
    assert presenter.present(_step((engine, _ids(tokenizer, "<")))) == ({}, [])  # held back: nothing to send
    [delta] = presenter.present(_step((engine, _ids(tokenizer, "ok")), finished=True))[0][b"fe", False]
    assert (delta.text, delta.finish_reason) == ("OK", "tool_calls")


def test_present_whole_output_goes_through_the_parsing(tokenizer, presenter):
    engine = _engine("e1", stream=False)
    presenter.add(engine, b"fe", "r1", 0, is_stream=False, parsing=FakeParsing())
    [delta] = presenter.present(_step((engine, _ids(tokenizer, "hi there")), finished=True))[0][b"fe", False]
    assert (delta.text, delta.finish_reason) == ("HI THERE", "tool_calls")


def test_a_parser_failure_leaves_that_request_unparsed(tokenizer, presenter):
    engine, parsing = _engine("e1"), FakeParsing()
    presenter.add(engine, b"fe", "r1", 0, is_stream=True, parsing=parsing)
    [delta] = presenter.present(_step((engine, _ids(tokenizer, "hi!"))))[0][b"fe", False]
    assert (delta.text, delta.reasoning) == ("hi!", None) and presenter.num_parse_failures == 1
    [delta] = presenter.present(_step((engine, _ids(tokenizer, "hi"))))[0][b"fe", False]
    assert delta.text == "hi" and parsing.calls == 1  # not parsed any more
