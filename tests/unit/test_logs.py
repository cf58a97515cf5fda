"""common/logs.py: a tool parser's failure on the model's output is one warning line, not a traceback."""

import json
import logging
import sys

from common.logs import model_output_errors_in_one_line


def _record(name: str) -> logging.LogRecord:
    try:
        json.loads('{"name": "f')
    except json.JSONDecodeError:
        exc_info = sys.exc_info()
    return logging.LogRecord(name, logging.ERROR, __file__, 1, "Error in extracting tool call from %s.", ("response",),
                             exc_info)


def test_a_tool_parsers_traceback_becomes_one_warning_line():
    record = _record("vllm.tool_parsers.hermes_tool_parser")
    assert model_output_errors_in_one_line(record)
    assert (record.levelno, record.levelname, record.exc_info) == (logging.WARNING, "WARNING", None)
    assert record.getMessage() == ("Error in extracting tool call from response. (JSONDecodeError: Unterminated "
                                   "string starting at: line 1 column 10 (char 9))")
    assert "Traceback" not in logging.Formatter().format(record)


def test_other_loggers_keep_their_traceback():
    for name in ("vllm.v1.engine.core", "backend.core.loop", "vllm.tool_parsers_extra"):
        record = _record(name)
        assert model_output_errors_in_one_line(record)
        assert record.levelno == logging.ERROR and record.exc_info is not None
        assert "Traceback" in logging.Formatter().format(record)
