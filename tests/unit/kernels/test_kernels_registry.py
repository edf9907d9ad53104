"""Registry and selection: filters, ranking, objectives, overrides, explanations, records."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import tokenspeed.kernels as K
from tokenspeed.kernels import (
    Capability,
    KernelSelectionError,
    Priority,
    explain_selection,
    kernel_override,
    load_kernel_config,
    register_kernel,
    select_kernel,
    selection_records,
)
from tokenspeed.kernels.catalog import OPS
from tokenspeed.kernels.device import DeviceInfo
from tokenspeed.kernels.registry import unregister_kernel
from tokenspeed.kernels.traits import at_most, bucket, one_of
from tokenspeed.kernels.tuned import TunedEntry, TuningTable, load_tuning_file

H200 = DeviceInfo(kind="cuda", vendor="nvidia", name="NVIDIA H200", compute=(9, 0), num_sms=132)
A100 = DeviceInfo(kind="cuda", vendor="nvidia", name="NVIDIA A100", compute=(8, 0), num_sms=108)
CPU = DeviceInfo(kind="cpu", vendor="cpu", name="cpu")
ANY = Capability(devices=("cpu", "cuda"))


def _impl(tag):
    def run(x):
        return tag, x

    run.__name__ = f"impl_{tag}"
    return run


@pytest.fixture
def fam():
    """A private op ``testop.run`` with a reference kernel; tests add more."""
    names = []

    def add(name, **kw):
        kw.setdefault("solution", name.split("_")[0])
        kw.setdefault("capability", ANY)
        register_kernel("testop", "run", name=name, impl=_impl(name), **kw)
        names.append(name)

    add("torch_ref", priority=Priority.REFERENCE, tags=("deterministic",))
    yield add
    for name in names:
        unregister_kernel("testop", "run", name)


def chosen(**kw):
    return explain_selection("testop", "run", kw.pop("signature", {"x": "float32"}), **kw)


def verdict(expl, name):
    return next(c for c in expl.candidates if c.kernel == name)


# CPU-only kernels that outrank the reference on CPU for the formats they declare.
CPU_CANDIDATES = {
    "attention.decode": "cpu_paged_decode",
    "attention.extend": "cpu_paged_extend",
}


def test_every_op_has_a_reference_and_cpu_picks_it_or_a_cpu_candidate():
    for family, mode, ref_name, _ in OPS:
        op = f"{family}.{mode}"
        expl = explain_selection(family, mode, {}, device="cpu")
        assert expl.chosen == CPU_CANDIDATES.get(op, ref_name), expl
        assert verdict(expl, ref_name).kept, expl
        debug = explain_selection(family, mode, {}, device="cpu", objective="debug")
        assert debug.chosen == ref_name, debug
        for cand in expl.candidates:
            # Higher bands (the SDPA extend candidate) exist but never run on CPU, except the
            # CPU-only candidates.
            cpu_only = cand.kernel == CPU_CANDIDATES.get(op)
            assert cand.band in ("PORTABLE", "REFERENCE") or not cand.kept or cpu_only, cand


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_cpu_attention_candidates_are_float32_only_and_torch_still_means_the_reference(mode):
    f32 = {"q": "float32", "kv_cache": "float32"}
    assert explain_selection("attention", mode, f32, device="cpu").chosen == f"cpu_paged_{mode}"
    bf16 = {"q": "bfloat16", "kv_cache": "bfloat16"}
    assert explain_selection("attention", mode, bf16, device="cpu").chosen == (
        f"torch_paged_{mode}"
    )
    forced = explain_selection("attention", mode, f32, device="cpu", override="torch")
    assert forced.chosen == f"torch_paged_{mode}"


def test_priority_bands_order():
    assert Priority.REFERENCE < Priority.PORTABLE < Priority.PERFORMANT
    assert Priority.PERFORMANT < Priority.SPECIALIZED < Priority.PLUGIN
    assert Priority.band_of(Priority.PORTABLE + 7) is Priority.PORTABLE


def test_highest_feasible_priority_wins(fam):
    fam("triton_a", priority=Priority.PORTABLE)
    fam("cuda_b", priority=Priority.PERFORMANT)
    expl = chosen(device=CPU)
    assert expl.chosen == "cuda_b"
    assert "highest priority" in expl.reason
    assert verdict(expl, "triton_a").kept and "ranked lower" in verdict(expl, "triton_a").reason
    assert select_kernel("testop", "run", {"x": "float32"}, device=CPU).run(1) == ("cuda_b", 1)


def test_format_signature_filter(fam):
    fam("bf16_only", priority=Priority.PERFORMANT, signatures=[{"x": "bfloat16"}])
    assert chosen(device=CPU).chosen == "torch_ref"
    why = verdict(chosen(device=CPU), "bf16_only").reason
    assert why.startswith("format:") and "x=float32" in why
    assert chosen(signature={"x": "bfloat16"}, device=CPU).chosen == "bf16_only"


def test_any_of_several_signature_patterns(fam):
    fam(
        "mixed",
        priority=Priority.PERFORMANT,
        signatures=[
            {"x": "bfloat16", "w": "float8_e4m3fn"},
            {"x": ("float16", "float32"), "w": "float16"},
        ],
    )
    assert chosen(signature={"x": "float32", "w": "float16"}, device=CPU).chosen == "mixed"
    assert chosen(signature={"x": "bfloat16", "w": "float8_e4m3fn"}, device=CPU).chosen == "mixed"
    assert chosen(signature={"x": "bfloat16", "w": "float16"}, device=CPU).chosen == "torch_ref"


def test_trait_filter(fam):
    fam(
        "small_heads",
        priority=Priority.PERFORMANT,
        traits={"head_dim": at_most(128), "page_size": one_of(16, 64)},
    )
    assert chosen(traits={"head_dim": 128, "page_size": 64}, device=CPU).chosen == "small_heads"
    expl = chosen(traits={"head_dim": 256, "page_size": 64}, device=CPU)
    assert expl.chosen == "torch_ref"
    assert "head_dim=256 not <= 128" in verdict(expl, "small_heads").reason
    expl = chosen(traits={"head_dim": 64, "page_size": 1}, device=CPU)
    assert "page_size=1 not in {16, 64}" in verdict(expl, "small_heads").reason


def test_capability_filters(fam):
    fam(
        "hopper_only",
        priority=Priority.SPECIALIZED,
        capability=Capability(devices=("cuda",), min_compute=(9, 0)),
    )
    fam(
        "amd_only",
        priority=Priority.PLUGIN,
        capability=Capability(devices=("cuda",), vendors=("amd",)),
    )
    fam(
        "needs_mod",
        priority=Priority.PLUGIN,
        capability=Capability(requires=("no_such_module_xyz",)),
    )
    assert chosen(device=H200).chosen == "hopper_only"
    expl = chosen(device=A100)
    assert expl.chosen == "torch_ref"
    assert "compute capability >= (9, 0)" in verdict(expl, "hopper_only").reason
    assert "amd" in verdict(expl, "amd_only").reason
    assert "no_such_module_xyz" in verdict(expl, "needs_mod").reason
    assert "not cpu" in verdict(chosen(device=CPU), "hopper_only").reason


def test_interpretable_kernels_run_on_cpu_only_when_named(fam, monkeypatch):
    fam(
        "triton_k",
        priority=Priority.PORTABLE,
        capability=Capability(devices=("cuda",), interpretable=True),
    )
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    expl = chosen(device=CPU)
    assert expl.chosen == "torch_ref"
    assert "only if named" in verdict(expl, "triton_k").reason
    assert chosen(device=CPU, override="triton_k").chosen == "triton_k"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "needs a GPU" in verdict(chosen(device=CPU), "triton_k").reason
    with pytest.raises(KernelSelectionError, match="needs a GPU"):
        select_kernel("testop", "run", {"x": "float32"}, device=CPU, override="triton_k")


def test_objectives(fam):
    fam("fast_latency", priority=Priority.PORTABLE, tags=("latency",))
    fam("big_throughput", priority=Priority.PORTABLE + 1, tags=("throughput",))
    fam("vendor", priority=Priority.PERFORMANT)
    assert chosen(device=CPU).chosen == "vendor"
    assert chosen(device=CPU, objective="latency").chosen == "fast_latency"
    assert chosen(device=CPU, objective="throughput").chosen == "big_throughput"
    assert chosen(device=CPU, objective="portability").chosen == "big_throughput"
    expl = chosen(device=CPU, objective="determinism")
    assert expl.chosen == "torch_ref" and "determinism" in verdict(expl, "vendor").reason
    expl = chosen(device=CPU, objective="debug")
    assert expl.chosen == "torch_ref" and "reference" in verdict(expl, "vendor").reason
    with pytest.raises(ValueError, match="unknown objective"):
        chosen(device=CPU, objective="fastest")


def test_override_precedence_env_then_argument_then_context_then_file(fam, tmp_path, monkeypatch):
    for name in ("env_k", "arg_k", "ctx_k", "file_k"):
        fam(name, priority=Priority.PORTABLE)
    fam("best", priority=Priority.PERFORMANT)
    config = tmp_path / "kernels.toml"
    config.write_text('[overrides]\n"testop.run" = "file_k"\n')
    load_kernel_config(config)

    def pick(**kw):
        return select_kernel("testop", "run", {"x": "float32"}, device=CPU, **kw)

    assert pick().name == "file_k" and "from config" in pick().reason
    with kernel_override("testop.run", "ctx_k"):
        assert pick().name == "ctx_k"
        assert pick(override="arg_k").name == "arg_k"
        monkeypatch.setenv(K.env_var_name("testop", "run"), "env_k")
        assert pick(override="arg_k").name == "env_k"
        assert "from env" in pick().reason
        monkeypatch.delenv(K.env_var_name("testop", "run"))
    assert pick().name == "file_k"


def test_env_var_name_and_solution_overrides(fam, monkeypatch):
    assert K.env_var_name("attention", "decode") == "TOKENSPEED_KERNEL_OVERRIDE_ATTENTION_DECODE"
    assert (
        K.env_var_name("norm", "fused_add_rms") == "TOKENSPEED_KERNEL_OVERRIDE_NORM_FUSED_ADD_RMS"
    )
    fam("cuda_x", priority=Priority.PERFORMANT)
    monkeypatch.setenv("TOKENSPEED_KERNEL_OVERRIDE_TESTOP_RUN", "torch")  # a solution name
    assert select_kernel("testop", "run", {}, device=CPU).name == "torch_ref"


def test_nested_context_overrides(fam):
    fam("a_k", priority=Priority.PORTABLE)
    fam("b_k", priority=Priority.PORTABLE)
    with kernel_override({"testop.run": "a_k"}):
        with kernel_override("testop.run", "b_k"):
            assert select_kernel("testop", "run", {}, device=CPU).name == "b_k"
        assert select_kernel("testop", "run", {}, device=CPU).name == "a_k"
    assert "override" not in select_kernel("testop", "run", {}, device=CPU).reason


def test_bad_overrides_fail_loudly_but_explain_does_not(fam):
    fam("bf16_k", priority=Priority.PORTABLE, signatures=[{"x": "bfloat16"}])
    with pytest.raises(KernelSelectionError, match="no kernel or solution"):
        select_kernel("testop", "run", {"x": "float32"}, device=CPU, override="nope")
    with pytest.raises(KernelSelectionError, match="format"):
        select_kernel("testop", "run", {"x": "float32"}, device=CPU, override="bf16_k")
    expl = chosen(device=CPU, override="bf16_k")
    assert expl.chosen == "torch_ref" and "cannot be used" in expl.reason


def test_selection_is_cached_per_key_and_refreshed_on_registration(fam):
    first = select_kernel("testop", "run", {"x": "float32"}, traits={"n": 4}, device=CPU)
    assert select_kernel("testop", "run", {"x": "float32"}, traits={"n": 4}, device=CPU) is first
    assert (
        select_kernel("testop", "run", {"x": "float32"}, traits={"n": 8}, device=CPU) is not first
    )
    fam("newer", priority=Priority.PLUGIN)
    assert (
        select_kernel("testop", "run", {"x": "float32"}, traits={"n": 4}, device=CPU).name
        == "newer"
    )


def test_records_are_plain_data_with_op_bucket_kernel_reason(fam):
    select_kernel(
        "testop", "run", {"x": "bfloat16"}, traits={"num_tokens": bucket(100)}, device=CPU
    )
    K.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)
    records = selection_records()
    json.dumps(records)  # plain data
    mine = [r for r in records if r["op"] == "testop.run"]
    assert mine and mine[0]["kernel"] == "torch_ref"
    assert mine[0]["bucket"] == "x=bfloat16|num_tokens=128"
    assert mine[0]["reason"] == "only feasible kernel"
    assert {r["op"] for r in records} >= {"testop.run", "norm.rms"}
    info = K.kernel_info()
    json.dumps(info)
    assert info["selections"] == records


def test_explanation_is_printable_and_serialisable(fam):
    fam("cuda_only", priority=Priority.PERFORMANT, capability=Capability(devices=("cuda",)))
    expl = chosen(device=CPU)
    text = str(expl)
    assert (
        "testop.run on cpu" in text and "dropped cuda_only" in text and "kept    torch_ref" in text
    )
    assert json.loads(json.dumps(expl.to_dict()))["chosen"] == "torch_ref"


def _tuning_table(kernel, config, device=H200):
    from tokenspeed.kernels.device import triton_version
    from tokenspeed.kernels.selection import shape_bucket

    bucket_key = shape_bucket({"x": "bfloat16"}, {"n": 64})
    return TuningTable(
        device=device.name,
        device_slug=device.slug,
        triton=triton_version(),
        entries={
            "testop.run": {
                bucket_key: TunedEntry(kernel, config, time_us=10.0, default_time_us=15.0)
            }
        },
    )


def test_tuned_results_rank_first_and_supply_the_config(fam, tmp_path):
    fam("triton_t", priority=Priority.PORTABLE, config_space="x:y", default_config=None)
    fam("vendor_t", priority=Priority.PERFORMANT)
    path = _tuning_table("triton_t", {"block": 32}).save(tmp_path / "h200.json")
    load_tuning_file(path)
    expl = chosen(signature={"x": "bfloat16"}, traits={"n": 64}, device=H200)
    assert expl.chosen == "triton_t"
    assert "tuned" in expl.reason and "1.50x" in expl.reason
    assert dict(expl.config) == {"block": 32}
    assert verdict(expl, "triton_t").tuned
    # Another bucket, device or Triton version: the tuned entry does not apply.
    assert chosen(signature={"x": "bfloat16"}, traits={"n": 128}, device=H200).chosen == "vendor_t"
    assert chosen(signature={"x": "bfloat16"}, traits={"n": 64}, device=A100).chosen == "vendor_t"


def test_tuning_file_for_another_triton_version_is_ignored(fam, tmp_path):
    fam("triton_t", priority=Priority.PORTABLE)
    fam("vendor_t", priority=Priority.PERFORMANT)
    table = _tuning_table("triton_t", {})
    table.triton = "0.0.1"
    load_tuning_file(table.save(tmp_path / "old.json"))
    assert chosen(signature={"x": "bfloat16"}, traits={"n": 64}, device=H200).chosen == "vendor_t"
    assert K.loaded_tuning_tables()[0]["usable"] is False


def test_default_tuning_path_is_loaded_lazily(fam, tmp_path, monkeypatch):
    fam("triton_t", priority=Priority.PORTABLE)
    fam("vendor_t", priority=Priority.PERFORMANT)
    monkeypatch.setenv("TOKENSPEED_KERNEL_CACHE_DIR", str(tmp_path))
    assert K.default_tuning_path(H200) == tmp_path / "nvidia-h200.json"
    _tuning_table("triton_t", {}).save(K.default_tuning_path(H200))
    assert chosen(signature={"x": "bfloat16"}, traits={"n": 64}, device=H200).chosen == "triton_t"


def test_toml_config_points_at_a_tuning_file(fam, tmp_path):
    fam("triton_t", priority=Priority.PORTABLE)
    fam("vendor_t", priority=Priority.PERFORMANT)
    _tuning_table("triton_t", {}).save(tmp_path / "tuned.json")
    (tmp_path / "k.toml").write_text('tuning = "tuned.json"\n[overrides.norm]\nrms = "torch"\n')
    assert load_kernel_config(tmp_path / "k.toml") == {"norm.rms": "torch"}
    assert chosen(signature={"x": "bfloat16"}, traits={"n": 64}, device=H200).chosen == "triton_t"
    assert "from config" in select_kernel("norm", "rms", {}, device="cpu").reason
    (tmp_path / "bad.toml").write_text('[overrides]\nrms = "torch"\n')
    with pytest.raises(ValueError, match="family.mode"):
        load_kernel_config(tmp_path / "bad.toml")


def test_json_kernel_config_is_a_tuning_file(fam, tmp_path):
    fam("triton_t", priority=Priority.PORTABLE)
    path = _tuning_table("triton_t", {}).save(tmp_path / "t.json")
    load_kernel_config(path)
    assert K.loaded_tuning_tables()[0]["path"] == str(path)


def test_plugins_register_through_entry_points(monkeypatch):
    from tokenspeed.kernels import plugins

    class FakeEntryPoint:
        def __init__(self, name, target):
            self.name, self._target = name, target

        def load(self):
            if isinstance(self._target, Exception):
                raise self._target
            return self._target

    def register():
        register_kernel(
            "testop",
            "run",
            name="plugin_k",
            solution="plugin",
            impl=_impl("plugin_k"),
            capability=ANY,
            priority=Priority.PLUGIN,
        )

    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.setattr(plugins, "_errors", {})
    monkeypatch.setattr(
        plugins,
        "entry_points",
        lambda group: [
            FakeEntryPoint("good", register),
            FakeEntryPoint("broken", ImportError("no lib")),
        ],
    )
    register_kernel(
        "testop", "run", name="torch_ref", solution="torch", impl=_impl("r"), capability=ANY
    )
    try:
        assert select_kernel("testop", "run", {}, device=CPU).name == "plugin_k"
        assert "no lib" in K.plugin_errors()["broken"]
    finally:
        unregister_kernel("testop", "run", "plugin_k")
        unregister_kernel("testop", "run", "torch_ref")


def test_duplicate_names_are_rejected(fam):
    with pytest.raises(ValueError, match="already registered"):
        register_kernel("testop", "run", name="torch_ref", solution="torch", impl=_impl("x"))


def _run_isolated(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_is_lazy_and_never_touches_the_runtime():
    out = _run_isolated(
        """
        import sys, torch
        import tokenspeed.kernels as K
        K.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)
        print(sorted(m for m in sys.modules if m == "triton" or m.startswith("tokenspeed.runtime")))
        """
    )
    assert out.strip() == "[]"


def test_without_triton_only_torch_kernels_are_registered():
    out = _run_isolated(
        """
        import sys, torch
        sys.modules["triton"] = None  # import triton now fails, as if it were not installed
        import tokenspeed.kernels as K
        print(sorted({k.solution for k in K.all_kernels()}))
        print(K.silu_and_mul(torch.ones(1, 4)).tolist())
        """
    )
    # The references, the SDPA extend and CPU decode candidates (plain torch); no Triton.
    # The CuTe DSL decode needs no Triton: it is listed wherever CuTe DSL is installed.
    cute = ["cute"] if importlib.util.find_spec("cutlass") else []
    assert out.splitlines() == [
        str(sorted(["sdpa", "torch", "torch_cpu", *cute])),
        "[[0.7310585975646973, 0.7310585975646973]]",
    ]
