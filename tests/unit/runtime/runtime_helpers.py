"""Shared test helpers: tiny HF checkpoints and a hand-driven executor (no scheduler)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tokenspeed.runtime.forward_batch import ForwardMode, SyntheticOp

VOCAB = 320


# Shared by the parity tests: tokens generated per prompt, and the checkpoint kinds.
NUM_NEW = 32
KINDS = ["llama", "qwen3", "qwen3_moe"]


def make_tiny_checkpoint(kind: str, path: Path, **overrides: object) -> Path:
    """Save a float32 random tiny transformers model of ``kind`` to ``path``."""
    import transformers as tf

    common: dict[str, object] = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    common.update(overrides)
    if kind == "llama":
        config, cls = tf.LlamaConfig(**common), tf.LlamaForCausalLM
    elif kind == "qwen2":
        config, cls = tf.Qwen2Config(**common), tf.Qwen2ForCausalLM
    elif kind == "qwen3":
        config, cls = tf.Qwen3Config(**common), tf.Qwen3ForCausalLM
    elif kind == "qwen3_moe":
        moe = dict(
            moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True
        )
        moe.update(common)
        config, cls = tf.Qwen3MoeConfig(**moe), tf.Qwen3MoeForCausalLM
    else:
        raise ValueError(kind)
    torch.manual_seed(1234)
    model = cls(config).to(torch.float32).eval()
    # Larger-than-default init so logits are well separated and greedy argmax is stable.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            elif "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.05)
    model.save_pretrained(path, safe_serialization=True)
    return path


def hf_model(path: Path) -> torch.nn.Module:
    """The transformers reference model for a checkpoint, float32, eager attention."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_greedy(
    model: torch.nn.Module, prompts: list[list[int]], n: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens and per-step logits from transformers, one prompt at a time (no padding)."""
    tokens, logits = [], []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(
                ids,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
        tokens.append(out.sequences[0, len(prompt) :].tolist())
        logits.append(torch.stack([s[0] for s in out.logits]))
    return tokens, logits


def make_prompts(seed: int = 0, count: int = 8) -> list[list[int]]:
    """Prompts of different lengths; half share a long common prefix."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(1, VOCAB, size=40).tolist()
    prompts = []
    for i in range(count):
        tail = rng.integers(1, VOCAB, size=int(rng.integers(3, 30))).tolist()
        prompts.append(shared + tail if i % 2 == 0 else tail + shared[: i * 3])
    return prompts


# a hand-built forward op with the scheduler's field names
Op = SyntheticOp


def run_without_scheduler(
    executor, prompts: list[list[int]], n: int, chunk: int | None = None, shuffle_pages: bool = True
) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """Prefill (optionally in chunks of ``chunk`` tokens per request) then decode, greedily.

    Pages are handed out in a shuffled order so block tables are not the identity.
    """
    from tokenspeed.runtime.sampling import SamplingParams

    page = executor.page_size
    max_pages = -(-(max(map(len, prompts)) + n) // page)
    rng = np.random.default_rng(7)
    ids = (
        rng.permutation(executor.num_device_pages)
        if shuffle_pages
        else np.arange(executor.num_device_pages)
    )
    tables = ids[: len(prompts) * max_pages].reshape(len(prompts), max_pages).astype(np.int32)
    for slot in range(len(prompts)):
        executor.install_request(slot, SamplingParams(temperature=0.0), 0, prompts[slot], [])
    done = [0] * len(prompts)
    outs: list[list[int]] = [[] for _ in prompts]
    logits: list[list[torch.Tensor]] = [[] for _ in prompts]
    names = [f"r{i}" for i in range(len(prompts))]
    # prefill, chunk by chunk, all requests together
    while any(d < len(p) for d, p in zip(done, prompts, strict=True)):
        rows = [i for i, p in enumerate(prompts) if done[i] < len(p)]
        ext = [min(chunk or len(prompts[i]), len(prompts[i]) - done[i]) for i in rows]
        op = Op(
            mode=ForwardMode.EXTEND,
            request_ids=[names[i] for i in rows],
            request_pool_indices=np.array(rows, np.int32),
            prefix_lens=np.array([done[i] for i in rows], np.int32),
            extend_lens=np.array(ext, np.int32),
            seq_lens=np.array([done[i] + e for i, e in zip(rows, ext, strict=True)], np.int32),
            input_ids=np.concatenate(
                [prompts[i][done[i] : done[i] + e] for i, e in zip(rows, ext, strict=True)]
            ).astype(np.int32),
            block_tables=tables[rows],
            sample_mask=np.array(
                [done[i] + e == len(prompts[i]) for i, e in zip(rows, ext, strict=True)]
            ),
        )
        res = executor.execute(op, return_logits=True)
        for i, e in zip(rows, ext, strict=True):
            done[i] += e
        for j, r in enumerate(res.rows):
            i = rows[r]
            outs[i].append(int(res.tokens[j]))
            logits[i].append(res.logits[j])
    for _ in range(n - 1):
        rows = list(range(len(prompts)))
        seq = np.array([len(prompts[i]) + len(outs[i]) for i in rows], np.int32)
        op = Op(
            mode=ForwardMode.DECODE,
            request_ids=names,
            request_pool_indices=np.array(rows, np.int32),
            prefix_lens=seq - 1,
            extend_lens=np.ones(len(rows), np.int32),
            seq_lens=seq,
            input_ids=np.array([outs[i][-1] for i in rows], np.int32),
            block_tables=tables,
            sample_mask=np.ones(len(rows), bool),
        )
        res = executor.execute(op, return_logits=True)
        for j, r in enumerate(res.rows):
            outs[r].append(int(res.tokens[j]))
            logits[r].append(res.logits[j])
    return outs, logits


def assert_logprobs_match(outs, ref_logits, atol: float = 1e-4) -> None:
    """Sampled-token logprobs equal transformers' log-softmax at every step (raw logits)."""
    for out, ref in zip(outs, ref_logits, strict=True):
        comp = out.outputs[0]
        ours = torch.tensor(
            [step[t] for step, t in zip(comp.logprobs, comp.token_ids, strict=True)]
        )
        want = ref.log_softmax(-1).gather(1, torch.tensor(comp.token_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(ours, want, atol=atol, rtol=0)
