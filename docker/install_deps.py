"""Installs pyproject's pinned requirements (core, plus named extras) into an image; build-time only.

    python install_deps.py pyproject.toml                       # frontend: every core pin, with its deps
    python install_deps.py pyproject.toml --extra backend --keep-installed
        # backend: on top of the vLLM image, install only what the image lacks and change nothing it has

With --keep-installed, a requirement whose distribution is already installed is kept at the installed version
(vLLM pins its own fastapi, pydantic, numpy, ...; upgrading them under it breaks it), a version that differs
from the pin is printed, and the missing ones are installed with every installed distribution as a constraint,
so pip fails the build rather than move anything vLLM brought.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def requirements(pyproject: str, extras: list[str]) -> list[str]:
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += project.get("optional-dependencies", {})[extra]
    return reqs


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def plan(reqs: list[str]) -> list[str]:
    """The requirements to install when what is installed must stay as it is."""
    todo = []
    for req in reqs:
        name, extras, _spec = _REQ.match(req).groups()
        have = installed_version(name)
        if have is None:
            todo.append(req)
            continue
        if not req.endswith(f"=={have}"):
            print(f"install_deps: keeping {name}=={have} from the base image (pyproject pins {req})")
        if extras:  # the base has the package; make sure the extra's dependencies are there too
            todo.append(f"{name}{extras}=={have}")
    return todo


def installed_constraints() -> str:
    pins = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            pins[name.lower()] = f"{name}=={dist.version}"
    return "\n".join(sorted(pins.values())) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject")
    parser.add_argument("--extra", action="append", default=[], help="optional-dependencies group to add")
    parser.add_argument("--keep-installed", action="store_true",
                        help="install only missing requirements, constrained to everything already installed")
    args = parser.parse_args()
    reqs = requirements(args.pyproject, args.extra)
    pip = [sys.executable, "-m", "pip", "install", "--no-cache-dir"]
    if not args.keep_installed:
        subprocess.run([*pip, *reqs], check=True)
        return
    todo = plan(reqs)
    if not todo:
        print("install_deps: the base image already has every requirement")
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write(installed_constraints())
        constraints.flush()
        subprocess.run([*pip, "-c", constraints.name, *todo], check=True)


if __name__ == "__main__":
    main()
