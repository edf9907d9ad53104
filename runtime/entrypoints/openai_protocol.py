"""OpenAI request models, their validation, and the OpenAI error shape.

Validation lives in the models so a bad request is rejected with a 400 before anything is
tokenised or sent to the engine. Fields outside OpenAI's API (`top_k`, `min_p`,
`repetition_penalty`, `ignore_eos`, `min_tokens`, `stop_token_ids`, `skip_special_tokens`,
`structured_outputs`) follow vLLM's names, so clients pass them with `extra_body`.
"""

from __future__ import annotations

import functools
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tokenspeed.runtime.entrypoints.tool_choice import ForcedTools, forced_tools
from tokenspeed.runtime.grammar.spec import GrammarSpec

MAX_STOP_STRINGS = 16
MAX_N = 64


class OpenAIError(Exception):
    """An error that becomes `{"error": {...}}` with an HTTP status; the server keeps serving."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI's clients parse into their exception classes."""
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error envelope (also sent as the last SSE event of a failed stream)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class RequestModel(BaseModel):
    """Unknown fields are ignored, as OpenAI-compatible servers do (clients add their own)."""

    model_config = ConfigDict(extra="ignore")


class StreamOptions(RequestModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(RequestModel):
    """`response_format.json_schema`: OpenAI's structured outputs (`strict` is always on)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    """`response_format`: plain text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise RequestFieldError("response_format of type json_schema needs json_schema")
        return self


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (through `extra_body`): exactly one constraint. Unknown
    keys are refused rather than ignored, so a constraint this server lacks is never dropped."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    @model_validator(mode="after")
    def _check_one(self) -> StructuredOutputs:
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise RequestFieldError(
                "structured_outputs needs exactly one of json, regex, choice, grammar, "
                f"json_object (got {len(given)})"
            )
        return self

    def spec(self) -> GrammarSpec:
        """The engine's form of the constraint."""
        ws = not self.disable_any_whitespace
        if self.json_ is not None:
            return GrammarSpec.json_schema(self.json_, any_whitespace=ws)
        if self.regex is not None:
            return GrammarSpec.regex(self.regex)
        if self.choice is not None:
            return GrammarSpec.choice(self.choice)
        if self.grammar is not None:
            return GrammarSpec.grammar(self.grammar)
        return GrammarSpec.json_object(any_whitespace=ws)


class SamplingFields(RequestModel):
    """The sampling and stopping fields shared by chat and text completions."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (v or {}).items():
            if not token.isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {token!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias}")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_ids(cls, v: list[int] | None) -> list[int]:
        if any(t < 0 for t in v or []):
            raise ValueError("stop_token_ids must be non-negative token ids")
        return list(v or [])

    @model_validator(mode="after")
    def _check_stream_options(self) -> SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise RequestFieldError("stream_options is only allowed when stream is true")
        return self

    @model_validator(mode="after")
    def _check_one_constraint(self) -> SamplingFields:
        if self.structured_outputs is not None and self._format_spec() is not None:
            raise RequestFieldError("give response_format or structured_outputs, not both")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's `continuous_usage_stats`: usage on every chunk (with `include_usage`)."""
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)  # type: ignore[union-attr]

    def _format_spec(self) -> GrammarSpec | None:
        """``response_format``'s constraint (None for text)."""
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return GrammarSpec.json_object()
        assert fmt.json_schema is not None
        return GrammarSpec.json_schema(fmt.json_schema.schema_)

    def grammar_spec(self) -> GrammarSpec | None:
        """The output constraint, if any (structured outputs; compiled by the engine)."""
        if self.structured_outputs is not None:
            return self.structured_outputs.spec()
        return self._format_spec()


class RequestFieldError(ValueError):
    """A cross-field check failed (pydantic wraps it into a validation error with the message)."""


# ---- chat -------------------------------------------------------------------------------


class ContentPart(RequestModel):
    type: Literal["text"]
    text: str


class FunctionCall(RequestModel):
    name: str
    arguments: str


class ToolCall(RequestModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    """One message; list content may hold only text parts (this server has no vision input)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check_content(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise RequestFieldError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise RequestFieldError("a tool message needs tool_call_id")
        return self

    def text(self) -> str | None:
        """The content as one string (text parts joined), as chat templates expect."""
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content

    def for_template(self) -> dict[str, Any]:
        """The plain-dict form handed to the jinja2 chat template."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise RequestFieldError("top_logprobs requires logprobs to be true")
        return self

    @model_validator(mode="after")
    def _check_tool_choice(self) -> ChatCompletionRequest:
        forced = self.forced_tools  # raises for what cannot be done
        if forced is not None and super().grammar_spec() is not None:
            raise RequestFieldError(
                "a forced tool call cannot be combined with response_format or structured_outputs"
            )
        return self

    @functools.cached_property
    def forced_tools(self) -> ForcedTools | None:
        """The tool call(s) `tool_choice` forces ("required" or a named function), if any;
        built once per request (the validator, the grammar and every choice ask for it)."""
        return forced_tools(self.tools, self.tool_choice, self.parallel_tool_calls)

    def grammar_spec(self) -> GrammarSpec | None:
        """A forced tool call's grammar, else the structured-output constraint."""
        forced = self.forced_tools
        return forced.spec if forced is not None else super().grammar_spec()

    @property
    def output_limit(self) -> int | None:
        """`max_completion_tokens` supersedes the deprecated `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# ---- text completions -------------------------------------------------------------------


class CompletionRequest(SamplingFields):
    """POST /v1/completions; the prompt is text, token ids, or a list of either."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and isinstance(v[0], list) and any(not p for p in v):
            raise ValueError("token-id prompts must not be empty")
        if any(t < 0 for t in _flat_ids(v)):
            raise ValueError("token ids must be non-negative")
        return v

    @model_validator(mode="after")
    def _check_unsupported(self) -> CompletionRequest:
        if self.suffix:
            raise RequestFieldError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise RequestFieldError("best_of is not supported (ask for n sequences instead)")
        if self.echo and self.stream:
            raise RequestFieldError("echo is not supported with stream")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list, each text or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


def _flat_ids(v: Any) -> list[int]:
    if isinstance(v, list) and v and isinstance(v[0], int):
        return v
    if isinstance(v, list) and v and isinstance(v[0], list):
        return [t for p in v for t in p]
    return []


# ---- tokenizer endpoints (vLLM's /tokenize and /detokenize) -------------------------------


class TokenizeRequest(RequestModel):
    """POST /tokenize: a text prompt, or chat messages rendered by the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise RequestFieldError("give exactly one of prompt and messages")
        if self.messages is not None and not self.messages:
            raise RequestFieldError("messages must not be empty")
        return self


class DetokenizeRequest(RequestModel):
    """POST /detokenize."""

    model: str | None = None
    tokens: list[int]

    @field_validator("tokens")
    @classmethod
    def _check_ids(cls, v: list[int]) -> list[int]:
        if any(t < 0 for t in v):
            raise ValueError("token ids must be non-negative")
        return v


# ---- response helpers -------------------------------------------------------------------


def new_id(prefix: str) -> str:
    """OpenAI-style object ids (`chatcmpl-...`, `cmpl-...`)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object, with the prefix-cache hits as `cached_tokens`."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One readable message and the offending parameter from pydantic's error list."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', msg)}", None
    if first.get("type") == "missing":
        return f"missing required parameter: {param}", param
    return (f"{param}: {msg}" if param else msg), param
