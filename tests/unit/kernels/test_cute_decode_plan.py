"""The CuTe DSL decode's launch plan and where the registry lets it run (pure logic: no GPU,
no CuTe DSL needed)."""

from __future__ import annotations

import pytest

from tokenspeed.kernels.cute_ops.configs import gqa_decode_config_space, gqa_decode_default_config


def _traits(batch: int, page_size: int, kv_heads: int = 8) -> dict:
    return {"batch": batch, "num_kv_heads": kv_heads, "page_size": page_size, "kv_len": 8192}


@pytest.mark.parametrize(
    ("batch", "page_size", "want"),
    [
        (16, 16, {"cluster": 2, "stages": 2}),  # 128 groups on 132 SMs, small pages: split
        (32, 16, {"cluster": 1, "stages": 2}),  # 256 groups already fill the SMs twice
        (16, 64, {"cluster": 1, "stages": 3}),  # one box per tile: one CTA per group keeps up
        (16, 128, {"cluster": 1, "stages": 3}),
    ],
)
def test_default_plan_by_page_size_and_groups(batch, page_size, want):
    cfg = gqa_decode_default_config(_traits(batch, page_size), sms=132)
    assert cfg == {**want, "evict_first": True}


def test_config_space_starts_with_the_default_and_has_no_duplicates():
    traits = _traits(16, 16)
    space = gqa_decode_config_space(traits, sms=132)
    assert space[0] == gqa_decode_default_config(traits, sms=132)
    assert len({tuple(sorted(c.items())) for c in space}) == len(space)
    assert {c["cluster"] for c in space} == {1, 2}


def test_registry_traits_keep_the_cute_decode_to_long_contexts_of_128_groups():
    """The candidate's rules: kv_groups (bucketed batch x KV heads) 128 and kv_len >= 4096, as
    measured (elsewhere the Triton decode was as fast or faster); bf16-friendly head dims."""
    from tokenspeed.kernels.catalog import CUTE_DECODE_TRAITS, CUTE_SM90

    def fits(**traits) -> bool:
        return all(CUTE_DECODE_TRAITS[k](v) for k, v in traits.items())

    base = {"head_dim": 128, "v_head_dim": 128, "group_size": 4, "page_size": 16}
    assert fits(**base, kv_groups=128, kv_len=8192)
    assert not fits(**base, kv_groups=512, kv_len=2048)
    assert not fits(**base, kv_groups=128, kv_len=2048)
    assert not fits(**{**base, "page_size": 24}, kv_groups=128, kv_len=8192)
    assert not fits(**{**base, "group_size": 32}, kv_groups=128, kv_len=8192)
    assert CUTE_SM90.min_compute == CUTE_SM90.max_compute == (9, 0)


@pytest.mark.parametrize(
    ("head_dim", "stages", "fits"),
    [(128, 6, True), (128, 7, False), (64, 8, True)],  # 32 KiB of K + V per 128-dim stage
)
def test_smem_bound_decides_which_rings_fit(head_dim, stages, fits):
    from tokenspeed.kernels.cute_ops.configs import SM90_SMEM_BYTES, gqa_decode_smem_bytes

    need = gqa_decode_smem_bytes(head_dim, stages)
    assert (need <= SM90_SMEM_BYTES) == fits
    assert need >= stages * 2 * 64 * head_dim * 2  # at least the ring itself


def test_config_space_fits_in_shared_memory():
    from tokenspeed.kernels.cute_ops.configs import SM90_SMEM_BYTES, gqa_decode_smem_bytes

    for cfg in gqa_decode_config_space(_traits(16, 16), sms=132):
        assert gqa_decode_smem_bytes(128, cfg["stages"]) <= SM90_SMEM_BYTES
