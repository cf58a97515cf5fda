"""Unit tests for the settings of both processes: precedence, validation errors, env naming and docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.startup import settings as backend_settings
from common.config import SettingsError
from frontend import settings as frontend_settings

REPO = Path(__file__).resolve().parents[2]
MODULES = [backend_settings, frontend_settings]
IDS = ["backend", "frontend"]


# --- precedence: CLI flag > environment variable > default ---

PRECEDENCE = [
    (backend_settings, "address", "POCSERVE_BACKEND_ADDRESS", "ipc:///tmp/a.ipc", "tcp://127.0.0.1:5555",
     backend_settings.DEFAULT_ADDRESS, "ipc:///tmp/a.ipc", "tcp://127.0.0.1:5555"),
    (backend_settings, "frontend_timeout_s", "POCSERVE_FRONTEND_TIMEOUT_S", "0", "2.5", 5.0, 0.0, 2.5),
    (frontend_settings, "port", "POCSERVE_PORT", "9000", "9100", 8000, 9000, 9100),
    (frontend_settings, "ping_interval_s", "POCSERVE_PING_INTERVAL_S", "0.25", "2", 0.5, 0.25, 2.0),
    (frontend_settings, "logprob_token_format", "POCSERVE_LOGPROB_TOKEN_FORMAT", "text", "ids", "ids", "text",
     "ids"),
    (frontend_settings, "backend_address", "POCSERVE_BACKEND_ADDRESS", "ipc:///tmp/a.ipc", "ipc:///tmp/b.ipc",
     "ipc:///tmp/pocserve/backend.ipc", "ipc:///tmp/a.ipc", "ipc:///tmp/b.ipc"),
    (frontend_settings, "pow_api_token", "POCSERVE_POW_API_TOKEN", "env-token", "flag-token", "", "env-token",
     "flag-token"),
    (frontend_settings, "pow_wait_timeout_s", "POCSERVE_POW_WAIT_TIMEOUT_S", "30", "5.5", 600.0, 30.0, 5.5),
    (backend_settings, "batch_size_default", "POC_BATCH_SIZE_DEFAULT", "64", "8", 32, 64, 8),
    (backend_settings, "generate_chunk_timeout_s", "POC_GENERATE_CHUNK_TIMEOUT_SEC", "30", "0.5", 60.0, 30.0, 0.5),
    (backend_settings, "callback_max_artifacts", "POC_CALLBACK_MAX_ARTIFACTS", "500", "7", 1000000, 500, 7),
]


@pytest.mark.parametrize("module,name,env,env_value,flag_value,default,env_parsed,flag_parsed", PRECEDENCE,
                         ids=[f"{row[0].__name__.split('.')[0]}-{row[1]}" for row in PRECEDENCE])
def test_settings_cli_beats_env_beats_default(module, name, env, env_value, flag_value, default, env_parsed,
                                              flag_parsed):
    flag = "--" + name.replace("_", "-")
    assert getattr(module.load_settings([], {}), name) == default
    assert getattr(module.load_settings([], {env: env_value}), name) == env_parsed
    assert getattr(module.load_settings([flag, flag_value], {env: env_value}), name) == flag_parsed
    assert getattr(module.load_settings([flag, flag_value], {}), name) == flag_parsed


@pytest.mark.parametrize("module,name,env,flag", [
    (backend_settings, "honour_dtype", "POCSERVE_HONOUR_DTYPE", "--honour-dtype"),
    (backend_settings, "bind_any", "POCSERVE_BACKEND_BIND_ANY", "--bind-any"),
], ids=["honour_dtype", "bind_any"])
def test_settings_bool_cli_beats_env_beats_default(module, name, env, flag):
    assert getattr(module.load_settings([], {}), name) is False
    for raw in ("1", "true", "YES", "on"):
        assert getattr(module.load_settings([], {env: raw}), name) is True
    for raw in ("0", "false", "no", "off", ""):
        assert getattr(module.load_settings([], {env: raw}), name) is False
    no_flag = "--no-" + flag.removeprefix("--")
    assert getattr(module.load_settings([no_flag], {env: "1"}), name) is False
    assert getattr(module.load_settings([flag], {env: "0"}), name) is True


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_settings_defaults_load_without_env(module):
    settings = module.load_settings([], {})
    # Settings without a converter hold their declared default as is (frontend_id's empty default makes the
    # frontend name itself host-pid: tested below).
    plain = [o for o in module.OPTIONS if o.convert is None and o.name != "frontend_id"]
    assert plain and {o.name: getattr(settings, o.name) for o in plain} == {o.name: o.default for o in plain}


def test_settings_frontend_id_defaults_to_host_pid():
    assert frontend_settings.load_settings([], {}).frontend_id
    assert frontend_settings.load_settings([], {"POCSERVE_FRONTEND_ID": "fe-1"}).frontend_id == "fe-1"


# --- bad values: SettingsError naming the flag or the variable ---

@pytest.mark.parametrize("module,argv,environ,names", [
    (backend_settings, [], {"POCSERVE_GENERATE_MODEL": "huge"}, ["--generate-model", "POCSERVE_GENERATE_MODEL"]),
    (backend_settings, ["--frontend-timeout-s", "0.5"], {}, ["--frontend-timeout-s", "POCSERVE_FRONTEND_TIMEOUT_S"]),
    (backend_settings, [], {"POCSERVE_FRONTEND_TIMEOUT_S": "-1"}, ["--frontend-timeout-s"]),
    (backend_settings, [], {"POCSERVE_FRONTEND_TIMEOUT_S": "nan"}, ["--frontend-timeout-s"]),
    (backend_settings, ["--address", "tcp://0.0.0.0:5555"], {}, ["--address", "POCSERVE_BACKEND_BIND_ANY"]),
    (backend_settings, ["--address", "tcp://*:5555"], {}, ["--address", "POCSERVE_BACKEND_BIND_ANY"]),
    (backend_settings, [], {"POCSERVE_BACKEND_ADDRESS": "tcp://[::]:5555"}, ["--address"]),
    (backend_settings, ["--address", "udp://127.0.0.1:5555"], {}, ["--address", "POCSERVE_BACKEND_ADDRESS"]),
    (frontend_settings, [], {"POCSERVE_PORT": "http"}, ["POCSERVE_PORT"]),
    (frontend_settings, [], {"POCSERVE_LOGPROB_TOKEN_FORMAT": "bytes"},
     ["--logprob-token-format", "POCSERVE_LOGPROB_TOKEN_FORMAT"]),
    (frontend_settings, [], {"POCSERVE_LOG_LEVEL": "loud"}, ["--log-level", "POCSERVE_LOG_LEVEL"]),
    (frontend_settings, ["--ping-interval-s", "0"], {}, ["--ping-interval-s"]),
    (frontend_settings, ["--backend-timeout-s", "-1"], {}, ["--backend-timeout-s"]),
    (frontend_settings, ["--breaker-misses", "0"], {}, ["--breaker-misses"]),
    (frontend_settings, ["--pow-wait-timeout-s", "0"], {}, ["--pow-wait-timeout-s"]),
    (backend_settings, [], {"POC_BATCH_SIZE_DEFAULT": "0"}, ["--batch-size-default"]),
    (backend_settings, [], {"POC_BATCH_SIZE_DEFAULT": "many"}, ["POC_BATCH_SIZE_DEFAULT"]),
    (backend_settings, [], {"POC_GENERATE_CHUNK_TIMEOUT_SEC": "0"},
     ["--generate-chunk-timeout-s", "POC_GENERATE_CHUNK_TIMEOUT_SEC"]),
    (backend_settings, [], {"POC_GENERATE_CHUNK_TIMEOUT_SEC": "nan"}, ["POC_GENERATE_CHUNK_TIMEOUT_SEC"]),
    (backend_settings, ["--callback-max-artifacts", "0"], {}, ["--callback-max-artifacts"]),
    (backend_settings, ["--chat-share", "1.5"], {}, ["--chat-share", "POCSERVE_CHAT_SHARE"]),
    (backend_settings, [], {"POCSERVE_CHAT_SHARE": "-0.1"}, ["--chat-share"]),
    (backend_settings, [], {"POCSERVE_CHAT_SHARE": "nan"}, ["--chat-share"]),
    (backend_settings, ["--poc-overlap", "on", "--tensor-parallel-size", "2"], {}, ["--poc-overlap", "one rank"]),
    (backend_settings, [], {"POCSERVE_POC_OVERLAP": "sometimes"}, ["--poc-overlap", "POCSERVE_POC_OVERLAP"]),
    (backend_settings, ["--poc-forwards-in-flight", "3"], {}, ["--poc-forwards-in-flight", "1 or 2"]),
    (backend_settings, [], {"POCSERVE_POC_FORWARDS_IN_FLIGHT": "0"}, ["POCSERVE_POC_FORWARDS_IN_FLIGHT"]),
    (backend_settings, ["--heap-trim-interval-s", "-1"], {}, ["--heap-trim-interval-s", ">= 0"]),
    (backend_settings, [], {"POCSERVE_HEAP_TRIM_INTERVAL_S": "nan"}, ["--heap-trim-interval-s"]),
    (backend_settings, ["--prefill-window-ms", "-5"], {}, ["--prefill-window-ms", ">= 0"]),
])
def test_settings_bad_value_raises_settings_error_naming_it(module, argv, environ, names):
    with pytest.raises(SettingsError) as info:
        module.load_settings(argv, environ)
    for name in names:
        assert name in str(info.value)


def test_settings_wildcard_tcp_bind_allowed_with_bind_any():
    s = backend_settings.load_settings(["--address", "tcp://0.0.0.0:5555", "--bind-any"], {})
    assert s.bind_any and s.address == "tcp://0.0.0.0:5555"
    s = backend_settings.load_settings([], {"POCSERVE_BACKEND_ADDRESS": "tcp://*:5555",
                                            "POCSERVE_BACKEND_BIND_ANY": "1"})
    assert s.bind_any


@pytest.mark.parametrize("module,argv,flag", [
    (frontend_settings, ["--logprob-token-format", "bytes"], "--logprob-token-format"),
])
def test_settings_bad_cli_value_exits_with_usage_naming_the_flag(module, argv, flag, capsys):
    # argparse validates CLI values itself: exit status 2 and a usage line, like any bad flag.
    with pytest.raises(SystemExit) as info:
        module.load_settings(argv, {})
    assert info.value.code == 2
    assert flag in capsys.readouterr().err


# --- naming and documentation ---

@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_settings_every_env_name_starts_with_pocserve_or_poc(module):
    # POC_* names are the fork's own variables (README, "The fork's variables"), kept so existing deployments keep
    # working.
    assert [o.env for o in module.OPTIONS if not o.env.startswith(("POCSERVE_", "POC_"))] == []


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_settings_every_option_is_a_settings_field(module):
    names = [o.name for o in module.OPTIONS]
    assert len(names) == len(set(names))
    assert len({o.env for o in module.OPTIONS}) == len(names)
    own = {"vllm"} if module is backend_settings else set()  # the backend's vLLM flags (test_vllm_args.py)
    assert set(names) | own == set(vars(module.load_settings([], {})))


def test_settings_readme_tables_are_the_generated_ones():
    """The README's settings tables are what scripts/settings_table.py prints (regenerate them after a change)."""
    import contextlib
    import io
    import runpy

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(REPO / "scripts" / "settings_table.py"), run_name="__main__")
    text = (REPO / "README.md").read_text()
    start = text.index("\n", text.index("<!-- settings:start")) + 1
    assert text[start:text.index("<!-- settings:end -->")] == out.getvalue()


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_settings_readme_mentions_every_env_name(module):
    readme = REPO / "README.md"
    if not readme.exists():
        pytest.skip(f"{readme} does not exist yet: nothing to check the env names against")
    text = readme.read_text()
    assert [o.env for o in module.OPTIONS if o.env not in text] == []


