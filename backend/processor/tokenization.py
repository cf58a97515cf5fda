"""/tokenize and /detokenize, answered as `vllm serve` answers them (serving_tokenization): a prompt or chat
messages (through the chat template, with tools) → token ids, token ids → text."""

from __future__ import annotations

from backend.errors import RequestError
from backend.processor import chat_template, cost
from backend.processor.params import Vocab
from backend.processor.parsing import check_tool_schemas, tool_dicts
from protocol.tokenize import DetokenizeReply, DetokenizeRequest, TokenizeReply, TokenizeRequest


class Tokenization:
    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab

    def answer(self, req: TokenizeRequest | DetokenizeRequest) -> TokenizeReply | DetokenizeReply:
        """The reply, with `error` set for what the client got wrong. Thread-safe."""
        try:
            # What can never fit is refused before the template or the tokenizer runs (backend/processor/cost.py).
            cost.check(cost.of_tokenize(req), self._vocab.max_model_len, self._vocab.max_text_bytes,
                       detokenize=isinstance(req, DetokenizeRequest))
            if isinstance(req, DetokenizeRequest):
                return self._detokenize(req)
            return self._tokenize(req)
        except RequestError as e:
            if isinstance(req, DetokenizeRequest):
                return DetokenizeReply(rid=req.rid, error=e.info())
            return TokenizeReply(rid=req.rid, error=e.info())

    def _tokenize(self, req: TokenizeRequest) -> TokenizeReply:
        vocab, tokenizer = self._vocab, self._vocab.tokenizer
        if req.messages is not None:
            if req.add_generation_prompt and req.continue_final_message:
                raise RequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                                   param="continue_final_message")
            vocab.check_fits("".join(m.content for m in req.messages), "messages")
            if req.tools:
                check_tool_schemas(req.tools)
            text = chat_template.render(tokenizer, req.messages, tool_dicts(req.tools) if req.tools else None,
                                        add_generation_prompt=req.add_generation_prompt,
                                        continue_final_message=req.continue_final_message,
                                        template=vocab.chat_template, template_kwargs=vocab.chat_template_kwargs)
        elif req.prompt is not None:
            vocab.check_fits(req.prompt, "prompt")
            text = req.prompt
        else:
            raise RequestError("either prompt or messages is required", param="prompt")
        ids = list(tokenizer.encode(text, add_special_tokens=req.add_special_tokens))
        token_strs = list(tokenizer.convert_ids_to_tokens(ids)) if req.return_token_strs else None
        return TokenizeReply(rid=req.rid, tokens=ids, token_strs=token_strs, max_model_len=vocab.max_model_len)

    def _detokenize(self, req: DetokenizeRequest) -> DetokenizeReply:
        for i, token_id in enumerate(req.tokens):
            if not 0 <= token_id < self._vocab.size:
                raise RequestError(f"token id {token_id} is out of vocabulary (size {self._vocab.size})",
                                   param=f"tokens.{i}")
        return DetokenizeReply(rid=req.rid, prompt=self._vocab.tokenizer.decode(req.tokens))
