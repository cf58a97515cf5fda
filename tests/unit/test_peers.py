"""Unit tests for backend/transport/peers.py: when a silent peer is declared lost (injected clock, no sockets)."""

from __future__ import annotations

import pytest

from backend.transport.peers import PeerTable

A, B = b"fe-a", b"fe-b"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_peer_table_forgets_only_peers_silent_past_timeout():
    clock = Clock()
    peers = PeerTable(5.0, clock)
    peers.seen(A)
    peers.seen(B)
    for _ in range(12):  # B pings every 0.5 s for 6 s, A says nothing
        clock.now += 0.5
        peers.seen(B)
    assert peers.sweep() == [(A, 6.0)]
    assert A not in peers and B in peers and list(peers) == [B]
    assert peers.sweep() == []  # reported once


def test_peer_table_silence_of_exactly_the_timeout_is_not_lost():
    clock = Clock()
    peers = PeerTable(5.0, clock)
    peers.seen(A)
    clock.now += 5.0
    assert peers.sweep() == []
    clock.now += 0.01
    assert [identity for identity, _ in peers.sweep()] == [A]


def test_peer_table_lost_peer_that_comes_back_is_tracked_again():
    clock = Clock()
    peers = PeerTable(2.0, clock)
    peers.seen(A)
    clock.now += 3.0
    assert len(peers.sweep()) == 1 and len(peers) == 0
    peers.seen(A)  # the partition healed: its next ping
    assert A in peers
    clock.now += 1.0
    assert peers.sweep() == []


def test_peer_table_timeout_zero_never_sweeps():
    clock = Clock()
    peers = PeerTable(0.0, clock)
    peers.seen(A)
    clock.now += 1e6
    assert not peers.is_sweep_due()
    assert peers.sweep() == [] and A in peers


@pytest.mark.parametrize("timeout_s,interval_s", [(5.0, 1.0), (60.0, 1.0), (2.0, 0.5), (1.0, 0.25)])
def test_peer_table_sweep_interval_bounds_detection(timeout_s, interval_s):
    clock = Clock()
    peers = PeerTable(timeout_s, clock)
    assert peers.sweep_interval_s == interval_s
    clock.now += interval_s - 0.01
    assert not peers.is_sweep_due()
    clock.now += 0.01
    assert peers.is_sweep_due()
    peers.sweep()
    assert not peers.is_sweep_due()
