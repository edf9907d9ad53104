"""The real server, through the official `openai` client and raw httpx.

One server for the module (see conftest.py). Greedy requests use `temperature=0` so their text
is deterministic; expected texts come from the server itself or from the offline `LLM`, never
from hand-written strings.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time

import httpx
import openai
import pytest
from serving_helpers import MODEL, Server

pytestmark = pytest.mark.timeout(300)

LONG_PROMPT = " ".join(f"item {i} is the number {i * 7 % 13}." for i in range(40))


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def aclient_factory(server: Server):
    return lambda: openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def server_info(server: Server) -> dict:
    r = httpx.get(f"{server.url}/get_server_info", timeout=10)
    assert r.status_code == 200
    return r.json()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus exposition."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^([^\s{]+)(\{[^}]*\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    raise KeyError(name)


# ---- basic endpoints -----------------------------------------------------------------------


def test_models_and_health(server: Server, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_chat_completion(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say something."},
        ],
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.object == "chat.completion"
    assert r.model == MODEL
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_with_tools_goes_through_the_template(client: openai.OpenAI) -> None:
    """Assistant tool calls and tool results are rendered by the chat template."""
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    plain = client.chat.completions.create(
        model=MODEL, messages=messages[:1], max_tokens=1, temperature=0
    )
    full = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1, temperature=0
    )
    # The tool call and its result add prompt tokens (the template rendered them).
    assert full.usage.prompt_tokens > plain.usage.prompt_tokens + 10


def test_text_completion_and_token_id_prompt(client: openai.OpenAI) -> None:
    text = client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert text.object == "text_completion"
    assert text.choices[0].finish_reason == "length"
    assert text.usage.completion_tokens == 6
    # The same prompt as token ids gives the same greedy text.
    from tokenspeed.runtime.model_source import resolve_model_path
    from tokenspeed.runtime.tokenizer import Tokenizer

    ids = Tokenizer.from_dir(resolve_model_path(None)).encode("The quick brown fox")
    by_ids = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert by_ids.usage.prompt_tokens == len(ids) == text.usage.prompt_tokens
    assert by_ids.choices[0].text == text.choices[0].text


def test_streaming_chat_with_usage(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Stream to me."}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [whole.choices[0].finish_reason]
    assert text == whole.choices[0].message.content
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1]
    assert chunks[-1].choices == []
    assert usage_chunks[0].usage.completion_tokens == whole.usage.completion_tokens
    assert usage_chunks[0].usage.prompt_tokens == whole.usage.prompt_tokens


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_continuous_usage_stats_put_usage_on_every_chunk(client: openai.OpenAI, endpoint) -> None:
    opts = {"include_usage": True, "continuous_usage_stats": True}
    if endpoint == "chat":
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Count."}], max_tokens=10,
            temperature=0, stream=True, stream_options=opts, extra_body={"ignore_eos": True},  # type: ignore[arg-type]
        )  # fmt: skip
    else:
        stream = client.completions.create(model=MODEL, prompt="Count.", max_tokens=10,
                                           temperature=0, stream=True, stream_options=opts,
                                           extra_body={"ignore_eos": True})  # fmt: skip
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)
    done = [c.usage.completion_tokens for c in chunks]
    assert (
        done == sorted(done)
        and done[-1] == chunks[-1].usage.total_tokens - chunks[-1].usage.prompt_tokens
    )
    assert chunks[-1].choices == [] and done[-1] == 10


def test_streaming_without_usage_sends_none(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="abc", max_tokens=3, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


# ---- stop strings --------------------------------------------------------------------------


def _greedy_text(client: openai.OpenAI, prompt: str, n_tokens: int) -> str:
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=n_tokens, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    return r.choices[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_is_never_emitted(client: openai.OpenAI, stream: bool) -> None:
    prompt = "Once upon a time"
    full = _greedy_text(client, prompt, 24)
    # A stop string from the middle of the greedy output: the answer is the text before it.
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop) == 3
    expected = full[: full.index(stop)]
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop],
                  extra_body={"ignore_eos": True})  # fmt: skip
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        r = client.completions.create(**kwargs)
        text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert r.usage.completion_tokens < 24
    assert text == expected
    assert stop not in text
    assert finish == "stop"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_include_stop_str_in_output(client: openai.OpenAI, stream: bool) -> None:
    prompt = "Once upon a time"
    full = _greedy_text(client, prompt, 24)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop],
                  extra_body={"ignore_eos": True, "include_stop_str_in_output": True})  # fmt: skip
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        text = client.completions.create(**kwargs).choices[0].text
    assert text == full[: full.index(stop) + len(stop)]


def test_stop_token_ids(client: openai.OpenAI) -> None:
    from tokenspeed.runtime.model_source import resolve_model_path
    from tokenspeed.runtime.tokenizer import Tokenizer

    r = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0,
        logprobs=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    tok = Tokenizer.from_dir(resolve_model_path(None))
    ids = [tok.encode(t, add_special_tokens=False) for t in r.choices[0].logprobs.tokens]
    third = ids[2][0] if len(ids[2]) == 1 else None
    if third is None:
        pytest.skip("third token does not round-trip through its text")
    first_hit = next(i for i, t in enumerate(ids) if t == [third])
    s = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0,
        extra_body={"ignore_eos": True, "stop_token_ids": [third]},
    )  # fmt: skip
    assert s.choices[0].finish_reason == "stop"
    assert s.usage.completion_tokens == first_hit + 1


# ---- logprobs, n, seeds --------------------------------------------------------------------


def test_chat_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
        temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True},
    )  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert e.logprob <= 0
        assert len(e.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-5)
        assert bytes(e.bytes) == e.token.encode()


def test_completion_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt="The", max_tokens=4, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_n_choices_share_the_prompt(server: Server, client: openai.OpenAI) -> None:
    before = metric(httpx.get(f"{server.url}/metrics").text, "tokenspeed:prefix_cache_hits_total")
    prompt = LONG_PROMPT + " n=2 test"
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, n=2, temperature=1.0, seed=7,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 16
    # The second choice reused the first one's prompt pages.
    after = metric(httpx.get(f"{server.url}/metrics").text, "tokenspeed:prefix_cache_hits_total")
    assert after - before >= 16
    # Seeded sampling reproduces.
    again = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, n=2, temperature=1.0, seed=7,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [c.text for c in again.choices] == [c.text for c in r.choices]


def test_n_streaming(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "two"}],
            max_tokens=4,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )  # fmt: skip
    )
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks
                if c.choices and c.choices[0].finish_reason}  # fmt: skip
    assert finishes == {0: "length", 1: "length"}
    assert chunks[-1].usage.completion_tokens == 8


def test_penalties_and_min_tokens_are_accepted(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt="a b c", max_tokens=6, temperature=0.7, top_p=0.9,
        presence_penalty=0.5, frequency_penalty=0.5,
        extra_body={"repetition_penalty": 1.2, "min_tokens": 6, "top_k": 20},
    )  # fmt: skip
    assert r.usage.completion_tokens == 6


def test_logit_bias_forces_a_token(client: openai.OpenAI) -> None:
    """+100 on one token id makes every sampled token that token, even at temperature 0.9
    (unit tests pin the arithmetic); the same id through chat gives the same text."""
    comp = client.completions.create(model=MODEL, prompt="a b c", max_tokens=4, temperature=0.9,
                                     seed=3, logit_bias={"42": 100}, logprobs=0)  # fmt: skip
    tokens = comp.choices[0].logprobs.tokens
    assert len(tokens) == 4 and len(set(tokens)) == 1
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0,
        logit_bias={"42": 100},
    )  # fmt: skip
    assert chat.choices[0].message.content == tokens[0] * 3


# ---- load, cache, disconnect ----------------------------------------------------------------


def test_32_concurrent_streams_complete_with_consistent_usage(aclient_factory) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, int, str, int]:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"request number {i}"}],
            max_tokens=16 + i % 5, logprobs=True, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        tokens, finish, usage = 0, None, None
        async for c in stream:
            if c.choices:
                if c.choices[0].logprobs and c.choices[0].logprobs.content:
                    tokens += len(c.choices[0].logprobs.content)
                finish = c.choices[0].finish_reason or finish
            if c.usage is not None:
                usage = c.usage
        assert usage is not None and finish is not None
        return tokens, usage.completion_tokens, finish, 16 + i % 5

    async def main() -> list[tuple[int, int, str, int]]:
        client = aclient_factory()
        try:
            return await asyncio.gather(*(one(client, i) for i in range(32)))
        finally:
            await client.close()

    results = asyncio.run(main())
    assert len(results) == 32
    for streamed, reported, finish, limit in results:
        assert streamed == reported  # one logprob entry per generated token
        assert finish in ("stop", "length")
        assert reported <= limit
        if finish == "length":
            assert reported == limit


def test_repeated_long_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": LONG_PROMPT}, {"role": "user", "content": "sum?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert first.usage.prompt_tokens > 64
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    assert cached <= second.usage.prompt_tokens
    assert cached >= first.usage.prompt_tokens // 2


def _wait_idle(server: Server, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        cache = server_info(server)["cache"]
        if cache["running"] == 0 and cache["waiting"] == 0 and cache["device_pages_active"] == 0:
            return cache
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not idle: {cache}")
        time.sleep(0.1)


def test_client_disconnect_frees_pages(server: Server) -> None:
    _wait_idle(server)
    body = {
        "model": MODEL, "prompt": "disconnect me", "max_tokens": 900, "stream": True,
        "ignore_eos": True,
    }  # fmt: skip
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            # Keep the line iterator alive: dropping it would close the connection early.
            lines = resp.iter_lines()
            events = [ln for ln in itertools.islice(lines, 6) if ln.startswith("data: ")]
            assert len(events) == 3 and "[DONE]" not in events[-1]
            busy = server_info(server)["cache"]
            assert busy["running"] == 1, busy
            assert busy["device_pages_active"] > 0
    # The connection is closed mid-stream: the engine aborts the request and frees its pages.
    idle = _wait_idle(server)
    assert idle["device_pages_free"] + idle["device_pages_cached"] >= idle["device_pages_total"] - 1
    text = httpx.get(f"{server.url}/metrics").text
    assert metric(text, "tokenspeed:request_success_total", finished_reason="abort") >= 1


def test_non_streaming_disconnect_aborts(server: Server) -> None:
    _wait_idle(server)
    body = {"model": MODEL, "prompt": "hang up on me", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=1.0)
    _wait_idle(server)


def test_abort_request_endpoint(server: Server) -> None:
    _wait_idle(server)
    body = {"model": MODEL, "prompt": "abort me", "max_tokens": 900, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body) as resp:
            lines = resp.iter_lines()
            first = json.loads(next(ln for ln in lines if ln.startswith("data: "))[6:])
            r = httpx.post(f"{server.url}/abort_request", json={"rid": first["id"]})
            assert r.status_code == 200 and r.json()["aborted_sequences"] == 1
            events = [ln[6:] for ln in lines if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
    _wait_idle(server)
    r = httpx.post(f"{server.url}/abort_request", json={"rid": first["id"]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(f"{server.url}/abort_request", json={"nope": 1})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


# ---- tokenizer endpoints ---------------------------------------------------------------------


def test_tokenize_counts_what_generation_counts(server: Server, client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    chat = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "messages": messages})
    assert chat.status_code == 200, chat.text
    body = chat.json()
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert body["count"] == len(body["tokens"]) == r.usage.prompt_tokens
    assert body["max_model_len"] == 1024
    text = httpx.post(f"{server.url}/tokenize", json={"prompt": "Once upon a time"}).json()
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=1)
    assert text["count"] == r.usage.prompt_tokens
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": text["tokens"]})
    assert back.status_code == 200 and back.json()["prompt"].endswith("Once upon a time")
    templated = httpx.post(f"{server.url}/detokenize", json={"tokens": body["tokens"]}).json()
    assert "How many tokens is this?" in templated["prompt"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}),
        ("/tokenize", {}),
        ("/tokenize", {"model": "gpt-9", "prompt": "x"}),
        ("/detokenize", {"tokens": [1, 10**7]}),
        ("/detokenize", {"tokens": [-1]}),
        ("/detokenize", {"tokens": "abc"}),
    ],
    ids=["both-inputs", "no-input", "unknown-model", "id-out-of-vocab", "negative-id", "not-ids"],
)
def test_tokenizer_endpoints_reject_bad_bodies(server: Server, path: str, body: dict) -> None:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=10)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["message"]


# ---- errors --------------------------------------------------------------------------------

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]

BAD_REQUESTS = [
    ("max_tokens zero", CHAT, {"model": MODEL, "messages": USER, "max_tokens": 0}, 400),
    ("max_tokens negative", COMP, {"model": MODEL, "prompt": "x", "max_tokens": -5}, 400),
    ("temperature too high", CHAT, {"model": MODEL, "messages": USER, "temperature": 2.5}, 400),
    ("temperature negative", COMP, {"model": MODEL, "prompt": "x", "temperature": -1}, 400),
    ("top_p zero", COMP, {"model": MODEL, "prompt": "x", "top_p": 0}, 400),
    ("n zero", COMP, {"model": MODEL, "prompt": "x", "n": 0}, 400),
    ("beyond max_model_len", COMP, {"model": MODEL, "prompt": "x", "max_tokens": 5000}, 400),
    ("prompt too long", COMP, {"model": MODEL, "prompt": list(range(1, 1025))}, 400),
    ("no messages", CHAT, {"model": MODEL, "messages": []}, 400),
    ("message without role", CHAT, {"model": MODEL, "messages": [{"content": "x"}]}, 400),
    ("unknown role", CHAT, {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400),
    ("content not text", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400),
    (
        "tool without id",
        CHAT,
        {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
        400,
    ),
    ("messages missing", CHAT, {"model": MODEL}, 400),
    ("top_logprobs alone", CHAT, {"model": MODEL, "messages": USER, "top_logprobs": 2}, 400),
    ("stream_options alone", COMP, {"model": MODEL, "prompt": "x", "stream_options": {}}, 400),
    ("token id out of vocab", COMP, {"model": MODEL, "prompt": [1, 999999]}, 400),
    ("empty stop string", COMP, {"model": MODEL, "prompt": "x", "stop": [""]}, 400),
    (
        "logit_bias key not an id",
        COMP,
        {"model": MODEL, "prompt": "x", "logit_bias": {"a": 1}},
        400,
    ),
    ("logit_bias too large", COMP, {"model": MODEL, "prompt": "x", "logit_bias": {"1": 101}}, 400),
    (
        "logit_bias id out of vocab",
        CHAT,
        {"model": MODEL, "messages": USER, "logit_bias": {"99999": 1}},
        400,
    ),
    ("best_of", COMP, {"model": MODEL, "prompt": "x", "best_of": 3}, 400),
    ("unknown model", CHAT, {"model": "gpt-9", "messages": USER}, 404),
]


@pytest.mark.parametrize(("case", "path", "body", "status"), BAD_REQUESTS,
                         ids=[c[0] for c in BAD_REQUESTS])  # fmt: skip
def test_bad_requests_get_openai_errors(
    server: Server, case: str, path: str, body: dict, status: int
) -> None:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=10)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    assert err["type"] == "invalid_request_error"
    if status == 404:
        assert err["code"] == "model_not_found"


def test_malformed_json_is_400(server: Server) -> None:
    r = httpx.post(
        f"{server.url}{CHAT}", content=b'{"model": "x", "messages": [', timeout=10,
        headers={"content-type": "application/json"},
    )  # fmt: skip
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "JSON" in r.json()["error"]["message"]


def test_unknown_route_is_openai_shaped_404(server: Server) -> None:
    r = httpx.get(f"{server.url}/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"


def test_openai_client_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=USER)


def test_server_healthy_after_errors(server: Server, client: openai.OpenAI) -> None:
    for _, path, body, _ in BAD_REQUESTS:
        httpx.post(f"{server.url}{path}", json=body, timeout=10)
    assert httpx.get(f"{server.url}/health").status_code == 200
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")


# ---- metrics, info, stats -------------------------------------------------------------------


def test_metrics_have_vllm_names_under_tokenspeed_prefix(server: Server) -> None:
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        "tokenspeed:num_requests_running", "tokenspeed:num_requests_waiting",
        "tokenspeed:kv_cache_usage_perc", "tokenspeed:prefix_cache_queries_total",
        "tokenspeed:prefix_cache_hits_total", "tokenspeed:num_preemptions_total",
        "tokenspeed:prompt_tokens_total", "tokenspeed:generation_tokens_total",
        "tokenspeed:time_to_first_token_seconds_bucket",
        "tokenspeed:inter_token_latency_seconds_bucket",
        "tokenspeed:e2e_request_latency_seconds_bucket",
        "tokenspeed:request_queue_time_seconds_bucket",
    ):  # fmt: skip
        assert name in text, name
    assert metric(text, "tokenspeed:prompt_tokens_total") > 0
    assert metric(text, "tokenspeed:generation_tokens_total") > 0
    assert metric(text, "tokenspeed:request_success_total", finished_reason="length") > 0
    assert metric(text, "tokenspeed:time_to_first_token_seconds_count") > 0
    assert metric(text, "tokenspeed:prefix_cache_queries_total") >= metric(
        text, "tokenspeed:prefix_cache_hits_total"
    )


def test_server_info(server: Server) -> None:
    info = server_info(server)
    assert info["model"] == MODEL
    assert info["server_args"]["max_total_tokens"] == 4096
    kv = info["kv_capacity"]
    assert kv["device_tokens"] == kv["device_pages"] * kv["page_size"]
    assert kv["device_pages"] == info["cache"]["device_pages_total"]
    assert info["max_model_len"] == 1024
    json.dumps(info["kernels"])


def test_request_stats_are_logged(server: Server) -> None:
    lines = [ln for ln in server.log().splitlines() if "prompt_tokens=" in ln]
    assert lines
    for key in ("cache_tokens", "output_tokens", "cache_hit_rate", "queue_ms", "prefill_ms",
                "ttft_ms", "total_ms", "preempt_ms", "preempt_count", "decode_tps"):  # fmt: skip
        assert f"{key}=" in lines[-1]


# ---- parity with the offline API ------------------------------------------------------------


def test_greedy_output_equals_offline_llm(client: openai.OpenAI) -> None:
    from tokenspeed.runtime import LLM, SamplingParams

    prompts = ["Parity check one: the river", "Parity two, a longer prompt about the sea and"]
    messages = [{"role": "user", "content": "parity chat"}]
    served = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0)
        for p in prompts
    ]
    served_chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    llm = LLM(max_total_tokens=4096, max_model_len=1024)
    params = SamplingParams(temperature=0.0, max_tokens=16)
    for p, s in zip(prompts, served, strict=True):
        [offline] = llm.generate(p, params)
        assert s.choices[0].text == offline.outputs[0].text
        assert s.choices[0].finish_reason == offline.outputs[0].finish_reason
        assert s.usage.completion_tokens == len(offline.outputs[0].token_ids)
    [offline_chat] = llm.chat(messages, params)
    assert served_chat.choices[0].message.content == offline_chat.outputs[0].text
