"""Benchmark workloads: random, generated shared prefix, ShareGPT files, multi-turn sessions.

Every request carries both shapes a server may want: ``prompt`` (text for /v1/completions)
and ``messages`` (for /v1/chat/completions), with the prompt's length in tokens under the
benchmark tokenizer. Multi-turn sessions are plans; their requests are built turn by turn,
because each turn resends the model's actual previous answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tokenspeed_cli.bench.errors import BenchError
from tokenspeed_cli.bench.tokens import TokenSampler, count_tokens

Message = dict[str, str]


@dataclass
class BenchRequest:
    """One request to send: its text both ways, its token length and its output budget."""

    prompt: str
    messages: list[Message]
    prompt_len: int
    output_len: int


def _lengths(mean: int, ratio: float, n: int, rng: np.random.Generator, low: int) -> list[int]:
    """``n`` integers uniform in ``[mean*(1-ratio), mean*(1+ratio)]`` (vLLM's range ratio)."""
    lo = max(low, int(mean * (1 - ratio)))
    hi = max(lo, int(mean * (1 + ratio)))
    return [int(x) for x in rng.integers(lo, hi + 1, size=n)]


def random_requests(
    sampler: TokenSampler,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    seed: int = 0,
) -> list[BenchRequest]:
    """Random word prompts of exact lengths; ``prefix_len`` tokens shared by all of them."""
    if not 0.0 <= range_ratio < 1.0:
        raise BenchError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    prefix = sampler.text(prefix_len, rng)
    in_lens = _lengths(input_len, range_ratio, num_prompts, rng, low=0 if prefix_len else 1)
    out_lens = _lengths(output_len, range_ratio, num_prompts, rng, low=1)
    out = []
    for n_in, n_out in zip(in_lens, out_lens, strict=True):
        text = prefix + sampler.text(n_in, rng)
        out.append(
            BenchRequest(text, [{"role": "user", "content": text}], prefix_len + n_in, n_out)
        )
    return out


def shared_prefix_requests(
    sampler: TokenSampler,
    num_groups: int,
    prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
    seed: int = 0,
) -> list[BenchRequest]:
    """SGLang's generated-shared-prefix: per group one system prompt, then distinct questions.

    Requests come group by group, so a server with a prefix cache can reuse each system prompt.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num_groups):
        system = sampler.text(system_prompt_len, rng)
        for _ in range(prompts_per_group):
            question = sampler.text(question_len, rng)
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ]
            out.append(
                BenchRequest(
                    system + question, messages, system_prompt_len + question_len, output_len
                )
            )
    return out


def _speaker(turn: dict[str, Any]) -> Any:
    return turn.get("from", turn.get("role"))


def _sharegpt_pair(entry: Any) -> tuple[str, str] | None:
    """The first human prompt and the answer after it, from either common ShareGPT layout."""
    if not isinstance(entry, dict):
        return None
    turns = entry.get("conversations", entry.get("messages"))
    if not isinstance(turns, list):
        return None
    turns = [t for t in turns if not (isinstance(t, dict) and _speaker(t) == "system")]
    if len(turns) < 2:
        return None
    texts = []
    for turn in turns[:2]:
        if not isinstance(turn, dict):
            return None
        value = turn.get("value", turn.get("content"))
        if not isinstance(value, str):
            return None
        texts.append(value)
    return texts[0], texts[1]


def sharegpt_requests(
    tokenizer: Tokenizer,
    path: Path,
    num_prompts: int,
    output_len: int | None = None,
    seed: int = 0,
    max_prompt_len: int = 1024,
    max_total_len: int = 2048,
) -> list[BenchRequest]:
    """Conversations from a ShareGPT JSON file, sampled with ``seed``.

    The output budget is the reference answer's length unless ``output_len`` is given; pairs
    that are too short (< 4 tokens) or too long are skipped, as vLLM does.
    """
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BenchError(f"dataset file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read dataset file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise BenchError(f"dataset file {path} is not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise BenchError(f"dataset file {path} must hold a JSON list of conversations")
    order = np.random.default_rng(seed).permutation(len(data))
    out: list[BenchRequest] = []
    for i in order:
        pair = _sharegpt_pair(data[int(i)])
        if pair is None:
            continue
        prompt, answer = pair
        n_in = count_tokens(tokenizer, prompt)
        n_out = output_len if output_len is not None else count_tokens(tokenizer, answer)
        if n_in < 4 or (output_len is None and n_out < 4):
            continue
        if n_in > max_prompt_len or n_in + n_out > max_total_len:
            continue
        out.append(BenchRequest(prompt, [{"role": "user", "content": prompt}], n_in, n_out))
        if len(out) == num_prompts:
            break
    if not out:
        raise BenchError(
            f"dataset file {path} has no usable conversations (expected ShareGPT entries "
            '{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]})'
        )
    return out


@dataclass
class Session:
    """One agentic session: a system prompt, then one tool-output-sized message per turn."""

    system: str
    user_messages: list[str]
    output_len: int
    answers: list[str] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return len(self.user_messages)

    def messages_for_turn(self, turn: int) -> list[Message]:
        """The whole conversation so far (with the model's real answers) plus turn's message."""
        if len(self.answers) < turn:
            raise ValueError(f"turn {turn} needs the answers of turns 0..{turn - 1}")
        messages: list[Message] = [{"role": "system", "content": self.system}]
        for k in range(turn):
            messages.append({"role": "user", "content": self.user_messages[k]})
            messages.append({"role": "assistant", "content": self.answers[k]})
        messages.append({"role": "user", "content": self.user_messages[turn]})
        return messages

    def request_for_turn(self, turn: int, tokenizer: Tokenizer) -> BenchRequest:
        """Turn ``turn``'s request; the completions prompt is the conversation's text joined."""
        messages = self.messages_for_turn(turn)
        prompt = "".join(m["content"] for m in messages)
        return BenchRequest(prompt, messages, count_tokens(tokenizer, prompt), self.output_len)


def multi_turn_sessions(
    sampler: TokenSampler,
    num_sessions: int,
    turns: int,
    system_prompt_len: int,
    tool_output_len: int,
    output_len: int,
    shared_system_prompt: bool = True,
    seed: int = 0,
) -> list[Session]:
    """Sessions whose system prompt (tool docs) is shared across sessions unless told not to."""
    if turns < 1 or num_sessions < 1:
        raise BenchError("--multi-turn-sessions and --multi-turn-turns must be at least 1")
    rng = np.random.default_rng(seed)
    shared = sampler.text(system_prompt_len, rng)
    sessions = []
    for _ in range(num_sessions):
        system = shared if shared_system_prompt else sampler.text(system_prompt_len, rng)
        users = [sampler.text(tool_output_len, rng) for _ in range(turns)]
        sessions.append(Session(system, users, output_len))
    return sessions
