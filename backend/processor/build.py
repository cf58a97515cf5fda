"""Builds the processor's vLLM pieces from the backend settings: the same config the engine builds, then the
renderer (tokenizer and chat template), InputProcessor and OutputProcessor, as vLLM's own LLMEngine does."""

from __future__ import annotations

import os
import time

import vllm
from vllm.renderers import renderer_from_config
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.engine.output_processor import OutputProcessor

from backend.engine import compat
from backend.engine.args import USAGE_CONTEXT, engine_args
from backend.processor.metrics import VllmMetrics
from backend.processor.params import Vocab
from backend.processor.parsing import ChatParsers
from backend.processor.prepare import Preparer
from backend.processor.present import Presenter
from backend.processor.tokenization import Tokenization
from backend.startup.settings import BackendSettings
from common.sampling_defaults import SamplingDefaults
from protocol.processor import ProcessorReady


def build(settings: BackendSettings, phases_s: dict[str, float | None] | None = None,
          ) -> tuple[Preparer, Presenter, Tokenization, ProcessorReady]:
    """phases_s, if given, gets each phase's seconds (the processor logs them when ready)."""
    started = time.monotonic()
    compat.check_version(vllm.__version__)
    config = engine_args(settings).create_engine_config(USAGE_CONTEXT)
    configured = time.monotonic()
    renderer = renderer_from_config(config)
    tokenizer = renderer.get_tokenizer()
    tokenized = time.monotonic()
    max_model_len = int(config.model_config.max_model_len)
    vocab_size = int(config.model_config.get_vocab_size())
    vocab = Vocab(tokenizer, vocab_size, max_model_len, settings.vllm.chat_template,
                  settings.vllm.chat_template_kwargs)
    parsers = ChatParsers(settings.vllm.tool_call_parser, settings.engine.reasoning_parser or "",
                          settings.vllm.enable_auto_tool_choice,
                          tokenizer, config.model_config)
    defaults = SamplingDefaults.from_model_config(config.model_config)
    preparer = Preparer(settings, InputProcessor(config, renderer), vocab, max_model_len, parsers,
                        int(config.scheduler_config.max_num_seqs), defaults)
    outputs = OutputProcessor(tokenizer, log_stats=True, stream_interval=config.scheduler_config.stream_interval)
    if phases_s is not None:
        phases_s.update(config=round(configured - started, 2), tokenizer=round(tokenized - configured, 2),
                        build=round(time.monotonic() - started, 2))
    return (preparer, Presenter(outputs, tokenizer, VllmMetrics(config)), Tokenization(vocab),
            ProcessorReady(pid=os.getpid(), vocab_size=vocab_size))
