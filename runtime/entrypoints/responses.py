"""The OpenAI Responses API (`/v1/responses`), answered through the chat path.

A Responses request becomes a chat request: `instructions` the system message, `input` the
conversation (text messages, the assistant's earlier function calls and their outputs), flat
function `tools` the chat tools, `text.format` the response format, `max_output_tokens` the
limit. The chat answer's reasoning, text and tool calls come back as output items (`reasoning`,
`message`, `function_call`), whole or as Responses' typed stream events. A response is kept in
memory (`store`, the default; the last `ResponseStore.CAPACITY`) so that `previous_response_id`
can continue it, `GET /v1/responses/{id}` can return it and `GET .../input_items` can list
its input. What the API offers that this
server cannot do (built-in tools, background runs, truncation, logprobs) is a 400.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, ValidationError, field_validator, model_validator

from tokenspeed.runtime.entrypoints.async_llm import RequestFailed
from tokenspeed.runtime.entrypoints.chat_serving import ChatRun, ChatServing
from tokenspeed.runtime.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    OpenAIError,
    RequestFieldError,
    RequestModel,
    now,
    validation_message,
)
from tokenspeed.runtime.entrypoints.serving_common import ServerState, sse_response

router = APIRouter()


# ---- the request --------------------------------------------------------------------------


class TextPart(RequestModel):
    """A text part of an input message (input_text; output_text in earlier answers)."""

    type: Literal["input_text", "output_text", "text"]
    text: str


class InputMessage(RequestModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]

    def text(self) -> str:
        return (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )


class FunctionCallItem(RequestModel):
    """A call the model made earlier (sent back with its output)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutput(RequestModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningInput(RequestModel):
    """Earlier reasoning sent back; chat templates drop past thinking, so it is not rendered."""

    type: Literal["reasoning"]


_ITEMS: dict[str, type[RequestModel]] = {
    "message": InputMessage,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutput,
    "reasoning": ReasoningInput,
}


class TextFormat(RequestModel):
    """`text.format`: plain text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _check_schema(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise RequestFieldError("text.format of type json_schema needs schema")
        return self


class TextConfig(RequestModel):
    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(RequestModel):
    """POST /v1/responses. Extras beyond OpenAI's API (`top_k`, `min_p`,
    `repetition_penalty`, `seed`, `logit_bias`, `structured_outputs`, `chat_template_kwargs`)
    follow vLLM's names and mean what they mean on the chat route."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    text: TextConfig = Field(default_factory=TextConfig)
    reasoning: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled", "auto"] | None = None
    background: bool | None = None
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None
    structured_outputs: dict[str, Any] | None = None

    @field_validator("input")
    @classmethod
    def _check_input(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(v, list):
            if not v:
                raise ValueError("input must not be empty")
            for i, item in enumerate(v):
                kind = item.get("type", "message")
                if kind not in _ITEMS:
                    raise ValueError(f"input[{i}] has type {kind!r}; this server takes "
                                     f"{', '.join(_ITEMS)} items")  # fmt: skip
        return v

    @model_validator(mode="after")
    def _check_unsupported(self) -> ResponsesRequest:
        if self.background:
            raise RequestFieldError("background responses are not supported")
        if self.truncation == "auto":
            raise RequestFieldError('truncation "auto" is not supported (use "disabled")')
        if self.top_logprobs:
            raise RequestFieldError("top_logprobs is not supported on /v1/responses")
        for i, tool in enumerate(self.tools):
            if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
                raise RequestFieldError(
                    f"tools[{i}]: only function tools with a name are supported (built-in "
                    "tools such as web search run on OpenAI's side)"
                )
        return self

    def items(self) -> list[RequestModel]:
        """The input as typed items (a string is one user message)."""
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        items = []
        for i, raw in enumerate(self.input):
            try:
                items.append(_ITEMS[raw.get("type", "message")].model_validate(raw))
            except ValidationError as e:
                message, param = validation_message(list(e.errors()))
                raise OpenAIError(f"input[{i}]: {message}", param=f"input[{i}]") from None
        return items


def input_messages(items: list[RequestModel]) -> list[dict[str, Any]]:
    """Chat messages of Responses input items: consecutive function calls become one
    assistant message's `tool_calls` (after its text, if the text came just before)."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, InputMessage):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutput):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return messages


def chat_request(
    body: ResponsesRequest, history: list[dict[str, Any]]
) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
    """The chat request a Responses request is answered with, and the conversation it
    continues (``history``, from ``previous_response_id``) plus its own input."""
    conversation = history + input_messages(body.items())
    if not conversation:
        raise OpenAIError("input has no message to answer", param="input")
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    fmt = body.text.format
    response_format: dict[str, Any] | None = None
    if fmt.type == "json_object":
        response_format = {"type": "json_object"}
    elif fmt.type == "json_schema":
        response_format = {"type": "json_schema", "json_schema": {"name": fmt.name,
                           "schema": fmt.schema_, "strict": fmt.strict}}  # fmt: skip
    # unset, tool_choice is chat's default (the tools are shown; a tool-call parser, if the
    # server has one, finds the calls), not an explicit "auto", which needs a parser
    tool_choice = body.tool_choice if "tool_choice" in body.model_fields_set else None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        tool_choice = {"type": "function", "function": {"name": tool_choice.get("name")}}
    tools = [
        {
            "type": "function",
            "function": {k: t[k] for k in ("name", "description", "parameters") if k in t},
        }  # fmt: skip
        for t in body.tools
    ]
    fields: dict[str, Any] = {
        "messages": system + conversation,
        "tools": tools or None,
        "tool_choice": tool_choice,
        "parallel_tool_calls": body.parallel_tool_calls,
        "max_completion_tokens": body.max_output_tokens,
        "response_format": response_format,
        "chat_template_kwargs": body.chat_template_kwargs,
        "stream": body.stream,
        "stream_options": {"include_usage": True} if body.stream else None,
    }
    extras = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed",
              "logit_bias", "structured_outputs")  # fmt: skip
    for name in extras:
        fields[name] = getattr(body, name)
    try:
        request = ChatCompletionRequest.model_validate(fields)
    except ValidationError as e:
        message, param = validation_message(list(e.errors()))
        raise OpenAIError(message, param=param) from None
    return request, conversation


# ---- the stored responses -----------------------------------------------------------------


def input_item_objects(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as OpenAI lists it back (`input_items`): each item with an id,
    message text as parts."""
    raw = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    out = []
    for item in raw:
        kind = item.get("type", "message")
        obj = {"id": item.get("id") or _id(_ITEM_ID_PREFIX.get(kind, "item")), **item,
               "type": kind}  # fmt: skip
        if kind == "message":
            if isinstance(obj["content"], str):
                part = "output_text" if obj["role"] == "assistant" else "input_text"
                obj["content"] = [{"type": part, "text": obj["content"]}]
            obj.setdefault("status", "completed")
        out.append(obj)
    return out


_ITEM_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
                   "reasoning": "rs"}  # fmt: skip


