"""Bearer tokens checked before anything else of a request (frontend/auth.py): a request without its token gets
401 whatever its body, its size or its route; with the token, the same request gets the answer it would without
a token set."""

from __future__ import annotations

import pytest

from tests.unit.test_frontend_errors import CHAT, make_app, request

KEY = {"POCSERVE_API_KEY": "k3y"}
POW_TOKEN = {"POCSERVE_POW_API_TOKEN": "p0w"}
MALFORMED = {"content": b'{"model": "tiny",', "headers": {"content-type": "application/json"}}


def assert_401(r, prefix: str) -> None:
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"] == {"message": f"missing or invalid bearer token for {prefix}",
                                 "type": "AuthenticationError", "param": None, "code": 401}


@pytest.mark.parametrize("environ,path,prefix,token", [
    (KEY, "/v1/chat/completions", "/v1", "k3y"),
    (POW_TOKEN, "/api/v1/pow/init/generate", "/api/v1/pow", "p0w"),
], ids=["api-key", "pow-token"])
async def test_malformed_json_without_the_token_is_401_before_400(environ, path, prefix, token):
    app = make_app(environ=environ)
    assert_401(await request(app, "POST", path, **MALFORMED), prefix)
    wrong = {**MALFORMED, "headers": {**MALFORMED["headers"], "authorization": "Bearer nope"}}
    assert_401(await request(app, "POST", path, **wrong), prefix)
    right = {**MALFORMED, "headers": {**MALFORMED["headers"], "authorization": f"Bearer {token}"}}
    r = await request(app, "POST", path, **right)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.text


async def test_token_checked_before_the_body_limit():
    path, body = CHAT
    app = make_app(environ={**KEY, "POCSERVE_MAX_BODY_BYTES": "1024"})
    big = {**body, "stop": "x" * 2000}
    assert_401(await request(app, "POST", path, json=big), "/v1")
    r = await request(app, "POST", path, json=big, headers={"authorization": "Bearer k3y"})
    assert r.status_code == 413


async def test_api_key_guards_every_v1_path_as_vllm_does():
    app = make_app(environ=KEY)
    assert_401(await request(app, "GET", "/v1/nope"), "/v1")  # unknown route: 401 first, as vLLM answers
    assert_401(await request(app, "GET", "/v1/chat/completions"), "/v1")  # wrong method too
    r = await request(app, "GET", "/v1/chat/completions", headers={"authorization": "Bearer k3y"})
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    # A CORS preflight carries no credentials (vLLM lets OPTIONS through too); no route takes it.
    assert (await request(app, "OPTIONS", "/v1/models")).status_code == 405
    # Paths that only begin like the prefix are not under it.
    assert (await request(app, "GET", "/v1x")).status_code == 404
    assert (await request(app, "GET", "/health")).status_code == 200


async def test_each_token_guards_its_own_prefix_only():
    app = make_app(environ={**KEY, **POW_TOKEN})
    assert_401(await request(app, "GET", "/api/v1/pow/status", headers={"authorization": "Bearer k3y"}),
               "/api/v1/pow")
    assert_401(await request(app, "GET", "/v1/models", headers={"authorization": "Bearer p0w"}), "/v1")
    assert (await request(app, "GET", "/v1/models", headers={"authorization": "Bearer k3y"})).status_code == 200


def test_no_token_set_adds_no_middleware():
    names = [m.cls.__name__ for m in make_app().user_middleware]
    assert "BearerGuard" not in names
    assert "BearerGuard" in [m.cls.__name__ for m in make_app(environ=KEY).user_middleware]
