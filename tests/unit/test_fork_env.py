"""The fork's environment variables (issue 28, item 7): each one either a backend setting under the fork's name or
listed in backend/startup/fork_env.py with its reason; a listed one set in the environment is warned about at start."""

from __future__ import annotations

from structlog.testing import capture_logs

from backend.startup import fork_env
from backend.startup.settings import OPTIONS


def test_fork_env_warns_once_for_each_not_applicable_variable_set():
    with capture_logs() as logs:
        names = fork_env.warn_if_set({"POC_RPC_TIMEOUT_MS": "60000", "GONKA_POC_FUSED": "0",
                                      "POC_CALLBACK_MAX_ARTIFACTS": "5", "PATH": "/bin"})
    assert names == ["POC_RPC_TIMEOUT_MS", "GONKA_POC_FUSED"]
    assert [(e["event"], e["log_level"], e["variable"]) for e in logs] == [
        ("fork_variable_not_applicable", "warning", "POC_RPC_TIMEOUT_MS"),
        ("fork_variable_not_applicable", "warning", "GONKA_POC_FUSED")]
    assert "no such call to time out" in logs[0]["reason"]


def test_fork_env_silent_when_none_is_set():
    with capture_logs() as logs:
        assert fork_env.warn_if_set({"POC_GENERATE_CHUNK_TIMEOUT_SEC": "30"}) == []
    assert logs == []


def test_fork_env_every_fork_variable_is_honoured_or_listed_never_both():
    honoured = {o.env for o in OPTIONS if o.env.startswith("POC_")}
    listed = [name for name, _ in fork_env.NOT_APPLICABLE]
    assert len(listed) == len(set(listed)) and not honoured & set(listed)
    # The fork's POC_* variables (its routes, generate queue and callbacks modules) that carry a meaning here.
    assert {"POC_GENERATE_CHUNK_TIMEOUT_SEC", "POC_CALLBACK_MAX_ARTIFACTS", "POC_CALLBACK_QUEUE_SIZE",
            "POC_CALLBACK_MAX_RETRIES", "POC_CALLBACK_MAX_CONCURRENT", "POC_CALLBACK_INTERVAL_SEC",
            "POC_GENERATE_RESULT_TTL_SEC", "POC_MAX_QUEUED_NONCES", "POC_BATCH_SIZE_DEFAULT"} == honoured
    assert {"POC_RPC_TIMEOUT_MS", "POC_BORROW_TIMEOUT_MS"} <= set(listed)
    assert all(reason.strip() for _, reason in fork_env.NOT_APPLICABLE)
