"""The offline API: ``LLM(model).generate(prompts, params)`` and ``.chat(messages, params)``.

It runs the same EventLoop (scheduler + executor) the server's engine process runs, in this
process, until every request of the call has finished.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenspeed.runtime.engine.event_loop import EventLoop
from tokenspeed.runtime.engine.request import RequestUpdate
from tokenspeed.runtime.outputs import CompletionOutput, RequestOutput
from tokenspeed.runtime.sampling import SamplingParams
from tokenspeed.runtime.tokenizer import Tokenizer, TokenizerNotFound

PromptInput = str | Sequence[int]


def _normalise_prompts(prompts: PromptInput | Sequence[PromptInput]) -> list[PromptInput]:
    """``str``, ``list[str]``, ``list[int]`` (one tokenised prompt) or ``list[list[int]]``."""
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [items]  # type: ignore[list-item]
    return items  # type: ignore[return-value]


class LLM:
    """An engine in this process for batch generation (no server)."""

    def __init__(self, model: str | None = None, **server_args: Any) -> None:
        from tokenspeed.runtime.config import ConfigError, build_server_args
        from tokenspeed.runtime.model_source import resolve_model_path

        self.args = build_server_args({"model": model, **server_args})
        unsupported = self.args.unsupported_options()
        if unsupported:
            raise ConfigError("not supported in this build: " + "; ".join(unsupported))
        self.model_path: Path = resolve_model_path(model, self.args.load_format)
        tok_dir = Path(self.args.tokenizer) if self.args.tokenizer else self.model_path
        try:
            self.tokenizer: Tokenizer | None = Tokenizer.from_dir(tok_dir, self.args.chat_template)
        except TokenizerNotFound:
            self.tokenizer = None
        self.engine = EventLoop.from_server_args(self.args, self.model_path)
        self._ids = itertools.count()

    def _require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{self.model_path} has no tokenizer; pass token ids instead of text")
        return self.tokenizer

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order."""
        items = _normalise_prompts(prompts)
        params = self._params_list(sampling_params, len(items))
        texts: list[str | None] = []
        ids: list[list[int]] = []
        for item in items:
            if isinstance(item, str):
                texts.append(item)
                ids.append(self._require_tokenizer().encode(item))
            else:
                texts.append(None)
                ids.append([int(t) for t in item])
        return self._run(texts, ids, params)

    def chat(
        self,
        messages: list[dict[str, Any]] | Sequence[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[RequestOutput]:
        """Render each conversation with the tokenizer's chat template, then generate."""
        tok = self._require_tokenizer()
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        texts: list[str | None] = []
        ids: list[list[int]] = []
        for conv in conversations:
            text = tok.apply_chat_template(
                conv, add_generation_prompt=add_generation_prompt, **template_kwargs
            )  # type: ignore[arg-type]
            texts.append(text)
            ids.append(tok.encode(text, add_special_tokens=False))
        return self._run(texts, ids, self._params_list(sampling_params, len(ids)))

    @staticmethod
    def _params_list(
        params: SamplingParams | Sequence[SamplingParams] | None, n: int
    ) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams() for _ in range(n)]
        if isinstance(params, SamplingParams):
            return [params] * n
        out = list(params)
        if len(out) != n:
            raise ValueError(f"{len(out)} sampling params for {n} prompts")
        return out

    def _run(
        self, texts: list[str | None], ids: list[list[int]], params: list[SamplingParams]
    ) -> list[RequestOutput]:
        rids = [f"offline-{next(self._ids)}" for _ in ids]
        by_id = dict(zip(rids, params, strict=True))
        results: dict[str, RequestOutput] = {}
        for rid, text, prompt, p in zip(rids, texts, ids, params, strict=True):
            logprobs: list[dict[int, float]] | None = [] if p.logprobs is not None else None
            comp = CompletionOutput(0, "", [], None, logprobs)
            results[rid] = RequestOutput(rid, text, prompt, [comp], finished=False)
        submitted: list[str] = []
        try:
            for rid, prompt, p in zip(rids, ids, params, strict=True):
                self.engine.add_request(rid, prompt, p)
                submitted.append(rid)
            pending = set(rids)
            while pending:
                step = self.engine.step()
                for update in step.updates:
                    if update.request_id in pending:
                        self._apply(results[update.request_id], update, by_id[update.request_id])
                        if update.finished:
                            pending.discard(update.request_id)
                for rid, token in zip(step.rids, step.tokens, strict=True):
                    if rid in pending:  # a decoding request's one new token
                        results[rid].outputs[0].token_ids.append(token)
                for rid, block in zip(step.block_rids, step.blocks, strict=True):
                    if rid in pending:  # a verified block (speculative decoding)
                        results[rid].outputs[0].token_ids.extend(block)
                self._check_stop_strings(results, pending, by_id)
        except BaseException:
            for rid in submitted:
                self.engine.abort_request(rid)
            raise
        return [results[rid] for rid in rids]

    def _apply(self, out: RequestOutput, update: RequestUpdate, params: SamplingParams) -> None:
        if update.error is not None:
            raise ValueError(update.error)
        comp = out.outputs[0]
        comp.token_ids.extend(update.new_token_ids)
        if comp.logprobs is not None and update.new_logprobs:
            comp.logprobs.extend(update.new_logprobs)
        if update.finished:
            out.finished = True
            comp.finish_reason = update.finish_reason
            out.metrics = update.stats
            if self.tokenizer is not None:  # a stop token's text is not output (as in vLLM)
                ids = comp.token_ids[:-1] if update.finish_reason == "stop" else comp.token_ids
                comp.text = self.tokenizer.decode(ids, params.skip_special_tokens)

    def _check_stop_strings(
        self,
        results: dict[str, RequestOutput],
        pending: set[str],
        params: dict[str, SamplingParams],
    ) -> None:
        """End requests whose decoded text contains a stop string; cut the text before it.

        Decoding the whole output each step is quadratic, but only requests that have stop
        strings pay it, and only in the offline API (the server detokenises incrementally).
        """
        if self.tokenizer is None:
            return
        for rid in list(pending):
            p = params[rid]
            if not p.stop:
                continue
            out = results[rid]
            comp = out.outputs[0]
            text = self.tokenizer.decode(comp.token_ids, p.skip_special_tokens)
            hits = [i for i in (text.find(s) for s in p.stop) if i >= 0]
            if hits:
                req = self.engine.finish_request(rid, "stop")
                comp.text = text[: min(hits)]
                comp.finish_reason = "stop"
                out.finished = True
                out.metrics = req.stats if req is not None else None
                pending.discard(rid)
