"""The protocol version; bump it with the golden-bytes fixtures on any wire change."""

PROTOCOL_VERSION = 5
