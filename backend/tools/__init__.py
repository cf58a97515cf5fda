"""Operator tools, each a `python -m` command: the probe (a frontend's view of a backend socket), the seeded model
generator, and CURVE key pairs."""