@dataclass(frozen=True)
class StoredResponse:
    """A stored response, the conversation it ends (chat messages, for
    `previous_response_id`) and its own input items (for `input_items`)."""

    response: dict[str, Any]
    conversation: list[dict[str, Any]]
    inputs: list[dict[str, Any]]


class ResponseStore:
    """The last responses, for `previous_response_id`, GET and `input_items`; oldest dropped
    first. Shared by the event loop's tasks; the lock only guards the dict."""

    CAPACITY = 1024

    def __init__(self) -> None:
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, stored: StoredResponse) -> None:
        with self._lock:
            self._items[stored.response["id"]] = stored
            while len(self._items) > self.CAPACITY:
                self._items.popitem(last=False)

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        """The stored response; a 404 naming ``param`` if it is not kept."""
        with self._lock:
            found = self._items.get(response_id)
        if found is None:
            raise OpenAIError(f"no stored response with id {response_id!r}", status=404,
                              type="not_found_error", param=param)  # fmt: skip
        return found

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        with self._lock:
            self._items.pop(response_id, None)


def _store(request: Request) -> ResponseStore:
    app_state = request.app.state
    if getattr(app_state, "response_store", None) is None:
        app_state.response_store = ResponseStore()
    return app_state.response_store


# ---- the answer ---------------------------------------------------------------------------


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": _id("rs"), "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": _id("msg"), "role": "assistant", "status": status,
            "content": [output_text(text)]}  # fmt: skip


def function_call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": _id("fc"), "call_id": call["id"], "status": status,
            "name": call["function"]["name"], "arguments": call["function"]["arguments"]}  # fmt: skip


