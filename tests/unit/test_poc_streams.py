"""backend/engine/pocworker/streams.py's split of the SMs between chat and a PoC forward beside it (the CUDA side
runs in scripts/gpu_check.sh overlap)."""

from __future__ import annotations

import pytest

from backend.engine.pocworker.streams import SM_GROUP, poc_sms

H100_SMS = 132


@pytest.mark.parametrize("chat_share,expected", [
    (0.5, 64),  # 16 groups of 8: half of them
    (0.25, 96),
    (0.15, 104),  # 16 × 0.85 = 13.6 → 13 groups
    (0.01, 120),  # chat keeps at least one group (and the 4 SMs beyond the last whole group)
    (0.99, 8),  # PoC gets at least one group
    (0.0, None),  # chat waits for PoC: nothing to split
    (1.0, None),  # PoC never starts beside chat
])
def test_poc_sms_is_pocs_share_in_whole_groups(chat_share, expected):
    assert poc_sms(H100_SMS, chat_share) == expected


def test_poc_sms_is_a_whole_number_of_groups_below_the_total():
    for total in (8, 16, 78, 108, 132, 144):
        for share in (0.05, 0.3, 0.5, 0.7, 0.95):
            sms = poc_sms(total, share)
            if total < 2 * SM_GROUP:
                assert sms is None
            else:
                assert sms is not None and sms % SM_GROUP == 0 and SM_GROUP <= sms < total
