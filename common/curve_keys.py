"""Writes a CURVE key pair for the ZMQ link: NAME.key (public: hand it out) and NAME.key_secret (keep it).

    python -m common.curve_keys keys/backend --name backend        # the backend's pair
    python -m common.curve_keys keys/frontend-1 --name frontend-1  # a frontend's pair
    cp keys/frontend-1/frontend-1.key keys/clients/             # authorise it (the backend's clients dir)

Only pyzmq is needed, so this runs on any machine with the repo and in either image (compose's one-off `curve-keys`
runs it in the small frontend image: on vfs a container of the 4 GB backend image is a full copy per `up`). Both
files are created readable by the owner only (the public one is then opened to everyone); existing files are never
overwritten.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import zmq.auth

from common.process import refuse


def create_key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    """Writes NAME.key and NAME.key_secret into `directory`; FileExistsError if either exists."""
    public, secret = directory / f"{name}.key", directory / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise FileExistsError(f"{path} exists; remove it or pick another --name")
    directory.mkdir(parents=True, exist_ok=True)
    old_umask = os.umask(0o077)  # the secret file must never exist with wider permissions, not even briefly
    try:
        zmq.auth.create_certificates(directory, name)
    finally:
        os.umask(old_umask)
    public.chmod(0o644)
    return public, secret


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m common.curve_keys", description=__doc__.splitlines()[0])
    p.add_argument("directory", type=Path, help="where to write the two files (created if missing)")
    p.add_argument("--name", required=True, help="file name stem: backend, frontend-1, probe ...")
    args = p.parse_args(argv)
    if not args.name or "/" in args.name or args.name.startswith("."):
        p.error("--name must be a plain file name")
    try:
        public, secret = create_key_pair(args.directory, args.name)
    except OSError as e:
        sys.exit(refuse("curve_keys", e))
    print(f"public key {public} (give it to the peers)\nsecret key {secret} (keep it on this machine only)")


if __name__ == "__main__":
    main()
