"""Process plumbing every process imports (frontend, backend, probe): settings declared once and parsed from flags
and environment, logging, CURVE key files, and the one ZMQ socket factory. No wire structs (those are protocol/)."""