# --- CURVE key files: loaded at start; a bad one is a SettingsError naming the setting and the path ---

@pytest.fixture
def curve_files(tmp_path) -> dict[str, Path]:
    from common.curve_keys import create_key_pair
    server_public, server_secret = create_key_pair(tmp_path / "server", "server")
    client_public, client_secret = create_key_pair(tmp_path / "client", "client")
    clients = tmp_path / "clients"
    clients.mkdir()
    (clients / "client.key").write_bytes(client_public.read_bytes())
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a certificate\n")
    short = tmp_path / "short.key"
    short.write_text('curve\n    public-key = "tooShort"\n')
    # A secret file whose public key is another pair's: the halves do not belong together.
    mixed = tmp_path / "mixed.key_secret"
    mixed.write_text(server_secret.read_text().replace(_public_key(server_public), _public_key(client_public)))
    return {"server_public": server_public, "server_secret": server_secret, "client_public": client_public,
            "client_secret": client_secret, "clients": clients, "empty_dir": (tmp_path / "empty").resolve(),
            "missing": tmp_path / "missing.key", "garbage": garbage, "short": short, "mixed": mixed}


def _public_key(path: Path) -> str:
    import zmq.auth
    return zmq.auth.load_certificate(path)[0].decode()


def _curve_argv(module, files: dict[str, Path], **override: str) -> list[str]:
    """Valid CURVE flags for `module`, with some replaced by a named entry of `files`."""
    names = ({"--curve-server-secret-key-file": "server_secret", "--curve-clients-dir": "clients"}
             if module is backend_settings else
             {"--curve-client-secret-key-file": "client_secret", "--curve-server-public-key-file": "server_public"})
    names.update(override)
    return [arg for flag, name in names.items() for arg in (flag, str(files[name]))]


