"""CURVE key files for the ZMQ link: read and checked once at start, by each process's settings module.

Process plumbing shared by both processes (like config.py). Key files are zmq.auth certificates, as
`python -m common.curve_keys` writes them: `NAME.key` holds the Z85 public key, `NAME.key_secret` the public
and the secret key. Every problem is a SettingsError naming the
setting and the path, so a process never starts with half of its security configured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.utils.z85 import Z85CHARS

from common.config import Option, SettingsError, setting

# A CURVE key is 32 bytes, 40 characters in Z85.
Z85_KEY_LEN = 40


@dataclass(frozen=True)
class KeyFile:
    """One certificate file, loaded: Z85 keys; `secret_key` is None for a public (`.key`) file."""

    path: Path
    public_key: bytes
    # Kept out of repr so that logging the settings never prints the secret.
    secret_key: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class PublicKeys:
    """The peers a CURVE server admits: the public keys of every `*.key` file in a directory (or of one file)."""

    path: Path
    keys: frozenset[bytes]


def client_key_setting() -> Any:
    """The CURVE client's own key pair setting, declared once for every client (frontend, probe)."""
    return setting("POCSERVE_CURVE_CLIENT_SECRET_KEY_FILE", "",
                   "CURVE: this client's secret key file (NAME.key_secret); its NAME.key must be in the backend's "
                   "--curve-clients-dir (empty: plaintext)", type=str, convert=load_secret_key_file)


def server_key_setting() -> Any:
    """The backend's public key setting, for every CURVE client."""
    return setting("POCSERVE_CURVE_SERVER_PUBLIC_KEY_FILE", "",
                   "CURVE: the backend's public key file (NAME.key); set with --curve-client-secret-key-file",
                   type=str, convert=load_public_key_file)


def check_client_keys(keys: KeyFile | None, server_key: KeyFile | None, address: str, address_setting: str) -> None:
    """Both client CURVE settings or neither, and not over inproc (no ZMTP handshake: CURVE would do nothing)."""
    if (keys is None) != (server_key is None):
        raise SettingsError("--curve-client-secret-key-file / POCSERVE_CURVE_CLIENT_SECRET_KEY_FILE and "
                            "--curve-server-public-key-file / POCSERVE_CURVE_SERVER_PUBLIC_KEY_FILE must be set "
                            "together")
    if keys is not None and address.startswith("inproc://"):
        raise SettingsError(f"{address_setting}: CURVE needs an ipc:// or tcp:// address")


def set_client_keys(sock: zmq.Socket, keys: KeyFile, server_key: KeyFile) -> None:
    """Makes `sock` a CURVE client with this process's pair, for the server whose public key is `server_key`."""
    sock.curve_secretkey = keys.secret_key
    sock.curve_publickey = keys.public_key
    sock.curve_serverkey = server_key.public_key


def load_secret_key_file(opt: Option, raw: str) -> KeyFile | None:
    """This process's own key pair (`NAME.key_secret`); None when the setting is empty."""
    if not raw:
        return None
    path = Path(raw).expanduser()
    public, secret = _read(opt, path)
    if secret is None:
        raise _error(opt, path, "holds no secret-key (is it the public .key file?)")
    _check_key(opt, path, secret, "secret-key")
    if zmq.curve_public(secret) != public:
        raise _error(opt, path, "its public-key does not belong to its secret-key")
    return KeyFile(path, public, secret)


def load_public_key_file(opt: Option, raw: str) -> KeyFile | None:
    """A peer's public key (`NAME.key`); None when the setting is empty."""
    if not raw:
        return None
    path = Path(raw).expanduser()
    return KeyFile(path, _read_public(opt, path))


def load_public_keys(opt: Option, raw: str) -> PublicKeys | None:
    """Every `*.key` file of a directory, or one key file; None when the setting is empty."""
    if not raw:
        return None
    path = Path(raw).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.key"))
        if not files:
            raise _error(opt, path, "holds no *.key public key files")
    else:
        files = [path]
    return PublicKeys(path, frozenset(_read_public(opt, f) for f in files))


def _read_public(opt: Option, path: Path) -> bytes:
    public, secret = _read(opt, path)
    if secret is not None:
        # A peer's secret must never leave its machine; refusing it here keeps it out of key directories.
        raise _error(opt, path, "holds a secret-key: give the public .key file instead")
    return public


def _read(opt: Option, path: Path) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise _error(opt, path, "no such file")
    if not path.is_file():
        raise _error(opt, path, "not a regular file")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except PermissionError:
        raise _error(opt, path, "not readable (permission denied)") from None
    except OSError as e:
        raise _error(opt, path, f"not readable ({e.strerror or e})") from None
    except ValueError:
        raise _error(opt, path, "no public-key line: not a zmq.auth key file") from None
    _check_key(opt, path, public, "public-key")
    return public, secret


def _check_key(opt: Option, path: Path, key: bytes, what: str) -> None:
    if len(key) != Z85_KEY_LEN or not set(key) <= set(Z85CHARS):
        raise _error(opt, path, f"{what} is not a {Z85_KEY_LEN}-character Z85 key")


def _error(opt: Option, path: Path, reason: str) -> SettingsError:
    return SettingsError(f"{opt.flag} / {opt.env}: {path}: {reason}")
