"""The model's default sampling values, applied where a request leaves a field out, as `vllm serve` applies them.

vLLM's OpenAI layer, not its engine, fills temperature, top_p, top_k, min_p and repetition_penalty from
`ModelConfig.get_diff_sampling_param()`: the model's generation_config.json under `--generation-config auto` (the
default), a given directory's, none under `vllm`, with `--override-generation-config` on top; a value the request
gives wins. Its max_new_tokens becomes the default max_tokens and, from a `--generation-config DIR` or the override,
a cap on every request's (`get_max_tokens`, vllm/entrypoints/serve/utils/api_utils.py). The Responses API takes no
min_p (frontend/responses_convert.py sends the neutral 0).

The network's nodes run `vllm serve`, and the API node forwards a user's body without adding a temperature
(docs/decisions.md, "Sampling defaults from the model's generation_config"): what the model's generation_config says
is what a chat samples with, and what a validator's replay of it computes its logprobs with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# vLLM's values where neither the request nor the model gives one (its `_DEFAULT_SAMPLING_PARAMS`).
NEUTRAL: dict[str, float] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


@dataclass(frozen=True)
class SamplingDefaults:
    # The model's values for NEUTRAL's fields (only those it sets).
    values: dict[str, float] = field(default_factory=dict)
    # max_tokens where the request gives none (the generation_config's max_new_tokens).
    max_tokens: int | None = None
    # A cap on every request's max_tokens (vLLM's override_max_tokens).
    max_tokens_cap: int | None = None

    @classmethod
    def from_model_config(cls, model_config: Any) -> SamplingDefaults:
        """As vLLM's serving classes read them (vllm/entrypoints/openai/chat_completion/serving.py)."""
        diff = model_config.get_diff_sampling_param()
        if model_config.generation_config not in ("auto", "vllm"):
            cap = diff.get("max_tokens")
        else:
            cap = (getattr(model_config, "override_generation_config", None) or {}).get("max_new_tokens")
        return cls(values={k: v for k, v in diff.items() if k in NEUTRAL}, max_tokens=diff.get("max_tokens"),
                   max_tokens_cap=cap)

    @classmethod
    def from_wire(cls, values: dict[str, float], max_tokens_cap: int) -> SamplingDefaults:
        """From the backend's Fingerprint (the frontend echoes effective values in Responses objects)."""
        max_tokens = values.get("max_tokens")
        return cls(values={k: v for k, v in values.items() if k in NEUTRAL},
                   max_tokens=int(max_tokens) if max_tokens is not None else None,
                   max_tokens_cap=max_tokens_cap or None)

    def wire(self) -> tuple[dict[str, float], int]:
        """(Fingerprint.sampling_defaults, Fingerprint.max_tokens_cap)."""
        values = {k: float(v) for k, v in self.values.items()}
        if self.max_tokens is not None:
            values["max_tokens"] = float(self.max_tokens)
        return values, self.max_tokens_cap or 0

    def value(self, name: str, given: float | None) -> float:
        """The request's value, else the model's, else vLLM's neutral one."""
        if given is not None:
            return given
        return self.values.get(name, NEUTRAL[name])

    def max_tokens_for(self, given: int | None, room: int) -> int:
        """The effective max_tokens: the request's (or the model's default), within the context's room and the
        cap."""
        wanted = given if given is not None else self.max_tokens
        return min(v for v in (room, wanted, self.max_tokens_cap) if v is not None)


# A model that sets none (and vLLM's `--generation-config vllm`): vLLM's neutral values, the context's room.
NO_DEFAULTS = SamplingDefaults()
