"""Constrained decoding with xgrammar: one compiler per model vocabulary, one matcher per request.

The engine builds a ``GrammarBackend`` for its model; the first request with a grammar loads the
tokenizer and xgrammar (so engines that never see one pay nothing). Compiled grammars are
cached, so a schema that comes back (the same tool on every turn of an agent) compiles once;
a new one can compile on a background thread (xgrammar releases the GIL) while the engine
keeps stepping the other requests. A request's ``RequestGrammar`` fills its row of the step's token bitmask before
sampling and accepts the sampled token after.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenspeed.runtime.grammar.spec import GrammarSpec
from tokenspeed.runtime.parsers.reasoning import REASONING_PARSERS

# xgrammar's C++ errors read "[12:00:00] /project/cpp/file.cc:123: Check failed: (...) is
# false: <what went wrong>"; users get only what went wrong.
_CPP_PREFIX = re.compile(r"^\s*\[[0-9:.]+\]\s+\S+:\d+:\s*(Check failed: .*? is false: )?")


class GrammarError(ValueError):
    """A grammar that cannot be compiled (bad schema, regex or EBNF): the request's fault."""


def _clean_message(exc: BaseException) -> str:
    text = _CPP_PREFIX.sub("", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _choice_ebnf(options: list[str]) -> str:
    """``root ::= "a" | "b"``: JSON string escapes are also xgrammar's EBNF escapes."""
    return "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)


def vocab_metadata(tokenizer_json: dict[str, Any]) -> tuple[str, bool]:
    """How the vocabulary's strings encode bytes (xgrammar's vocab type) and whether the
    tokenizer prepends a space, read from ``tokenizer.json`` the way xgrammar reads a Hugging
    Face tokenizer: a ``ByteLevel`` decoder (GPT-2 style, Qwen, Llama 3, DeepSeek) means
    byte-level strings; ``ByteFallback`` (SentencePiece: Llama 2, Mistral) means ``▁`` for
    spaces and ``<0xNN>`` byte tokens; anything else is taken as raw text."""
    decoder = tokenizer_json.get("decoder") or {}
    kinds = {p.get("type") for p in _parts(decoder, "decoders")}
    if "ByteLevel" in kinds:
        return "BYTE_LEVEL", False
    if "ByteFallback" not in kinds:
        return "RAW", False
    normalizers = _parts(tokenizer_json.get("normalizer") or {}, "normalizers")
    prefix = any(n.get("type") == "Prepend" and n.get("prepend") == "\u2581" for n in normalizers)
    for pre in _parts(tokenizer_json.get("pre_tokenizer") or {}, "pretokenizers"):
        if pre.get("type") == "Metaspace":
            prefix |= pre.get("prepend_scheme", "always") != "never"
    return "BYTE_FALLBACK", prefix


def _parts(component: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """A ``tokenizer.json`` component as a list: a ``Sequence``'s members, or itself."""
    items = component.get(key) if component.get("type") == "Sequence" else [component]
    return [p for p in items or [] if isinstance(p, dict)]


@dataclass(frozen=True)
class ThinkTokens:
    """The single tokens that open and close a thinking block (``<think>``, ``</think>``), and
    whether the output starts inside one (the chat template opened it, DeepSeek-R1 style)."""

    start: int
    end: int
    starts_thinking: bool = False


class RequestGrammar:
    """One request's position in its grammar: which tokens may come next, and the tokens so
    far. Its state moves with the request (retraction and re-admission keep it).

    With ``think`` (a thinking model served with a reasoning parser) the grammar holds the
    answer only: the thinking block is free text. Where the model may open the block itself,
    its first token may also be ``think.start``.
    """

    def __init__(self, matcher: Any, think: ThinkTokens | None = None) -> None:
        self._matcher = matcher
        self.think = think
        self.rejected = False  # a token the grammar did not allow was sampled (see accept)
        # "active": the grammar holds every token; "opening": the first token may open a
        # thinking block instead; "thinking": anything goes until think.end.
        self.phase = "active"
        if think is not None:
            self.phase = "thinking" if think.starts_thinking else "opening"

    @property
    def masks(self) -> bool:
        """Whether this step's token is masked at all (not while thinking)."""
        return self.phase != "thinking"

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32 words, bit set = allowed)."""
        if not self.masks:
            bitmask[row] = -1
            return
        self._matcher.fill_next_token_bitmask(bitmask, row)
        self.after_fill(bitmask, row)

    def after_fill(self, bitmask: Any, row: int) -> None:
        """What the matcher's mask leaves out: the token that opens a thinking block."""
        if self.phase == "opening" and self.think is not None:
            word, bit = divmod(self.think.start, 32)
            value = (int(bitmask[row, word]) & 0xFFFFFFFF) | (1 << bit)
            bitmask[row, word] = value - (1 << 32) if value >= 1 << 31 else value

    def accept(self, token: int) -> bool:
        """Advance by the sampled token. False only if the mask could not be honoured (every
        allowed token was banned, e.g. by ``min_tokens``); the request should then stop."""
        token = int(token)
        if self.phase == "opening":
            assert self.think is not None
            if token == self.think.start:
                self.phase = "thinking"
                return True
            self.phase = "active"
        elif self.phase == "thinking":
            assert self.think is not None
            if token == self.think.end:
                self.phase = "active"
            return True
        ok = bool(self._matcher.accept_token(token))
        self.rejected |= not ok
        return ok

    @property
    def finished(self) -> bool:
        """The grammar is complete and its stop token was accepted (or a token was refused)."""
        return self.rejected or (self.phase == "active" and bool(self._matcher.is_terminated()))


@functools.cache
def _batch_matcher() -> Any:
    """xgrammar's batch filler: one C++ thread pool for the rows of a step."""
    import xgrammar as xgr

    return xgr.BatchGrammarMatcher()


def fill_bitmasks(grammars: Sequence[RequestGrammar], bitmask: Any) -> None:
    """Fill ``bitmask[i]`` for ``grammars[i]``. Several rows are filled in parallel: a row
    inside a JSON string allows most of a 150k vocabulary and takes ~0.4 ms alone
    (``benchmarks/grammar_overhead.py``)."""
    live = []
    for row, g in enumerate(grammars):
        if g.masks:
            live.append((row, g))
        else:  # thinking: everything allowed
            g.fill_bitmask(bitmask, row)
    if len(live) == 1:
        live[0][1].fill_bitmask(bitmask, live[0][0])
    elif live:
        _batch_matcher().batch_fill_next_token_bitmask(
            [g._matcher for _, g in live], bitmask, indices=[row for row, _ in live]
        )
        for row, g in live:
            g.after_fill(bitmask, row)


class GrammarBackend:
    """Compiles specs against one model's vocabulary; makes per-request matchers."""

    #: compiled grammars kept for reuse (each holds its token-mask cache: 0.1-1 MB at a 150k
    #: vocabulary)
    CACHE_SIZE = 256

    def __init__(
        self,
        tokenizer_dir: str | Path | None,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        reasoning_parser: str | None = None,
    ) -> None:
        """``reasoning_parser`` (the server's): grammars then hold the answer after the
        thinking block, where ``<think>`` and ``</think>`` are single tokens."""
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
        self.reasoning_parser = reasoning_parser
        self.think: ThinkTokens | None = None  # found with the vocabulary (_build_compiler)
        self.vocab_size = int(vocab_size)
        # (an EOS id past the vocabulary, as a shrunk test model may have, cannot end a grammar)
        self.stop_token_ids = sorted({int(t) for t in stop_token_ids if 0 <= t < vocab_size})
        self._compiler: Any = None
        self._lock = threading.RLock()  # a done future runs its callback (which locks) at once
        self._compiled: OrderedDict[GrammarSpec, Any] = OrderedDict()
        self._inflight: dict[GrammarSpec, Future[Any]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                try:
                    self._compiler = self._build_compiler()
                except GrammarError:
                    raise
                except Exception as exc:  # a tokenizer xgrammar cannot read: refuse requests
                    raise GrammarError(
                        f"structured outputs are unavailable for this model: {_clean_message(exc)}"
                    ) from exc
            return self._compiler

    def _build_compiler(self) -> Any:
        try:
            import xgrammar as xgr
        except ImportError as exc:  # pragma: no cover - xgrammar is a dependency
            raise GrammarError("structured outputs need the xgrammar package") from exc
        from tokenspeed.runtime.tokenizer import TokenizerNotFound, load_backend

        try:
            if self.tokenizer_dir is None:
                raise TokenizerNotFound("no tokenizer directory")
            tokenizer = load_backend(self.tokenizer_dir)
        except TokenizerNotFound:
            raise GrammarError("structured outputs need the model's tokenizer") from None
        raw = json.loads(tokenizer.to_str())
        vocab_type, prefix = vocab_metadata(raw)
        # Ids past the model's vocabulary (tokens its head cannot produce) are left out; ids
        # the tokenizer lacks (a padded head) stay empty strings, which xgrammar never matches.
        encoded = [""] * self.vocab_size
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        for text, idx in vocab.items():
            if idx < self.vocab_size:
                encoded[idx] = text
        parser = REASONING_PARSERS.get(self.reasoning_parser or "")
        if parser is not None:
            start, end = vocab.get(parser.START), vocab.get(parser.END)
            if start is not None and end is not None:
                self.think = ThinkTokens(start, end, parser.starts_thinking)
        # Special tokens (chat markers, EOS) are never grammar text either; the stop tokens
        # still end a grammar, by id.
        for added in raw.get("added_tokens") or []:
            if added.get("special") and 0 <= int(added.get("id", -1)) < self.vocab_size:
                encoded[int(added["id"])] = ""
        info = xgr.TokenizerInfo(
            encoded,
            getattr(xgr.VocabType, vocab_type),
            vocab_size=self.vocab_size,
            stop_token_ids=self.stop_token_ids or None,
            add_prefix_space=prefix,
        )
        return xgr.GrammarCompiler(info)

    def ready(self, spec: GrammarSpec) -> Any | None:
        """The compiled grammar if it is at hand (compiled before), else None."""
        with self._lock:
            compiled = self._compiled.get(spec)
            if compiled is not None:
                self._compiled.move_to_end(spec)
            return compiled

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar, compiled now unless at hand; ``GrammarError`` if bad."""
        compiled = self.ready(spec)
        if compiled is None:
            compiled = self._compile(spec)
            with self._lock:
                self._compiled[spec] = compiled
                while len(self._compiled) > self.CACHE_SIZE:
                    self._compiled.popitem(last=False)
        return compiled

    def compile_in_background(self, spec: GrammarSpec) -> Future[Any]:
        """``compile`` on the backend's thread; requests for a spec already compiling share
        its future."""
        with self._lock:
            future = self._inflight.get(spec)
            if future is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
                future = self._pool.submit(self.compile, spec)
                self._inflight[spec] = future
                future.add_done_callback(lambda _, spec=spec: self._forget(spec))
            return future

    def _forget(self, spec: GrammarSpec) -> None:
        with self._lock:
            self._inflight.pop(spec, None)

    def _compile(self, spec: GrammarSpec) -> Any:
        compiler = self._get_compiler()
        try:
            if spec.kind in ("json_schema", "json_object"):
                schema = spec.value if spec.kind == "json_schema" else '{"type": "object"}'
                return compiler.compile_json_schema(schema, any_whitespace=spec.any_whitespace)
            if spec.kind == "regex":
                return compiler.compile_regex(spec.value)
            if spec.kind == "choice":
                return compiler.compile_grammar(_choice_ebnf(spec.choices()))
            return compiler.compile_grammar(spec.value)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(f"invalid {spec.kind}: {_clean_message(exc)}") from exc

    def matcher(
        self, spec: GrammarSpec, stop_token_ids: Sequence[int] = (), thinking: bool = True
    ) -> RequestGrammar:
        """A fresh matcher for ``spec`` (compiled now if need be); see ``matcher_for``."""
        return self.matcher_for(self.compile(spec), stop_token_ids, thinking)

    def matcher_for(
        self, compiled: Any, stop_token_ids: Sequence[int] = (), thinking: bool = True
    ) -> RequestGrammar:
        """A fresh matcher of a compiled grammar; it ends on one of ``stop_token_ids`` (the
        request's EOS and stop ids; the model's EOS when the request has none). With
        ``thinking`` false (the request turned its model's thinking off) it holds the output
        from the first token, even where the server's model thinks."""
        import xgrammar as xgr

        stops = sorted({int(t) for t in stop_token_ids if 0 <= t < self.vocab_size})
        try:
            matcher = xgr.GrammarMatcher(
                compiled, override_stop_tokens=stops or self.stop_token_ids or None
            )
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(f"cannot start the grammar: {_clean_message(exc)}") from exc
        return RequestGrammar(matcher, self.think if thinking else None)

    def close(self) -> None:
        """Stop the compile thread (pending compiles are dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
