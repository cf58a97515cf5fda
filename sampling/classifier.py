"""The on-validation logprobs-mode classifier: guesses which mode produced an inference
(docs/architecture.md, "The network's contract").

A validator replaying `enforced_tokens` without `logprobs_mode` must use the mode the inference ran in.
In processed mode, top-k slots past the surviving tokens hold -inf and get filled with the lowest vocab
ids (0-3 for Qwen), so about 75% of top ids are < 4; in raw mode about 0.2% are. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Sequence

RAW_LOGPROBS = "raw_logprobs"
PROCESSED_LOGPROBS = "processed_logprobs"
LOGPROBS_MODES = (RAW_LOGPROBS, PROCESSED_LOGPROBS)

# Below this many top ids in total the evidence is too thin; the deployment default applies.
MIN_TOP_IDS = 10
# Ids below this are the ones processed mode uses as -inf padding.
PADDING_ID_LIMIT = 4
# Strictly above this share of padding ids the inference is taken to be processed.
PROCESSED_RATIO_THRESHOLD = 0.10


def classify_logprobs_mode(top_token_ids_per_position: Sequence[Sequence[int]]) -> str | None:
    """Return "processed_logprobs", "raw_logprobs", or None when fewer than 10 top ids were given."""
    total = 0
    num_padding = 0
    for ids in top_token_ids_per_position:
        total += len(ids)
        num_padding += sum(1 for token_id in ids if token_id < PADDING_ID_LIMIT)
    if total < MIN_TOP_IDS:
        return None
    if num_padding / total > PROCESSED_RATIO_THRESHOLD:
        return PROCESSED_LOGPROBS
    return RAW_LOGPROBS
