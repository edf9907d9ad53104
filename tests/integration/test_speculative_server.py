"""`tokenspeed serve --speculative-algorithm NGRAM`: the server answers exactly what the
offline engine without speculation answers, streamed or whole, and reports its drafts."""

from __future__ import annotations

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
    drafted = [line for line in metrics.splitlines()
               if line.startswith("tokenspeed:spec_decode_num_accepted_tokens")]  # fmt: skip
    assert drafted and float(drafted[0].split()[-1]) > 0
