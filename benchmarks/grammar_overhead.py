"""What structured outputs cost the engine's host per step, at a real vocabulary size.

Builds a byte-level vocabulary of ``--vocab`` tokens (the 256 byte tokens, then random
multi-byte merges of printable text, as a BPE vocabulary looks), compiles a tool-call-like
JSON schema, a regex and JSON mode against it with ``GrammarBackend``'s compiler settings, and
times: the first and the cached compile, the bitmask fill of one decode step for one sequence
(``RequestGrammar.fill_bitmask``) and for ``--batch`` sequences together (``fill_bitmasks``,
xgrammar's thread pool), ``accept`` of a token, and unpacking + applying the mask to
``--batch`` rows of logits (``sampling.processors.grammar_mask``, the device part, on
``--device``).

    python benchmarks/grammar_overhead.py --vocab 151936 --out FILE [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import time
from pathlib import Path

import torch
import xgrammar as xgr

from tokenspeed.runtime.grammar.backend import RequestGrammar, fill_bitmasks
from tokenspeed.runtime.sampling.processors import grammar_mask

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"enum": ["search", "read_file", "write_file", "run"]},
        "arguments": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                "recursive": {"type": "boolean"},
            },
            "required": ["path"],
        },
    },
    "required": ["name", "arguments"],
}
GRAMMARS = {
    "json_schema": lambda c: c.compile_json_schema(json.dumps(SCHEMA), any_whitespace=True),
    "json_object": lambda c: c.compile_json_schema('{"type": "object"}', any_whitespace=True),
    "regex": lambda c: c.compile_regex(r"(\d{4})-(\d{2})-(\d{2})T[0-9:]{8}Z"),
}
#: a prefix of an output each grammar accepts, so the fill is timed mid-output
PREFIXES = {
    "json_schema": '{"name": "search", "arguments": {"path": "src/',
    "json_object": '{"a": [1, 2, {"b": "te',
    "regex": "2026-12-0",
}


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character map: printable bytes stand for themselves, the others for
    characters from U+0100 on (so space is U+0120)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def byte_level_vocab(size: int, seed: int = 0) -> list[str]:
    """The 256 byte tokens, then random merges of word characters, digits and JSON
    punctuation, half of them with a leading space."""
    alphabet = byte_alphabet()
    letters = string.ascii_lowercase + string.digits + '"{}[]:,._-/'
    vocab = dict.fromkeys(alphabet)
    rng = random.Random(seed)
    while len(vocab) < size:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(2, 8)))
        vocab.setdefault(("\u0120" if rng.random() < 0.5 else "") + word)
    return list(vocab)[:size]


def median_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batch", type=int, default=64, help="rows of logits for the mask")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--device", default="cpu", help="where the mask is applied (cuda on a GPU)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    vocab = byte_level_vocab(args.vocab)
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=args.vocab,
                             stop_token_ids=[args.vocab - 1])  # fmt: skip
    compiler = xgr.GrammarCompiler(info)
    rows = []
    for name, compile_fn in GRAMMARS.items():
        t0 = time.perf_counter()
        compiled = compile_fn(compiler)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        compile_fn(compiler)
        cached = time.perf_counter() - t0
        grammar = RequestGrammar(xgr.GrammarMatcher(compiled))
        assert grammar._matcher.accept_string(PREFIXES[name])
        mask = torch.full((1, (args.vocab + 31) // 32), -1, dtype=torch.int32)
        fills = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            grammar.fill_bitmask(mask, 0)
            fills.append(time.perf_counter() - t0)
        allowed = [t for t in range(args.vocab) if (int(mask[0, t // 32]) >> (t % 32)) & 1]
        accepts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ok = grammar.accept(allowed[0])
            accepts.append(time.perf_counter() - t0)
            if ok:
                grammar._matcher.rollback(1)
        batch = []  # the step's rows all at this point: filled together (``fill_bitmasks``)
        for _ in range(args.batch):
            g = RequestGrammar(xgr.GrammarMatcher(compiled))
            g._matcher.accept_string(PREFIXES[name])
            batch.append(g)
        masks = torch.full((args.batch, mask.shape[1]), -1, dtype=torch.int32)
        batch_fills = []
        for _ in range(max(3, args.repeats // 20)):
            t0 = time.perf_counter()
            fill_bitmasks(batch, masks)
            batch_fills.append(time.perf_counter() - t0)
        assert torch.equal(masks[-1], mask[0])
        rows.append({
            "grammar": name, "compile_ms": round(first * 1e3, 2),
            "cached_compile_ms": round(cached * 1e3, 3), "fill_us": median_us(fills),
            f"fill_{args.batch}_rows_us": median_us(batch_fills),
            "accept_rollback_us": median_us(accepts), "allowed_tokens": len(allowed),
        })  # fmt: skip
        print(rows[-1])
    device = torch.device(args.device)
    logits = torch.randn(args.batch, args.vocab, device=device)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (args.batch, (args.vocab + 31) // 32),
                            dtype=torch.int32, device=device)  # fmt: skip
    index = torch.arange(args.batch, device=device)
    times = []
    for _ in range(20):
        work = logits.clone()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        grammar_mask(work, index, bitmask)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    result = {
        "vocab": args.vocab,
        "threads": torch.get_num_threads(),
        "grammars": rows,
        "mask_apply_us": {
            "device": args.device,
            "batch": args.batch,
            "median_us": median_us(times),
        },
    }
    print(result["mask_apply_us"])
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
