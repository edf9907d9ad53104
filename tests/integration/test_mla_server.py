"""The real server over an MLA model: DeepSeek-V3's architecture with an FP8 latent cache.

The other integration modules serve the embedded tiny Qwen3 model; this one starts `tokenspeed
serve deepseek-v3 --load-format dummy` shrunk by `--hf-overrides` (MLA attention with q and kv
LoRA, yarn RoPE, grouped sigmoid routing, a shared expert, MTP weights held) with
`--kv-cache-dtype fp8_e4m3` and the tiny model's tokenizer, and talks to it with the official
`openai` client. Expected texts come from the offline `LLM` with the same arguments.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from serving_helpers import Server, scheduler_built, start_server

pytestmark = pytest.mark.timeout(300)

MODEL = "deepseek-v3"
# A two-layer V3 (one dense layer, one MoE layer) over the tiny tokenizer's 1024 ids.
SMALL = {
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "n_routed_experts": 16,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
}
LONG_PROMPT = " ".join(f"entry {i} holds the value {i * 5 % 11}." for i in range(30))


def _tokenizer_dir() -> str:
    from tokenspeed.runtime.tiny_model import ensure_tiny_model

    return str(ensure_tiny_model())


def _engine_args() -> dict[str, object]:
    """What the server is started with, as the offline `LLM` takes it."""
    return dict(
        load_format="dummy",
        hf_overrides=SMALL,
        tokenizer=_tokenizer_dir(),
        device="cpu",
        dtype="float32",
        kv_cache_dtype="fp8_e4m3",
        max_total_tokens=2048,
        max_model_len=512,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not scheduler_built():
        pytest.skip("the C++ scheduler (tokenspeed.scheduler.Scheduler) is not built")
    flags = [MODEL]
    for name, value in _engine_args().items():  # the offline arguments, spelled as flags
        flags += [
            f"--{name.replace('_', '-')}",
            json.dumps(value) if isinstance(value, dict) else str(value),
        ]
    srv = start_server(tmp_path_factory.mktemp("serve-mla"), *flags)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _cache(server: Server) -> dict:
    r = httpx.get(f"{server.url}/get_server_info", timeout=10)
    assert r.status_code == 200
    return r.json()["cache"]


def _wait_idle(server: Server, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        cache = _cache(server)
        if cache["running"] == 0 and cache["waiting"] == 0 and cache["device_pages_active"] == 0:
            return cache
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not idle: {cache}")
        time.sleep(0.1)


def test_greedy_output_equals_offline_llm(client: openai.OpenAI) -> None:
    """The served MLA model (FP8 latent cache, absorbed decode) is the offline engine's."""
    from tokenspeed.runtime import LLM, SamplingParams

    prompts = ["the latent cache holds", "one vector per token per layer, and"]
    messages = [{"role": "user", "content": "explain MLA"}]
    served = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0, logprobs=1)
        for p in prompts
    ]
    served_chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0
    )
    llm = LLM(MODEL, **_engine_args())
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=1)
    for p, s in zip(prompts, served, strict=True):
        [offline] = llm.generate(p, params)
        got = offline.outputs[0]
        assert s.usage.completion_tokens == len(got.token_ids) == 12
        assert s.choices[0].text == got.text
        # a float32 latent cache would move these by ~4e-4: the FP8 cache is the one in use
        want = [lp[t] for lp, t in zip(got.logprobs, got.token_ids, strict=True)]
        assert s.choices[0].logprobs.token_logprobs == pytest.approx(want, abs=1e-5)
    [offline_chat] = llm.chat(messages, params)
    assert served_chat.choices[0].message.content == offline_chat.outputs[0].text
    assert served[0].choices[0].text  # the tokenizer's ids: the dummy model writes real text


def test_prefix_hit_reuses_latent_pages(client: openai.OpenAI) -> None:
    """A repeated long prompt is served from the prefix cache and decodes the same tokens."""
    first = client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=8, temperature=0)
    second = client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens > 64
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens // 2 <= cached < second.usage.prompt_tokens
    assert second.choices[0].text == first.choices[0].text


def test_stream_equals_whole_response(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="stream it", max_tokens=10, temperature=0)
    chunks = client.completions.create(
        model=MODEL, prompt="stream it", max_tokens=10, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_concurrent_requests_complete_and_free_their_pages(
    server: Server, client: openai.OpenAI
) -> None:
    """Sixteen requests of different lengths batched together each get their tokens; the
    latent pages are all returned (free or held by the prefix cache) afterwards."""

    def one(i: int) -> int:
        r = client.completions.create(
            model=MODEL, prompt=f"request {i} " * (i + 1), max_tokens=6 + i, temperature=0.8,
            seed=i, extra_body={"ignore_eos": True},
        )  # fmt: skip
        return r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert list(pool.map(one, range(16))) == [6 + i for i in range(16)]
    idle = _wait_idle(server)
    assert idle["device_pages_free"] + idle["device_pages_cached"] >= idle["device_pages_total"] - 1


def test_bad_request_gets_an_error_and_the_server_keeps_serving(
    server: Server, client: openai.OpenAI
) -> None:
    body = {"model": MODEL, "prompt": "x " * 600, "max_tokens": 4}  # past max_model_len 512
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    after = client.completions.create(model=MODEL, prompt="still here", max_tokens=3)
    assert after.usage.completion_tokens == 3
