"""`tokenspeed serve --speculative-algorithm NGRAM`: the server answers exactly what the
offline engine without speculation answers, streamed or whole, and reports its drafts."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from serving_helpers import MODEL, Server, scheduler_built

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not scheduler_built(), reason="the C++ scheduler is not built"),
]

PROMPT = "one two three four one two three four one two three four one two"


SERVER_FLAGS = (
    "--max-total-tokens", "4096", "--max-model-len", "1024",
    "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4",
    "--enable-log-request-stats",
)  # fmt: skip


def test_answers_equal_plain_decoding(client: openai.OpenAI, server: Server) -> None:
    from tokenspeed.runtime import LLM, SamplingParams

    plain = LLM(None, device="cpu", max_total_tokens=4096)
    for seed, temperature in ((None, 0.0), (9, 1.0)):
        want = plain.generate(PROMPT, SamplingParams(temperature=temperature, max_tokens=48,
                                                     seed=seed))[0].outputs[0]  # fmt: skip
        kw = {"model": MODEL, "prompt": PROMPT, "max_tokens": 48, "temperature": temperature,
              "seed": seed}  # fmt: skip
        whole = client.completions.create(**kw)
        assert whole.choices[0].text == want.text
        assert whole.usage.completion_tokens == len(want.token_ids)
        streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
        assert streamed == want.text
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    values = {line.split("{")[0]: float(line.split()[-1]) for line in metrics.splitlines()
              if line.startswith("tokenspeed:spec_decode_num_")}  # fmt: skip
    drafts, tokens = values["tokenspeed:spec_decode_num_drafts_total"], values[
        "tokenspeed:spec_decode_num_draft_tokens_total"]  # fmt: skip
    assert 0 < drafts <= tokens <= 3 * drafts  # up to three drafts a block
    assert 0 < values["tokenspeed:spec_decode_num_accepted_tokens_total"] <= tokens
    # each request's stats line: tokens per decode step, and the share of drafts kept
    lines = [ln for ln in server.log().splitlines() if "acc_len=" in ln]
    acc = [dict(re.findall(r"(\w+)=([\d.]+)", ln)) for ln in lines]
    assert acc and max(float(a["acc_len"]) for a in acc) > 1.0
    assert all(0.0 <= float(a["acc_rate"]) <= 1.0 for a in acc)
