"""The server's pure parts, without a server: detokenisation, stop strings, request validation."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from tokenspeed.runtime.entrypoints import ipc
from tokenspeed.runtime.entrypoints.detokenizer import IncrementalDetokenizer, StopStringMatcher
from tokenspeed.runtime.entrypoints.http_server import engine_params
from tokenspeed.runtime.entrypoints.metrics import ServerMetrics
from tokenspeed.runtime.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    validation_message,
)
from tokenspeed.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    from tokenspeed.runtime.model_source import resolve_model_path
    from tokenspeed.runtime.tokenizer import Tokenizer

    return Tokenizer.from_dir(resolve_model_path(None))


# ---- detokenisation ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_incremental_detokenisation_equals_full_decode(tokenizer, seed: int) -> None:
    """Deltas (one or several tokens at a time) concatenate to the decode of the whole output."""
    rng = np.random.default_rng(seed)
    prompt = tokenizer.encode("Some prompt text, with punctuation: é and 漢字.")
    text = "A reply that includes unicode: naïve café, 日本語, emoji 🎉, and more words. " * 3
    out = tokenizer.encode(text, add_special_tokens=False)
    if seed % 2:  # random ids too: byte tokens that do not form valid UTF-8 on their own
        out = out + rng.integers(0, tokenizer.vocab_size, size=40).tolist()
    detok = IncrementalDetokenizer(tokenizer, prompt)
    pieces, i = [], 0
    while i < len(out):
        step = int(rng.integers(1, 4))
        pieces.append(detok.push(out[i : i + step]))
        i += step
    pieces.append(detok.flush())
    full = tokenizer.decode(prompt + out)
    assert "".join(pieces) == full[len(tokenizer.decode(prompt)) :]


def test_detokeniser_holds_incomplete_characters(tokenizer) -> None:
    ids = tokenizer.encode("🎉", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    if len(ids) > 1:
        assert detok.push(ids[:1]) == ""
    assert detok.push(ids[1:]) + detok.flush() == "🎉"


# ---- stop strings --------------------------------------------------------------------------


def run_matcher(stops: list[str], deltas: list[str]) -> tuple[list[str], bool]:
    m = StopStringMatcher(stops)
    out, hit = [], False
    for d in deltas:
        text, hit = m.push(d)
        out.append(text)
        if hit:
            break
    if not hit:
        out.append(m.flush())
    return out, hit


def test_included_stop_string_is_released_with_the_text() -> None:
    """vLLM's include_stop_str_in_output: the text ends with the stop string found first (the
    earliest; at the same place, the one listed first), even across deltas."""
    for stops, want in ((["END", "E"], "abc END"), (["E", "END"], "abc E")):
        m = StopStringMatcher(stops, include=True)
        assert "".join(m.push(t)[0] for t in ["abc ", "END", " more"]) == want
    m = StopStringMatcher(["xyz"], include=True)
    assert m.push("ab xy") == ("ab ", False)
    assert m.push("z!") == ("xyz", True)


def test_stop_string_split_across_deltas_is_never_emitted() -> None:
    out, hit = run_matcher(["STOP"], ["abc S", "T", "O", "P tail"])
    assert hit
    assert "".join(out) == "abc "
    assert out[0] == "abc "  # "S" is held back: it may start the stop string


def test_held_back_text_is_released_when_it_is_not_a_stop() -> None:
    out, hit = run_matcher(["STOP"], ["abc S", "TAR"])
    assert not hit
    assert out == ["abc ", "STAR", ""]


def test_earliest_of_several_stops_wins_and_end_releases_the_rest() -> None:
    out, hit = run_matcher(["xyz", "b"], ["aaxy", "zb"])
    assert hit and "".join(out) == "aa"
    out, hit = run_matcher(["xyz"], ["aaxy"])
    assert not hit and "".join(out) == "aaxy"


def test_stop_at_the_very_start() -> None:
    out, hit = run_matcher(["\n"], ["\nrest"])
    assert hit and "".join(out) == ""


def test_no_stops_passes_text_through() -> None:
    m = StopStringMatcher([])
    assert m.push("anything") == ("anything", False)


# ---- request validation -------------------------------------------------------------------


def test_chat_request_defaults_and_limits() -> None:
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    assert req.output_limit is None and req.num_logprobs is None and req.n == 1
    req = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                           {"type": "text", "text": "b"}]}],
        max_tokens=5, max_completion_tokens=7, logprobs=True, top_logprobs=2, stop="x",
    )  # fmt: skip
    assert req.output_limit == 7
    assert req.num_logprobs == 2
    assert req.stop == ["x"]
    assert req.messages[0].for_template() == {"role": "user", "content": "ab"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 2.1}, "temperature"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": []}, "messages"),
    ],
)
def test_invalid_chat_fields_name_the_parameter(body: dict, param: str) -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest(model="m", **body)
    message, got = validation_message(info.value.errors())
    assert got == param
    assert param.split(".")[0] in message


def test_completion_prompt_forms() -> None:
    assert CompletionRequest(prompt="a").prompts() == ["a"]
    assert CompletionRequest(prompt=[1, 2]).prompts() == [[1, 2]]
    assert CompletionRequest(prompt=["a", "b"]).prompts() == ["a", "b"]
    assert CompletionRequest(prompt=[[1], [2, 3]]).prompts() == [[1], [2, 3]]
    with pytest.raises(ValidationError):
        CompletionRequest(prompt=[])
    with pytest.raises(ValidationError):
        CompletionRequest(prompt=[-1])
    with pytest.raises(ValidationError):
        CompletionRequest(prompt="a", suffix="b")


def test_engine_params_build_runtime_sampling_params() -> None:
    req = CompletionRequest(
        prompt="x", temperature=0, top_k=-1, min_tokens=3, stop_token_ids=[5], ignore_eos=True,
        seed=11, presence_penalty=0.5, repetition_penalty=1.1, stop=["zz"],
    )  # fmt: skip
    params = engine_params(req, max_tokens=20, logprobs=2)
    assert "stop" not in params  # stop strings are matched in the server
    sp = SamplingParams(**params)
    assert sp.greedy and sp.max_tokens == 20 and sp.min_tokens == 3 and sp.top_k == 0
    assert sp.stop_token_ids == [5] and sp.ignore_eos and sp.seed == 11 and sp.logprobs == 2
    assert sp.presence_penalty == 0.5 and sp.repetition_penalty == pytest.approx(1.1)
    # min_tokens never exceeds the output budget.
    assert engine_params(req, max_tokens=2, logprobs=None)["min_tokens"] == 2


# ---- wire and metrics ----------------------------------------------------------------------


def test_ipc_messages_round_trip() -> None:
    msg = {"type": ipc.OUTPUTS, "rids": ["b"], "tokens": [4], "block_rids": ["c"],
           "blocks": [[5, 6]], "items": [{"rid": "a", "ids": [1, 2], "top": [[[3, -0.5]]]}]}  # fmt: skip
    assert ipc.unpack(ipc.pack(msg)) == msg


def test_step_outputs_carry_the_columns_and_an_item_per_other_update() -> None:
    """Decoding requests' single tokens travel as two columns, verified blocks as two more;
    anything else a request has to report (its first token's cache hit, logprobs, the end,
    an error) travels as its own item."""
    from types import SimpleNamespace

    from tokenspeed.runtime.engine.request import RequestStats, RequestUpdate, StepUpdates
    from tokenspeed.runtime.entrypoints.engine_core import EngineCore, LiveCounters

    core = EngineCore.__new__(EngineCore)  # the wire format only: no model, no sockets
    core._top_k = {"lp": 1}
    core.live = LiveCounters()
    core.loop = SimpleNamespace(requests={})
    stats = RequestStats(prompt_tokens=3, output_tokens=2)
    out = core.outputs(StepUpdates(["a", "b"], [5, 7], [
        RequestUpdate("first", [6], cached_tokens=16),
        RequestUpdate("spec", [8, 9]),
        RequestUpdate("lp", [10], new_logprobs=[{10: -0.25, 11: -2.0}]),
        RequestUpdate("done", [12], finished=True, finish_reason="length", stats=stats),
        RequestUpdate("bad", [], finished=True, finish_reason="abort", error="no grammar"),
    ], block_rids=["c"], blocks=[[13, 14, 15]]))  # fmt: skip
    assert (out["rids"], out["tokens"]) == (["a", "b"], [5, 7])
    assert (out["block_rids"], out["blocks"]) == (["c"], [[13, 14, 15]])
    items = {item["rid"]: item for item in out["items"]}
    assert list(items) == ["first", "spec", "lp", "done", "bad"]
    assert items["first"] == {"rid": "first", "ids": [6], "cached_tokens": 16}
    assert items["spec"] == {"rid": "spec", "ids": [8, 9]}
    assert items["lp"]["logprobs"] == [-0.25] and items["lp"]["top"] == [[(10, -0.25)]]
    assert items["done"]["finish"] == "length" and items["done"]["stats"]["output_tokens"] == 2
    assert items["bad"] == {"rid": "bad", "error": "no grammar"}
    assert core.live.generation_tokens == 10  # a, b; c (three); first, spec (two), lp, done
    assert ipc.unpack(ipc.pack({"type": ipc.OUTPUTS, **out}))["blocks"] == [[13, 14, 15]]


def test_metrics_expose_engine_snapshot_and_server_observations() -> None:
    m = ServerMetrics("tiny")
    m.engine.snapshot = {"running": 3, "waiting": 2, "kv_cache_usage": 0.25,
                         "prefix_cache_queried_tokens": 100, "prefix_cache_hit_tokens": 40,
                         "num_preemptions": 1}  # fmt: skip
    m.ttft.observe(0.01)
    m.observe_finished("length", 10, 5, 0.5, {"queue_ms": 2.0, "prefill_ms": 3.0,
                                              "ttft_ms": 5.0, "total_ms": 50.0})  # fmt: skip
    text = m.render().decode()
    assert 'tokenspeed:num_requests_running{model_name="tiny"} 3.0' in text
    assert 'tokenspeed:kv_cache_usage_perc{model_name="tiny"} 0.25' in text
    assert 'tokenspeed:prefix_cache_hits_total{model_name="tiny"} 40.0' in text
    assert 'tokenspeed:num_preemptions_total{model_name="tiny"} 1.0' in text
    assert 'tokenspeed:prompt_tokens_total{model_name="tiny"} 10.0' in text
    assert 'tokenspeed:generation_tokens_total{model_name="tiny"} 5.0' in text
    assert (
        'tokenspeed:request_success_total{finished_reason="length",model_name="tiny"} 1.0' in text
    )
    assert 'tokenspeed:request_queue_time_seconds_count{model_name="tiny"} 1.0' in text
    assert 'tokenspeed:time_to_first_token_seconds_count{model_name="tiny"} 1.0' in text


# ---- forced tool calls (tool_choice) --------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop"}},
]  # fmt: skip


def test_named_tool_choice_forces_the_functions_arguments() -> None:
    import json

    from tokenspeed.runtime.entrypoints.tool_choice import forced_message, forced_tools

    forced = forced_tools(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert forced is not None and forced.name == "get_weather"
    assert json.loads(forced.spec.value) == TOOLS[0]["function"]["parameters"]
    message, finish = forced_message(forced, '{"city": "Paris"}', "stop")
    assert finish == "stop" and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call["type"] == "function" and call["id"].startswith("call_")
    _, finish = forced_message(forced, '{"ci', "length")
    assert finish == "length"  # cut short: the partial arguments, and the real reason
    noop = forced_tools(TOOLS, {"type": "function", "function": {"name": "noop"}})
    assert noop is not None and json.loads(noop.spec.value) == {"type": "object"}


def test_required_tool_choice_is_an_array_of_calls() -> None:
    import json

    from tokenspeed.runtime.entrypoints.tool_choice import (
        forced_message,
        forced_tools,
        message_delta,
    )

    forced = forced_tools(TOOLS, "required")
    assert forced is not None and forced.name is None
    schema = json.loads(forced.spec.value)
    assert schema["type"] == "array" and schema["minItems"] == 1
    names = [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]]
    assert names == ["get_weather", "noop"]
    text = '[{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "noop", "parameters": {}}]'
    message, finish = forced_message(forced, text, "stop")
    assert finish == "tool_calls"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "noop"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Rome"}
    delta = message_delta(message)
    assert [c["index"] for c in delta["tool_calls"]] == [0, 1] and delta["content"] is None
    assert "maxItems" not in schema
    one = forced_tools(TOOLS, "required", parallel=False)
    assert one is not None and json.loads(one.spec.value)["maxItems"] == 1
    cut, finish = forced_message(forced, '[{"name": "ge', "length")
    assert cut == {"role": "assistant", "content": '[{"name": "ge'} and finish == "length"


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        (None, "required", "at least one tool"),
        (TOOLS, {"type": "function", "function": {"name": "missing"}}, "not among the tools"),
        (TOOLS, "sometimes", "tool_choice must be"),
        ([{"type": "retrieval"}], "required", "not a function tool"),
        ([{"type": "function", "function": {}}], "required", "needs a name"),
    ],
)
def test_tool_choices_that_cannot_be_honoured(tools, choice, message) -> None:
    from tokenspeed.runtime.entrypoints.tool_choice import ToolChoiceError, forced_tools

    with pytest.raises(ToolChoiceError, match=message):
        forced_tools(tools, choice)
    assert forced_tools(TOOLS, "none") is None and forced_tools(TOOLS, None) is None
    assert forced_tools(TOOLS, "auto") is None  # the server's tool-call parser, if any
