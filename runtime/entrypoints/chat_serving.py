"""Chat over the engine: the prompt from the chat template, the server's reasoning and
tool-call parsers, and the answer whole or as chunks. `/v1/chat/completions` sends it as
OpenAI's chat objects; `/v1/responses` (responses.py) turns the same into Responses items."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from tokenspeed.runtime.entrypoints.async_llm import GenerationRequest, SequenceDelta
from tokenspeed.runtime.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    OpenAIError,
    new_id,
    now,
    usage_dict,
)
from tokenspeed.runtime.entrypoints.serving_common import (
    ServerState,
    collect,
    collect_or_abort,
    engine_params,
    merge_deltas,
)
from tokenspeed.runtime.entrypoints.tool_choice import ForcedTools, forced_message, message_delta
from tokenspeed.runtime.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from tokenspeed.runtime.parsers.chat import ChatOutputParser
from tokenspeed.runtime.parsers.tool_calls import tool_call


@dataclass
class ChatRun:
    """One chat request submitted to the engine."""

    body: ChatCompletionRequest
    gen: GenerationRequest
    rid: str
    created: int
    stream: AsyncIterator[SequenceDelta]


class ChatServing:
    """What the server does with a chat request, shared by the chat and Responses routes."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.reasoning_parser = REASONING_PARSERS.get(state.args.reasoning_parser or "")
        self.tool_parser = TOOL_CALL_PARSERS.get(state.args.tool_call_parser or "")

    # ---- what the server's parsers do for a request -------------------------------------
    def thinks(self, body: ChatCompletionRequest) -> bool:
        """Whether the server's thinking model thinks for this request (hybrid models switch
        it with a chat-template argument)."""
        parser = self.reasoning_parser
        return parser is not None and parser.thinks(body.chat_template_kwargs)

    def parses_tools(self, body: ChatCompletionRequest) -> bool:
        """Tools are offered and the model may choose (`tool_choice` absent or "auto")."""
        return (
            self.tool_parser is not None
            and bool(body.tools)
            and body.tool_choice in (None, "auto")
            and body.forced_tools is None
        )

    def output_parser(self, body: ChatCompletionRequest) -> ChatOutputParser | None:
        """One choice's parser, where the server has parsers this request uses: reasoning
        (unless the request turned thinking off), and tool calls (``parses_tools``). A forced
        tool call splits off reasoning itself (``forced_answer``)."""
        if body.forced_tools is not None or not (self.thinks(body) or self.parses_tools(body)):
            return None
        return ChatOutputParser(
            self.reasoning_parser() if self.reasoning_parser and self.thinks(body) else None,
            self.tool_parser() if self.tool_parser and self.parses_tools(body) else None,
        )

    def forced_answer(
        self, body: ChatCompletionRequest, forced: ForcedTools, text: str, finish: str
    ) -> tuple[dict[str, Any], str]:
        """A forced call's message; a thinking model's block (before the grammar took hold)
        becomes `reasoning_content`."""
        if self.reasoning_parser is None or not self.thinks(body):
            return forced_message(forced, text, finish)
        reasoning, answer = self.reasoning_parser.split(text)
        message, finish = forced_message(forced, answer or "", finish)
        return {**message, "reasoning_content": reasoning}, finish

    # ---- running a request ----------------------------------------------------------------
    def start(self, body: ChatCompletionRequest, rid_prefix: str = "chatcmpl") -> ChatRun:
        """Render the prompt and submit the request; raises `OpenAIError` for what the
        request asks that this server cannot do."""
        state, llm = self.state, self.state.llm
        if body.tool_choice == "auto" and self.tool_parser is None:
            raise OpenAIError(
                'tool_choice "auto" needs a tool-call parser (--tool-call-parser); this server '
                'has none. Use "required" or a named function to get tool_calls',
                param="tool_choice",
            )
        messages = [m.for_template() for m in body.messages]
        kwargs = dict(body.chat_template_kwargs or {})
        try:
            prompt_ids = state.tokenizer.encode_chat(
                messages, add_generation_prompt=body.add_generation_prompt, tools=body.tools,
                **kwargs,
            )  # fmt: skip
        except Exception as e:  # a template that rejects these messages is the client's error
            raise OpenAIError(f"could not apply the chat template: {e}", param="messages") from None
        max_tokens = llm.check_length(len(prompt_ids), body.output_limit, "max_completion_tokens"
                                      if body.max_completion_tokens else "max_tokens")  # fmt: skip
        params = engine_params(body, max_tokens, body.num_logprobs)
        params["thinking"] = self.thinks(body)  # a grammar holds the answer after the thinking
        # a tool-call parser whose tags are special tokens (DeepSeek, Kimi) must see them
        tool_parser = self.tool_parser
        needs_tags = self.parses_tools(body) and bool(
            tool_parser and tool_parser.needs_special_tokens
        )
        gen = GenerationRequest(
            prompt_ids=prompt_ids,
            params=params,
            stop=list(body.stop or []),
            include_stop=body.include_stop_str_in_output,
            n=body.n,
            skip_special_tokens=body.skip_special_tokens and not needs_tags,
        )
        rid = new_id(rid_prefix)
        return ChatRun(body, gen, rid, now(), llm.generate(gen, rid))

    async def complete(self, run: ChatRun, request: Request) -> dict[str, Any] | None:
        """The whole `chat.completion` object; None if the client left first (aborted)."""
        body = run.body
        result = await collect_or_abort(request, collect(run.stream, body.n))
        if result is None:
            return None
        forced = body.forced_tools
        choices = []
        for i in range(body.n):
            message: dict[str, Any] = {"role": "assistant", "content": result.text[i]}
            finish = result.finish[i]
            parser = self.output_parser(body)
            if forced is not None:  # the output is the call's JSON: answer with tool_calls
                message, finish = self.forced_answer(body, forced, result.text[i], finish)
            elif parser is not None:  # reasoning and/or the model's own tool calls
                message, finish = parser.message(result.text[i], finish)
            lp = None
            if body.logprobs:
                lp = self.logprobs(result.ids[i], result.lp[i], result.top[i])
            choices.append(
                {"index": i, "message": message, "logprobs": lp, "finish_reason": finish}
            )
        return {
            "id": run.rid, "object": "chat.completion", "created": run.created,
            "model": self.state.model_name, "choices": choices,
            "usage": usage_dict(len(run.gen.prompt_ids), sum(result.tokens), result.cached[0]),
        }  # fmt: skip

    def logprobs(
        self, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]
    ) -> dict[str, Any]:
        """A choice's `logprobs` object (chat form)."""

        def entry(t: int, lp: float) -> dict[str, Any]:
            s = self.state.token_text(t)
            return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

        content = []
        for t, lp, top in zip(ids, lps, tops, strict=False):
            e = entry(t, lp)
            e["top_logprobs"] = [entry(i, v) for i, v in top]
            content.append(e)
        return {"content": content, "refusal": None}

    async def chunks(self, run: ChatRun) -> AsyncIterator[dict[str, Any]]:
        """The `chat.completion.chunk` objects of a streamed answer, the usage chunk last
        (when asked for)."""
        body, gen = run.body, run.gen
        base = {"id": run.rid, "object": "chat.completion.chunk", "created": run.created,
                "model": self.state.model_name}  # fmt: skip
        tokens = [0] * body.n
        cached = 0

        def usage() -> dict[str, Any]:  # the usage field of a content chunk
            if body.continuous_usage:
                return {"usage": usage_dict(len(gen.prompt_ids), sum(tokens), cached)}
            return {"usage": None} if body.include_usage else {}

        forced = body.forced_tools
        held = [""] * body.n  # "required": the calls are parsed once the output is complete
        parsers = [self.output_parser(body) for _ in range(body.n)]
        # a forced call from a thinking model: its thinking block first, then the call
        reasoning = self.reasoning_parser if forced and self.thinks(body) else None
        thinkers = [reasoning() if reasoning else None for _ in range(body.n)]
        for i in range(body.n):
            first: dict[str, Any] = {"role": "assistant", "content": ""}
            if forced is not None and forced.name is not None:  # arguments stream after this
                call = tool_call(forced.name, "")
                first = {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **call}]}
            choice = {"index": i, "delta": first, "logprobs": None, "finish_reason": None}
            yield {**base, "choices": [choice], **usage()}
        async for d in run.stream:
            tokens[d.index] = d.completion_tokens
            cached = d.cached_tokens if d.index == 0 else cached
            if not d.text and d.finish_reason is None and not body.logprobs:
                continue  # tokens that end mid-character: nothing to show yet
            delta: dict[str, Any] = {"content": d.text} if d.text or d.finish_reason is None else {}
            finish = d.finish_reason
            if forced is not None:
                thought, text = "", d.text
                if (thinker := thinkers[d.index]) is not None:  # its block, then the call
                    thought, text = thinker.push(text)
                    if finish is not None:
                        more_thought, more_text = thinker.flush()
                        thought, text = thought + more_thought, text + more_text
                if forced.name is not None:  # the arguments stream as they come
                    arguments = {"index": 0, "function": {"arguments": text}}
                    delta = {"tool_calls": [arguments]} if text else {}
                    finish = forced.finish_reason if finish == "stop" else finish
                else:  # "required": held back, sent whole once complete
                    held[d.index] += text
                    delta = {}
                    if finish is not None:
                        message, finish = forced_message(forced, held[d.index], finish)
                        delta = message_delta(message)
                if thought:
                    delta = {"reasoning_content": thought, **delta}
                if not delta and finish is None and not body.logprobs:
                    continue
            elif (parser := parsers[d.index]) is not None:
                delta = parser.push(d.text)
                if finish is not None:
                    delta = merge_deltas(delta, parser.finish())
                    finish = parser.finish_reason(finish)
                elif not delta and not body.logprobs:
                    continue  # held back (a tag may be starting)
            lp = None
            if body.logprobs:
                lp = self.logprobs(d.token_ids, d.logprobs or [], d.top_logprobs or [])
            choice = {"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            yield {**base, "choices": [choice], **usage()}
        if body.include_usage:
            yield {**base, "choices": [], "usage": usage_dict(len(gen.prompt_ids), sum(tokens),
                                                              cached)}  # fmt: skip
