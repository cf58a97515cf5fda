"""Pydantic models of the Gonka PoC request bodies (/api/v1/pow/*) and their pure conversion to wire structs.

Validation at the HTTP edge only: the backend decides everything else (params check, gating, queue cap,
whether the validation nonces match). Shapes and defaults are the fork's (tests/unit/test_frontend_pow_models.py):
`params` forbids extra keys, the top-level bodies ignore them.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from frontend.fields import Count, Index, Int64, Text
from protocol.poc import DEFAULT_K_DIM, Artifact
from protocol.pow import (
    NodeIdentity,
    PowGenerateRequest,
    PowInitRequest,
    PowParams,
    StatTestSpec,
)

# Thresholds: finite, never negative (NaN would make every comparison false and pass everything).
Threshold = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]

# A callback base URL, as the schema states it and the validator applies it (the same pattern, so that what the
# schema calls valid is accepted): http or https (any case), optional userinfo, a host name (RFC 3986 reg-name
# characters) or a bracketed IPv6 address, an optional port up to 65535, then printable ASCII (no spaces or
# control characters). Every URL it matches also passes urlsplit's parsing, hostname and port checks
# (tests/unit/test_frontend_stated_rules.py draws them with hypothesis). Read with Python's re, as schemathesis
# reads it: there `$` also matches before one trailing newline, which urlsplit drops, so "http://h\n" passes (as
# it did before); an ECMA engine refuses it.
_H16 = "[0-9A-Fa-f]{1,4}"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LS32 = rf"({_H16}:{_H16}|{_OCTET}(\.{_OCTET}){{3}})"
_IPV6 = "|".join([  # RFC 3986's IPv6address, no zone id
    f"({_H16}:){{6}}{_LS32}",
    f"::({_H16}:){{5}}{_LS32}",
    f"({_H16})?::({_H16}:){{4}}{_LS32}",
    f"(({_H16}:)?{_H16})?::({_H16}:){{3}}{_LS32}",
    f"(({_H16}:){{0,2}}{_H16})?::({_H16}:){{2}}{_LS32}",
    f"(({_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    f"(({_H16}:){{0,4}}{_H16})?::{_LS32}",
    f"(({_H16}:){{0,5}}{_H16})?::{_H16}",
    f"(({_H16}:){{0,6}}{_H16})?::",
])
_PORT = "0*([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
CALLBACK_URL_PATTERN = (r"^[Hh][Tt][Tt][Pp][Ss]?://([-A-Za-z0-9._~!$&'()*+,;=%:]*@)?"
                        rf"([-A-Za-z0-9._~!$&'()*+,;=%]+|\[({_IPV6})\])(:({_PORT})?)?([/?#][!-~]*)?$")
_CALLBACK_URL = re.compile(CALLBACK_URL_PATTERN)
CallbackUrl = Annotated[Text, Field(
    description="Callback base URL: http:// or https://, a host name or bracketed IPv6 address, an optional port "
                "(0-65535), then printable ASCII without spaces. Left out or null: no callbacks.",
    json_schema_extra={"pattern": CALLBACK_URL_PATTERN})]


class PoCParamsModel(BaseModel):
    # Extra keys are forbidden (the fork's behaviour): 400 naming the key, e.g. `params.poc_stronger_rng`.
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: "1" is not an integer, 0 not a boolean

    model: Text
    seq_len: Count
    k_dim: Count = DEFAULT_K_DIM

    def to_wire(self) -> PowParams:
        return PowParams(model=self.model, seq_len=self.seq_len, k_dim=self.k_dim)


class _NodeBody(BaseModel):
    """Fields shared by /init/generate and /generate; unknown top-level keys are ignored, as in the fork."""

    model_config = ConfigDict(extra="ignore", strict=True)

    block_hash: Text
    # Only echoed (in /status and callbacks).
    block_height: Int64
    public_key: Text
    node_id: Index
    node_count: Count
    params: PoCParamsModel
    # None: the backend's batch_size_default setting (POC_BATCH_SIZE_DEFAULT) applies.
    batch_size: Count | None = None
    # Callback base URL; None: nothing is delivered.
    url: CallbackUrl | None = None
    # Top level, not inside params (params forbids extra keys).
    poc_stronger_rng: bool = False

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not _CALLBACK_URL.search(url):
            raise ValueError("must be an http:// or https:// URL: a host name or [IPv6] address, an optional port "
                             "up to 65535, then printable ASCII without spaces")
        return url

    def node(self) -> NodeIdentity:
        return NodeIdentity(block_hash=self.block_hash, block_height=self.block_height,
                            public_key=self.public_key, node_id=self.node_id, node_count=self.node_count)


class InitGenerateRequest(_NodeBody):
    group_id: Index = 0
    n_groups: Count = 1
    # Any node_id and group_id >= 0 are accepted, as in the fork: dapi sends node_id = its NodeNum, a 1-based
    # counter that only grows, with node_count = its current number of nodes, so node_id may exceed node_count.
    # The nonces are the fork's for the same numbers (poc/nonces.py); whether ranges overlap is the network's
    # business, and refusing would stop that host from mining.

    def to_wire(self, rid: str) -> PowInitRequest:
        return PowInitRequest(rid=rid, node=self.node(), params=self.params.to_wire(), group_id=self.group_id,
                              n_groups=self.n_groups, batch_size=self.batch_size,
                              url=self.url, stronger_rng=self.poc_stronger_rng)


class ArtifactModel(BaseModel):
    model_config = ConfigDict(strict=True)  # types as the schema says: "1" is not a nonce (docs/decisions.md)

    nonce: Int64
    vector_b64: Text


class ValidationModel(BaseModel):
    model_config = ConfigDict(strict=True)

    artifacts: list[ArtifactModel]


class StatTestModel(BaseModel):
    """Every field optional; unset ones take the fork's code defaults (poc/validation.py `StatTest`).

    The network client sends `p_value_threshold` where the fork read `fraud_threshold` (and silently ignored
    the other name): either is accepted here and means the same threshold, but not both in one body. "Both, if
    equal" cannot be stated in JSON Schema (it compares two values), so a checker generating from the schema sent
    two different ones as valid; "one of them" can (`not` both), and the network client sends one.
    """

    model_config = ConfigDict(strict=True, json_schema_extra={"not": {
        "required": ["fraud_threshold", "p_value_threshold"],
        "properties": {"fraud_threshold": {"type": "number"}, "p_value_threshold": {"type": "number"}}}})

    dist_threshold: Threshold | None = None
    p_mismatch: Probability | None = None
    fraud_threshold: Probability | None = Field(None, description=(
        "The same setting as `p_value_threshold` under the fork's name: send one of them (a 400 naming "
        "`stat_test` if both are sent)."))
    p_value_threshold: Probability | None = Field(None, description=(
        "The same setting as `fraud_threshold` under the network client's name: send one of them (a 400 naming "
        "`stat_test` if both are sent)."))

    @model_validator(mode="after")
    def _one_threshold(self) -> StatTestModel:
        a, b = self.fraud_threshold, self.p_value_threshold
        if a is not None and b is not None:
            raise ValueError(f"fraud_threshold ({a}) and p_value_threshold ({b}) are the same setting under two "
                             f"names; send one of them")
        return self

    def to_wire(self) -> StatTestSpec:
        spec = StatTestSpec()
        if self.dist_threshold is not None:
            spec.dist_threshold = self.dist_threshold
        if self.p_mismatch is not None:
            spec.p_mismatch = self.p_mismatch
        threshold = self.fraud_threshold if self.fraud_threshold is not None else self.p_value_threshold
        if threshold is not None:
            spec.fraud_threshold = threshold
        return spec


class GenerateRequest(_NodeBody):
    # node_id/node_count do not affect the computation here (only echoed in callbacks): a validator sends its own
    # NodeNum with the count of its nodes serving the model, so node_id may exceed node_count (as in the fork).
    nonces: Annotated[list[Int64], Field(min_length=1)]
    # False: queue the job and answer with its id (what the network client does).
    wait: bool = False
    # Received artifacts to compare with; None: compute only. The backend checks that the nonces match.
    validation: ValidationModel | None = None
    # None: all defaults.
    stat_test: StatTestModel | None = None

    def to_wire(self, rid: str) -> PowGenerateRequest:
        validation = None
        if self.validation is not None:
            validation = [Artifact(nonce=a.nonce, vector_b64=a.vector_b64) for a in self.validation.artifacts]
        return PowGenerateRequest(
            rid=rid, node=self.node(), params=self.params.to_wire(), nonces=list(self.nonces),
            batch_size=self.batch_size, wait=self.wait, url=self.url, validation=validation,
            stat_test=self.stat_test.to_wire() if self.stat_test is not None else None,
            stronger_rng=self.poc_stronger_rng)
