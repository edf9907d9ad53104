"""Straightforward float64 versions of every op, written token by token for clarity.

These are the independent check on the torch references: slow loops over tokens and heads
with textbook formulas, nothing shared with the package's code.
"""

from __future__ import annotations

import math

import torch


def rms_norm(x, weight, eps):
    x, w = x.double(), weight.double()
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        rms = math.sqrt(float((x[t] ** 2).sum()) / x.shape[1] + eps)
        out[t] = x[t] / rms * w
    return out


def silu_and_mul(x):
    x = x.double()
    half = x.shape[1] // 2
    gate, up = x[:, :half], x[:, half:]
    return gate / (1 + torch.exp(-gate)) * up


def rotary(x, positions, cos_sin_cache, is_neox):
    x = x.double().clone()
    rot = cos_sin_cache.shape[1]
    for t in range(x.shape[0]):
        row = cos_sin_cache[positions[t]].double()
        cos, sin = row[: rot // 2], row[rot // 2 :]
        for h in range(x.shape[1]):
            v = x[t, h].clone()
            for i in range(rot // 2):
                a, b = (i, i + rot // 2) if is_neox else (2 * i, 2 * i + 1)
                x[t, h, a] = v[a] * cos[i] - v[b] * sin[i]
                x[t, h, b] = v[b] * cos[i] + v[a] * sin[i]
    return x


def attention_one_query(q, keys, values, scale):
    """softmax(q . k * scale) @ v for one head; keys[N, D], values[N, Dv]."""
    if keys.shape[0] == 0:
        return torch.zeros(values.shape[1], dtype=torch.float64)
    scores = [float(q.double() @ k.double()) * scale for k in keys]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    out = torch.zeros(values.shape[1], dtype=torch.float64)
    for w, v in zip(weights, values, strict=True):
        out += w / total * v.double()
    return out


def token_kv(cache, block_table, position):
    page_size = cache.shape[1]
    return cache[int(block_table[position // page_size]), position % page_size]


def decode(q, k_cache, v_cache, block_tables, seq_lens, scale):
    batch, hq, _ = q.shape
    group = hq // k_cache.shape[2]
    out = torch.zeros(batch, hq, v_cache.shape[3], dtype=torch.float64)
    for b in range(batch):
        n = int(seq_lens[b])
        for h in range(hq):
            keys = (
                torch.stack([token_kv(k_cache, block_tables[b], p)[h // group] for p in range(n)])
                if n
                else torch.zeros(0, q.shape[2])
            )
            vals = (
                torch.stack([token_kv(v_cache, block_tables[b], p)[h // group] for p in range(n)])
                if n
                else torch.zeros(0, v_cache.shape[3])
            )
            out[b, h] = attention_one_query(q[b, h], keys, vals, scale)
    return out


def extend(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, causal):
    hq = q.shape[1]
    group = hq // k_cache.shape[2]
    out = torch.zeros(q.shape[0], hq, v_cache.shape[3], dtype=torch.float64)
    for b in range(len(seq_lens)):
        start, end, kv_len = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(seq_lens[b])
        for i, t in enumerate(range(start, end)):
            pos = kv_len - (end - start) + i
            visible = pos + 1 if causal else kv_len
            for h in range(hq):
                keys = torch.stack(
                    [token_kv(k_cache, block_tables[b], p)[h // group] for p in range(visible)]
                )
                vals = torch.stack(
                    [token_kv(v_cache, block_tables[b], p)[h // group] for p in range(visible)]
                )
                out[t, h] = attention_one_query(q[t, h], keys, vals, scale)
    return out


def dense_attention(q, keys, values, mask, scale):
    """Masked softmax attention with K/V repeated per query head; float64.

    ``q[Hq, M, D]``, ``keys[Hk, N, D]``, ``values[Hk, N, Dv]``, ``mask[M, N]`` (True = attend);
    rows with nothing to attend are zeros. The formulation the torch references used before
    they grouped query heads, kept as a second oracle that is fast enough for model shapes.
    """
    group = q.shape[0] // keys.shape[0]
    keys = keys.double().repeat_interleave(group, dim=0)
    values = values.double().repeat_interleave(group, dim=0)
    scores = (q.double() @ keys.transpose(-1, -2)) * scale
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
    return probs @ values


def token_slots(cache, block_table, length):
    """``[length, Hk, D]``: the request's first ``length`` tokens, one slot per token."""
    page_size = cache.shape[1]
    pos = torch.arange(length)
    slots = block_table.long()[pos // page_size] * page_size + pos % page_size
    return cache.reshape(-1, *cache.shape[2:])[slots]


def decode_dense(q, k_cache, v_cache, block_tables, seq_lens, scale):
    out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[3], dtype=torch.float64)
    for b, n in enumerate(seq_lens.tolist()):
        keys = token_slots(k_cache, block_tables[b], n).transpose(0, 1)
        values = token_slots(v_cache, block_tables[b], n).transpose(0, 1)
        mask = torch.ones(1, n, dtype=torch.bool)
        out[b] = dense_attention(q[b, :, None], keys, values, mask, scale)[:, 0]
    return out


def extend_dense(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, causal):
    out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[3], dtype=torch.float64)
    bounds = cu_seqlens_q.tolist()
    for b, n in enumerate(seq_lens.tolist()):
        start, end = bounds[b], bounds[b + 1]
        keys = token_slots(k_cache, block_tables[b], n).transpose(0, 1)
        values = token_slots(v_cache, block_tables[b], n).transpose(0, 1)
        q_pos = torch.arange(n - (end - start), n)
        mask = torch.arange(n)[None, :] <= q_pos[:, None] if causal else q_pos[:, None] >= 0
        attn = dense_attention(q[start:end].transpose(0, 1), keys, values, mask, scale)
        out[start:end] = attn.transpose(0, 1)
    return out


def fused_moe(x, w13, w2, topk_weights, topk_ids):
    x = x.double()
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            h = w13[e].double() @ x[t]
            gate, up = h[:inter], h[inter:]
            act = gate / (1 + torch.exp(-gate)) * up
            out[t] += float(topk_weights[t, j]) * (w2[e].double() @ act)
    return out


def moe_route(logits, top_k, scoring, renormalize, bias, n_group, topk_group, scale):
    """Returns per token a list of (expert, weight), in descending selection score."""
    result = []
    for row in logits.double():
        if scoring == "softmax":
            e = torch.exp(row - row.max())
            scores = e / e.sum()
        else:
            scores = 1 / (1 + torch.exp(-row))
        choice = scores + (bias.double() if bias is not None else 0)
        eligible = list(range(len(row)))
        if n_group and n_group > 1:
            size = len(row) // n_group
            group_score = []
            for g in range(n_group):
                members = sorted(choice[g * size : (g + 1) * size].tolist(), reverse=True)
                group_score.append(sum(members[:2]) if scoring == "sigmoid" else members[0])
            best = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
            eligible = [i for i in eligible if i // size in best]
        picked = sorted(eligible, key=lambda i: -float(choice[i]))[:top_k]
        weights = [float(scores[i]) for i in picked]
        if renormalize:
            total = sum(weights)
            weights = [w / total for w in weights]
        result.append([(i, w * scale) for i, w in zip(picked, weights, strict=True)])
    return result
