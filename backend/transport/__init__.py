"""The io thread's world: the ROUTER to the frontends and the link to the processor (server.py), the handshake
and pings it answers itself (control.py), peer liveness (peers.py) and CURVE admission (curve.py)."""