def test_settings_curve_keys_load_and_secrets_stay_out_of_repr(curve_files):
    b = backend_settings.load_settings(_curve_argv(backend_settings, curve_files), {})
    assert b.curve_server_secret_key_file.public_key.decode() == _public_key(curve_files["server_public"])
    assert b.curve_clients_dir.keys == {_public_key(curve_files["client_public"]).encode()}
    f = frontend_settings.load_settings([], {
        "POCSERVE_CURVE_CLIENT_SECRET_KEY_FILE": str(curve_files["client_secret"]),
        "POCSERVE_CURVE_SERVER_PUBLIC_KEY_FILE": str(curve_files["server_public"])})
    assert f.curve_server_public_key_file.public_key == b.curve_server_secret_key_file.public_key
    assert f.curve_client_secret_key_file.public_key in b.curve_clients_dir.keys
    for settings, keys in ((b, b.curve_server_secret_key_file), (f, f.curve_client_secret_key_file)):
        assert keys.secret_key and keys.secret_key.decode() not in repr(settings)
    # One public key file instead of a directory of them.
    one = backend_settings.load_settings(_curve_argv(backend_settings, curve_files,
                                                     **{"--curve-clients-dir": "client_public"}), {})
    assert one.curve_clients_dir.keys == b.curve_clients_dir.keys


