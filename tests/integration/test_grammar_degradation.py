"""Grammar graceful degradation on the embedded engine: our versions of the fork's live tests
(tests/gonka/test_live_grammar_degradation.py), checked against sampling/grammar.py's rule.

The tiny model is random, so its JSON never gets past the first string value: after `{"key": "` the grammar
allows almost any token. A token the grammar must reject is therefore picked by context: a raw control
character inside a JSON string (JSON forbids U+0000-U+001F there), a letter where JSON needs a quote.
"""

from __future__ import annotations

from statistics import mean

import pytest
from tokenizers import Tokenizer

from tests.integration.replay_util import (
    HONEST,
    MASKED,
    assert_serving,
    body,
    chat,
    choice,
    dist,
    positions,
    replay_body,
    tokens,
)


def _fmt(name: str, props: dict) -> dict:
    schema = {"type": "object", "properties": props, "required": list(props)}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


STRING, INT = {"type": "string"}, {"type": "integer"}
SCHEMAS = {
    "person": ("Describe a person as JSON.", _fmt("person", {"name": STRING, "age": INT})),
    "color": ("Describe a color as JSON.", _fmt("color", {"color": STRING, "count": INT})),
    "animal": ("Describe an animal as JSON.", _fmt("animal", {"animal": STRING})),
}
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def tokenizer(stack) -> Tokenizer:
    return Tokenizer.from_file(str(stack.model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def runs(stack):
    """(body, inference, honest replay or None) per schema, each made once per module."""
    inferences: dict[str, tuple[dict, dict]] = {}
    replays: dict[str, dict] = {}

    def run(name: str, replay: bool = True) -> tuple[dict, dict, dict | None]:
        if name not in inferences:
            prompt, fmt = SCHEMAS[name]
            b = body(stack.model, prompt, max_tokens=MAX_TOKENS, response_format=fmt)
            inferences[name] = (b, chat(stack.base_url, b))
        b, inf = inferences[name]
        if replay and name not in replays:
            replays[name] = chat(stack.base_url, replay_body(b, inf))
        return b, inf, replays.get(name)
    return run


def _masked(pos: dict) -> int:
    return sum(e["logprob"] <= MASKED for e in pos["top_logprobs"])


def test_01_schema_output_starts_with_brace(runs):
    _, inf, _ = runs("person")
    assert choice(inf)["message"]["content"].startswith('{"name"')
    assert _masked(positions(inf)[0]) > 0  # the grammar constrained the first position


def test_02_no_grammar_replay_is_honest(stack):
    b = body(stack.model, "Explain gravity in two sentences.", max_tokens=40, ignore_eos=True)
    inf = chat(stack.base_url, b)
    d = dist(inf, chat(stack.base_url, replay_body(b, inf)))
    print(f"\n[distance] no grammar, 40 tokens: {d:.3g}")
    assert d < HONEST


def test_03_schema_replay_with_same_schema_is_honest(runs):
    _, inf, val = runs("color")
    assert tokens(val) == tokens(inf)
    d = dist(inf, val)
    print(f"\n[distance] schema color/count: {d:.3g}")
    assert d < HONEST


def _rejected_token(tokenizer: Tokenizer, ids: list[int], at: int) -> str:
    """A token the JSON grammar cannot accept after ids[:at]: '\\x01' inside a string, 'Q' outside one."""
    prefix = tokenizer.decode(ids[:at], skip_special_tokens=False)
    in_string = (prefix.count('"') - prefix.count('\\"')) % 2 == 1
    (token_id,) = tokenizer.encode("\x01" if in_string else "Q", add_special_tokens=False).ids
    return str(token_id)


@pytest.mark.parametrize("where", ["middle", "after_brace"])
def test_04_rejected_enforced_token_disables_grammar_without_failing(stack, runs, tokenizer, where):
    """The first rejected enforced token turns the request's grammar off instead of failing it. Our
    deviation from the fork's caveat: after that, the bitmask row is all-allowed (no stale mask), so no
    later position of this processed-mode replay shows a masked top logprob."""
    b, inf, _ = runs("animal", replay=False)  # its honest replay comes in test 05, after this one
    ids = [int(t) for t in tokens(inf)]
    at = len(ids) // 2 if where == "middle" else 1  # after '{' JSON needs a quote
    bad = replay_body(b, inf)
    bad["enforced_tokens"]["tokens"][at]["token"] = _rejected_token(tokenizer, ids, at)
    want = [t["token"] for t in bad["enforced_tokens"]["tokens"]]

    val = chat(stack.base_url, bad)
    got = positions(val)
    assert tokens(val) == want
    assert choice(val)["finish_reason"] not in ("error", "abort")
    assert choice(val)["finish_reason"] == choice(inf)["finish_reason"]
    assert _masked(got[0]) > 0                 # the grammar was on before the corruption ...
    assert got[at]["logprob"] <= MASKED        # ... its mask excluded the enforced token: rejected ...
    assert all(_masked(p) == 0 for p in got[at + 1:])  # ... and it is off from then on.
    assert_serving(stack.base_url, stack.model)


def test_04_out_of_vocab_token_with_grammar_is_400(stack, runs):
    """The fork's test 04 literally ("99999"): outside our 512-token vocabulary, so refused before the engine."""
    b, inf, _ = runs("animal", replay=False)
    bad = replay_body(b, inf)
    bad["enforced_tokens"]["tokens"][len(tokens(inf)) // 2]["token"] = "99999"
    assert chat(stack.base_url, bad, status=400)["error"]["param"] == "enforced_tokens"
    assert_serving(stack.base_url, stack.model)


def test_05_three_schema_prompts_replay_honestly(runs):
    """Runs after test 04: the "animal" replay also shows a disabled grammar does not leak into a later
    request with the same schema."""
    distances = []
    for name in SCHEMAS:
        _, inf, val = runs(name)
        distances.append(dist(inf, val))
    print(f"\n[distance] three schemas: {[f'{d:.3g}' for d in distances]}")
    assert all(d >= 0 for d in distances)
    assert mean(distances) < HONEST


X_INT = _fmt("x", {"x": INT})


def test_replay_of_a_completed_json_document_ends_at_eos(stack):
    """The schema {x: int} lets the random model finish its document: '}' then EOS under the grammar. The
    enforced list already ends with that EOS (nothing appended) and the grammar accepts it on replay."""
    b = body(stack.model, "Give me x as JSON.", max_tokens=40, response_format=X_INT)
    inf = chat(stack.base_url, b)
    assert choice(inf)["finish_reason"] == "stop", choice(inf)["message"]["content"]
    val = chat(stack.base_url, replay_body(b, inf))
    assert tokens(val) == tokens(inf)
    assert choice(val)["finish_reason"] == "stop"
    assert choice(val)["message"]["content"] == choice(inf)["message"]["content"]
    d = dist(inf, val)
    print(f"\n[distance] completed document {choice(inf)['message']['content']!r}: {d:.3g}")
    assert d < HONEST


@pytest.mark.parametrize(("text", "rejected_at"), [
    ('{"x": 12}', None),        # valid: the grammar stays on to the end (its EOS mask is the only one)
    ('{"x":12}', 5),            # the schema's separator is ": ", so '1' right after ':' is rejected
    ('{"x": 12}junk', 9),       # after the closing brace only EOS is allowed: 'j' is rejected
])
def test_enforced_str_against_a_grammar(stack, tokenizer, text, rejected_at):
    resp = chat(stack.base_url, body(stack.model, "Give me x as JSON.", max_tokens=30, response_format=X_INT,
                                     enforced_str=text))
    got = positions(resp)
    assert choice(resp)["message"]["content"] == text
    assert choice(resp)["finish_reason"] == "stop"
    assert len(got) == len(text) + 1  # one byte token per character here, then the appended EOS
    assert got[-1]["token"] == str(tokenizer.token_to_id("<|im_end|>"))
    if rejected_at is None:
        assert all(p["logprob"] > MASKED for p in got)
    else:
        assert all(p["logprob"] > MASKED for p in got[:rejected_at])
        assert got[rejected_at]["logprob"] <= MASKED
        assert all(_masked(p) == 0 for p in got[rejected_at + 1:])
