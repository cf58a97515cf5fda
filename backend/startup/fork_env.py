"""The fork's environment variables that pocserve does not read, each with the reason (issue 28, item 7).

The fork's variables pocserve honours are backend settings under the fork's names (`POC_*` in
backend/startup/settings.py). The rest are listed here once: the backend warns at start for each one set (an
operator moving from the fork should learn that it does nothing here), and scripts/settings_table.py prints the
README's section from this list.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

log = structlog.get_logger(__name__)

NOT_APPLICABLE: tuple[tuple[str, str], ...] = (
    ("POC_RPC_TIMEOUT_MS",
     "the fork's limit on one PoC call from its API server to its engine process; pocserve runs PoC forwards in "
     "the engine loop's own process, so there is no such call to time out. A stuck forward stops the /metrics "
     "iteration counter, and the ML node's heartbeat check restarts the instance"),
    ("POC_BORROW_TIMEOUT_MS",
     "how long the fork polls to lease KV blocks for a validation before it aborts every chat request in flight; "
     "pocserve takes free KV blocks for each forward and otherwise waits for engine steps to free some, and never "
     "aborts chat for it (POC_GENERATE_CHUNK_TIMEOUT_SEC bounds the wait)"),
    ("GONKA_POC_FUSED",
     "switches the fork's fused Triton PoC kernels; pocserve has its own: POCSERVE_POC_TRITON=0 turns them off, "
     "POCSERVE_POC_FUSED_NORM=0 reflects each layer apart from the next norm, POCSERVE_POC_GRAPHS=0 the CUDA graphs"),
    ("GONKA_POC_VLLM_KERNELS",
     "switches the fork's patches of vLLM's kernels; pocserve does not patch vLLM's kernels"),
    ("GONKA_POC_SPHERE_CODEBOOK",
     "a frozen sphere codebook for the fork's decode PoC, not the PoC v2 (prefill artifacts) the network "
     "validates and pocserve computes"),
    ("GONKA_POC_SEEDED_ROUTING",
     "seeded MoE expert routing for the fork's decode PoC rows, not the PoC v2 the network validates"),
    ("POC_CALLBACK_RETRY_BACKOFF_SEC",
     "a constant in the shipped fork (1 s), not read from the environment; pocserve's callback retries wait "
     "1, 2, 4 ... s as the fork's do"),
    ("POC_CALLBACK_RETRY_MAX_BACKOFF_SEC",
     "a constant in the shipped fork (30 s), not read from the environment; pocserve caps its callback backoff at "
     "30 s as the fork does"),
)


def warn_if_set(environ: Mapping[str, str]) -> list[str]:
    """Logs one warning for each not-applicable variable set in `environ`; returns their names."""
    names = []
    for name, reason in NOT_APPLICABLE:
        if name in environ:
            log.warning("fork_variable_not_applicable", variable=name, value=environ[name], reason=reason)
            names.append(name)
    return names


def readme_section(honoured: list[tuple[str, str]]) -> str:
    """The README's "The fork's variables" section: the honoured ones as (variable, flag), then this list."""
    rows = ["### The fork's variables", "",
            "The fork's `POC_*` variables pocserve honours, with the fork's meaning and default (the table above "
            "says each):",
            ", ".join(f"`{env}` (`{flag}`)" for env, flag in honoured) + ".", "",
            "The fork's variables pocserve does not read (the backend logs `fork_variable_not_applicable` at start "
            "for each one set):", "",
            "| variable | why not |", "|---|---|"]
    rows += [f"| `{name}` | {reason} |" for name, reason in NOT_APPLICABLE]
    return "\n".join(rows)