CURVE_BAD = [
    (backend_settings, "--curve-server-secret-key-file", "missing", "no such file"),
    (backend_settings, "--curve-server-secret-key-file", "garbage", "no public-key line"),
    (backend_settings, "--curve-server-secret-key-file", "server_public", "holds no secret-key"),
    (backend_settings, "--curve-server-secret-key-file", "mixed", "does not belong"),
    (backend_settings, "--curve-clients-dir", "missing", "no such file"),
    (backend_settings, "--curve-clients-dir", "empty_dir", "no *.key public key files"),
    (backend_settings, "--curve-clients-dir", "short", "not a 40-character Z85 key"),
    (backend_settings, "--curve-clients-dir", "client_secret", "holds a secret-key"),
    (frontend_settings, "--curve-client-secret-key-file", "missing", "no such file"),
    (frontend_settings, "--curve-client-secret-key-file", "client_public", "holds no secret-key"),
    (frontend_settings, "--curve-server-public-key-file", "garbage", "no public-key line"),
    (frontend_settings, "--curve-server-public-key-file", "server_secret", "holds a secret-key"),
]


@pytest.mark.parametrize("module,flag,name,reason", CURVE_BAD,
                         ids=[f"{row[0].__name__.split('.')[0]}-{row[1].removeprefix('--curve-')}-{row[2]}"
                              for row in CURVE_BAD])
def test_settings_curve_bad_key_file_names_setting_and_path(curve_files, module, flag, name, reason):
    if name == "empty_dir":
        curve_files[name].mkdir()
    with pytest.raises(SettingsError) as info:
        module.load_settings(_curve_argv(module, curve_files, **{flag: name}), {})
    env = next(o.env for o in module.OPTIONS if o.flag == flag)
    message = str(info.value)
    assert flag in message and env in message and str(curve_files[name]) in message and reason in message
    assert "\n" not in message


def test_settings_curve_unreadable_key_file(curve_files, monkeypatch):
    import zmq.auth

    def unreadable(path):  # chmod 000 does not stop root, who may run these tests
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(zmq.auth, "load_certificate", unreadable)
    with pytest.raises(SettingsError) as info:
        backend_settings.load_settings(_curve_argv(backend_settings, curve_files), {})
    assert "--curve-server-secret-key-file" in str(info.value) and "permission denied" in str(info.value)


@pytest.mark.parametrize("module,argv,names", [
    (backend_settings, ["--curve-server-secret-key-file", "{server_secret}"], ["--curve-clients-dir"]),
    (backend_settings, ["--curve-clients-dir", "{clients}"], ["POCSERVE_CURVE_SERVER_SECRET_KEY_FILE"]),
    (backend_settings, ["--address", "inproc://x", "--curve-server-secret-key-file", "{server_secret}",
                        "--curve-clients-dir", "{clients}"], ["--address", "CURVE"]),
    (frontend_settings, ["--curve-client-secret-key-file", "{client_secret}"], ["--curve-server-public-key-file"]),
    (frontend_settings, ["--backend-address", "inproc://x", "--curve-client-secret-key-file", "{client_secret}",
                         "--curve-server-public-key-file", "{server_public}"], ["--backend-address", "CURVE"]),
], ids=["backend-no-clients", "backend-no-secret", "backend-inproc", "frontend-no-server-key", "frontend-inproc"])
def test_settings_curve_pair_and_transport_checked(curve_files, module, argv, names):
    with pytest.raises(SettingsError) as info:
        module.load_settings([a.format(**curve_files) for a in argv], {})
    for name in names:
        assert name in str(info.value)
