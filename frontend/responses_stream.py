"""The server-sent events of a streamed /v1/responses answer, pure: vLLM's SimpleStreamingEventProcessor
(vllm/entrypoints/openai/responses/streaming_events.py) over wire Deltas, framed as its router
(vllm/entrypoints/openai/responses/api_router.py) frames them (`event: <type>` then `data: <json>`, no [DONE]).

response.created and response.in_progress (the response, in progress, no output), then per output item:
output_item.added, its part added, text deltas, text done, part done, output_item.done; response.completed (the
whole response, status completed or incomplete) last. Each event has the next sequence_number, from 0. A delta
is split as vLLM splits it: reasoning, then content, then tool calls; a change of kind (or of tool call) closes the
open item and opens the next. A failure after the stream began ends it with an `error` event (OpenAI's
ResponseErrorEvent), since the HTTP status is already sent.

Differences from vLLM: response.completed's items keep the ids the stream gave them (vLLM builds the output
again with new ids), and message ids carry the "msg_" prefix in the stream too; the logprobs of a step that added
no text go with the next text delta (vLLM's are lost with the step's empty delta).
"""

from __future__ import annotations

from frontend import sse
from frontend.convert import TokenFormat
from frontend.responses_shape import (
    call_id,
    function_call_item,
    logprobs,
    message_item,
    new_id,
    reasoning_item,
    reasoning_part,
    stream_logprobs,
    text_part,
)
from protocol.generate import Delta, TokenLogprob, ToolCallDelta


def frame(payload: dict) -> bytes:
    return b"event: " + payload["type"].encode() + b"\n" + sse.event(payload)


class ResponseEvents:
    def __init__(self, fmt: TokenFormat, *, with_logprobs: bool, include_reasoning: bool) -> None:
        self.fmt = fmt
        self.with_logprobs = with_logprobs
        self.include_reasoning = include_reasoning
        self.sequence_number = 0
        # The open item: None, "content", "reasoning" or "tool"; its id, index, text so far.
        self.kind: str | None = None
        self.item_id = ""
        self.output_index = 0
        self.text = ""
        self.logprobs: list[TokenLogprob] = []
        # Logprobs of tokens that added no text yet (a character cut between tokens, a skipped special token):
        # they go with the next text delta, and into the message at its end, so that none is lost.
        self.pending: list[TokenLogprob] = []
        self.call: ToolCallDelta | None = None
        self.call_id = ""
        self.is_call_args = False
        # Items closed so far, in order: response.completed's output.
        self.items: list[dict] = []

    def event(self, type: str, **fields) -> dict:
        payload = {**fields, "sequence_number": self.sequence_number, "type": type}
        self.sequence_number += 1
        return payload

    def feed(self, d: Delta) -> list[dict]:
        events: list[dict] = []
        if self.with_logprobs and d.logprobs:
            self.pending += d.logprobs
        if d.reasoning and self.include_reasoning:
            events += self._switch("reasoning")
            self.text += d.reasoning
            events.append(self.event("response.reasoning_text.delta", content_index=0, delta=d.reasoning,
                                     item_id=self.item_id, output_index=self.output_index))
        if d.text:
            events += self._switch("content")
            self.text += d.text
            lps, self.pending = self.pending, []
            self.logprobs += lps
            events.append(self.event("response.output_text.delta", content_index=0, delta=d.text,
                                     item_id=self.item_id, logprobs=stream_logprobs(self.fmt, lps),
                                     output_index=self.output_index))
        for c in d.tool_calls or ():
            if self.kind != "tool" or self.call is None or self.call.index != c.index:
                events += self._switch("tool", c)
            if c.arguments:
                self.text += c.arguments
                self.is_call_args = True
                events.append(self.event("response.function_call_arguments.delta", delta=c.arguments,
                                         item_id=self.item_id, output_index=self.output_index))
        return events

    def close(self) -> list[dict]:
        """The done events of the open item, if any."""
        if self.kind is None:
            return []
        if self.kind == "content":
            events, item = self._close_content()
        elif self.kind == "reasoning":
            events, item = self._close_reasoning()
        else:
            events, item = self._close_call()
        self.items.append(item)
        self.kind = None
        self.output_index += 1
        return events

    def _switch(self, kind: str, call: ToolCallDelta | None = None) -> list[dict]:
        if self.kind == kind and kind != "tool":
            return []
        events = self.close()
        self.kind, self.text, self.logprobs = kind, "", []
        at = {"output_index": self.output_index}
        if kind == "content":
            self.item_id = new_id("msg")
            return [*events,
                    self.event("response.output_item.added", item=message_item(self.item_id, [], "in_progress"), **at),
                    self.event("response.content_part.added", content_index=0, item_id=self.item_id, **at,
                               part=text_part("", []))]
        if kind == "reasoning":
            self.item_id = new_id("rs")
            return [*events,
                    self.event("response.output_item.added", item=reasoning_item(self.item_id, None, "in_progress"),
                               **at),
                    self.event("response.reasoning_part.added", content_index=0, item_id=self.item_id, **at,
                               part=reasoning_part(""))]
        assert call is not None
        self.item_id, self.call, self.call_id, self.is_call_args = new_id("fc"), call, call_id(call), False
        item = function_call_item(self.item_id, self.call_id, call.name or "", "", "in_progress")
        return [*events, self.event("response.output_item.added", item=item, **at)]

    # Each returns its done events and the item as response.completed shows it.

    def _close_content(self) -> tuple[list[dict], dict]:
        at = {"item_id": self.item_id, "output_index": self.output_index}
        part = text_part(self.text, None)
        done = message_item(self.item_id, [part], "completed")
        # vLLM's done events carry no logprobs; the whole response has them, as in a response not streamed.
        self.logprobs += self.pending
        self.pending = []
        final = text_part(self.text, logprobs(self.fmt, self.logprobs) if self.with_logprobs else None)
        return [self.event("response.output_text.done", content_index=0, logprobs=[], text=self.text, **at),
                self.event("response.content_part.done", content_index=0, part=part, **at),
                self.event("response.output_item.done", item=done, output_index=self.output_index)], \
            message_item(self.item_id, [final], "completed")

    def _close_reasoning(self) -> tuple[list[dict], dict]:
        at = {"item_id": self.item_id, "output_index": self.output_index}
        part = reasoning_part(self.text)
        item = reasoning_item(self.item_id, [part], "completed")
        return [self.event("response.reasoning_text.done", content_index=0, text=self.text, **at),
                self.event("response.reasoning_part.done", content_index=0, part=part, **at),
                self.event("response.output_item.done", item=item, output_index=self.output_index)], item

    def _close_call(self) -> tuple[list[dict], dict]:
        assert self.call is not None
        name = self.call.name or ""
        events = []
        if self.is_call_args:
            events.append(self.event("response.function_call_arguments.done", arguments=self.text,
                                     item_id=self.item_id, output_index=self.output_index, name=name))
        item = function_call_item(self.item_id, self.call_id, name, self.text, "completed")
        return [*events, self.event("response.output_item.done", item=item, output_index=self.output_index)], item
