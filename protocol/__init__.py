"""Wire protocol between frontends and the backend: msgspec structs, version, codec."""