def output_items(message: dict[str, Any], finish: str | None) -> list[dict[str, Any]]:
    """A chat answer's message as Responses output items: reasoning, text, calls. Output cut
    short by the token limit leaves its last item incomplete."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(message["content"]))
    items += [function_call_item(c) for c in message.get("tool_calls") or []]
    if items and finish == "length":
        items[-1]["status"] = "incomplete"
    return items


def answer_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items as the chat messages that continue the conversation."""
    return input_messages(
        [FunctionCallItem.model_validate(i) if i["type"] == "function_call" else
         InputMessage(role="assistant", content=i["content"][0]["text"])
         for i in items if i["type"] in ("message", "function_call")]
    )  # fmt: skip


class ResponseBuilder:
    """The response object of one request, from its start to its end."""

    def __init__(self, body: ResponsesRequest, state: ServerState) -> None:
        self.body, self.state = body, state
        self.id = _id("resp")
        self.created = now()

    def object(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = self.body
        fmt = body.text.format
        text_format = {"type": fmt.type}
        if fmt.type == "json_schema":
            text_format |= {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.state.model_name, "output": output, "usage": usage, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id, "reasoning": body.reasoning,
            "store": body.store, "temperature": body.temperature, "top_p": body.top_p,
            "text": {"format": text_format}, "tool_choice": body.tool_choice,
            "tools": body.tools, "truncation": body.truncation or "disabled",
            "user": body.user, "background": False,
        }  # fmt: skip

    def usage(self, chat_usage: dict[str, Any], reasoning: str) -> dict[str, Any]:
        """Responses' usage from the chat one; reasoning tokens counted from the text."""
        reasoning_tokens = 0
        if reasoning:
            reasoning_tokens = len(self.state.tokenizer.encode(reasoning, add_special_tokens=False))
        prompt, completion = chat_usage["prompt_tokens"], chat_usage["completion_tokens"]
        cached = chat_usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion)},
            "total_tokens": prompt + completion,
        }


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    state: ServerState = request.app.state.server
    chat: ChatServing = request.app.state.chat
    state.check_model(body.model)
    store = _store(request)
    previous = body.previous_response_id
    history = store.get(previous, "previous_response_id").conversation if previous else []
    chat_body, conversation = chat_request(body, history)
    run = chat.start(chat_body, rid_prefix="resp")
    builder = ResponseBuilder(body, state)
    if body.stream:
        return sse_response(_stream(builder, chat, run, store, conversation), done=False)
    result = await chat.complete(run, request)
    if result is None:
        return Response(status_code=499)
    choice = result["choices"][0]
    message, finish = choice["message"], choice["finish_reason"]
    output = output_items(message, finish)
    usage = builder.usage(result["usage"], message.get("reasoning_content") or "")
    response = builder.object("incomplete" if finish == "length" else "completed", output, usage)
    if body.store:
        inputs = input_item_objects(body)
        store.put(StoredResponse(response, conversation + answer_messages(output), inputs))
    return JSONResponse(response)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    return _store(request).get(response_id).response


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    request: Request,
    limit: int = 20,
    order: str = "desc",
    after: str | None = None,
    before: str | None = None,
) -> dict[str, Any]:
    """A stored response's input items, newest first unless ``order=asc``, ``limit`` (1 to
    100) at a time after (or before) the item ``after`` (``before``) names."""
    if not 1 <= limit <= 100:
        raise OpenAIError("limit must be between 1 and 100", param="limit")
    if order not in ("asc", "desc"):
        raise OpenAIError('order must be "asc" or "desc"', param="order")
    items = list(_store(request).get(response_id).inputs)
    if order == "desc":
        items.reverse()
    ids = [item["id"] for item in items]
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise OpenAIError(f"no input item {cursor!r} in this response", param=name)
    start = ids.index(after) + 1 if after is not None else 0
    end = ids.index(before) if before is not None else len(items)
    page = items[start:end][:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + len(page) < end,
    }


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    _store(request).delete(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


# ---- streaming ------------------------------------------------------------------------------


class _EventWriter:
    """Numbered Responses events as SSE, and the output items they build."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item receiving deltas
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its item

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def add(self, item: dict[str, Any]) -> list[str]:
        """Open ``item`` (closing the one open before)."""
        events = self.close()
        self.output.append(item)
        self.open = item
        index = len(self.output) - 1
        events.append(self.event("response.output_item.added", output_index=index, item=item))
        if item["type"] in ("message", "reasoning"):
            part = item["content"][0]
            events.append(self.event("response.content_part.added", item_id=item["id"],
                                     output_index=index, content_index=0,
                                     part={**part, "text": ""}))  # fmt: skip
        return events

    def text(self, kind: str, delta: str) -> list[str]:
        """Text for a reasoning or message item, opening one if need be."""
        item = self.open
        events: list[str] = []
        if item is None or item["type"] != kind:
            factory = reasoning_item if kind == "reasoning" else message_item
            item = factory("", "in_progress")
            events += self.add(item)
        item["content"][0]["text"] += delta
        name = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        extra = {"logprobs": []} if kind == "message" else {}
        events.append(self.event(name, item_id=item["id"], output_index=len(self.output) - 1,
                                 content_index=0, delta=delta, **extra))  # fmt: skip
        return events

    def call(self, delta: dict[str, Any]) -> list[str]:
        """A chat tool-call delta: a new call opens an item, arguments stream into it."""
        events: list[str] = []
        item = self.calls.get(delta["index"])
        if item is None:
            function = delta.get("function") or {}
            call = {"id": delta.get("id") or _id("call"),
                    "function": {"name": function.get("name", ""), "arguments": ""}}  # fmt: skip
            item = function_call_item(call, "in_progress")
            self.calls[delta["index"]] = item
            events += self.add(item)
        arguments = (delta.get("function") or {}).get("arguments") or ""
        if arguments:
            item["arguments"] += arguments
            events.append(self.event("response.function_call_arguments.delta",
                                     item_id=item["id"], output_index=self.output.index(item),
                                     delta=arguments))  # fmt: skip
        return events

    def close(self, status: str = "completed") -> list[str]:
        """End the open item: its done events, with the whole text or arguments."""
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        index = self.output.index(item)
        events = []
        if item["type"] == "function_call":
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=index, arguments=item["arguments"]))  # fmt: skip
        else:
            part = item["content"][0]
            kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
            events.append(self.event(f"response.{kind}.done", item_id=item["id"],
                                     output_index=index, content_index=0, text=part["text"],
                                     **({"logprobs": []} if kind == "output_text" else {})))  # fmt: skip
            events.append(self.event("response.content_part.done", item_id=item["id"],
                                     output_index=index, content_index=0, part=part))  # fmt: skip
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events


async def _stream(
    builder: ResponseBuilder,
    chat: ChatServing,
    run: ChatRun,
    store: ResponseStore,
    conversation: list[dict[str, Any]],
) -> AsyncIterator[str]:
    """Chat chunks as Responses events: created, the items' deltas, completed."""
    out = _EventWriter()
    yield out.event("response.created", response=builder.object("in_progress", []))
    yield out.event("response.in_progress", response=builder.object("in_progress", []))
    finish: str | None = None
    chat_usage: dict[str, Any] | None = None
    reasoning = ""
    try:
        async for chunk in chat.chunks(run):
            if chunk.get("usage") and not chunk["choices"]:
                chat_usage = chunk["usage"]
            for choice in chunk["choices"]:
                delta = choice["delta"]
                events: list[str] = []
                if delta.get("reasoning_content"):
                    reasoning += delta["reasoning_content"]
                    events += out.text("reasoning", delta["reasoning_content"])
                if delta.get("content"):
                    events += out.text("message", delta["content"])
                for call in delta.get("tool_calls") or []:
                    events += out.call(call)
                finish = choice.get("finish_reason") or finish
                for event in events:
                    yield event
    except (RequestFailed, OpenAIError) as exc:
        error = exc.error if isinstance(exc, RequestFailed) else exc
        yield out.event("error", code=error.code or error.type, message=error.message,
                        param=error.param)  # fmt: skip
        failed = {"code": error.code or "server_error", "message": error.message}
        yield out.event("response.failed",
                        response=builder.object("failed", out.output, error=failed))  # fmt: skip
        return
    status = "incomplete" if finish == "length" else "completed"
    for event in out.close(status):  # the last item; those before it completed
        yield event
    usage = builder.usage(chat_usage, reasoning) if chat_usage else None
    response = builder.object(status, out.output, usage)
    if builder.body.store:
        inputs = input_item_objects(builder.body)
        store.put(StoredResponse(response, conversation + answer_messages(out.output), inputs))
    yield out.event(f"response.{status}", response=response)
