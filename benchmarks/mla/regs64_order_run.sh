# The GPU calls that check and time the 64-row FP8 register kernel's order of a tile of its own
# (scores, the other group's tile's values, softmax, own values; thirty-seventh session):
#   run(command="bash benchmarks/mla/regs64_order_run.sh tests", carry=[".whl-peer"])
#   run(command="bash benchmarks/mla/regs64_order_run.sh sweep", carry=[".whl-peer"])
#   run(command="bash benchmarks/mla/regs64_order_run.sh short", carry=[".whl-peer"])
#   run(command="bash benchmarks/mla/regs64_order_run.sh readings", carry=[".whl-peer"])
# after `bash benchmarks/mla/peer_wheels.sh` here. "tests": the 64-row kernel's and every GPU
# test its being the plan's choice reaches; "sweep": a trace at 128 heads and every FP8 shape's
# registry (q_len 1 and 2), then the loaders reading the block table before the slot wait
# (the default since the thirty-eighth session) against reading it after (late_pages);
# "short": the loaders' tests, then the same timing; "readings": every FlashMLA shape's
# registry, FlashInfer beside bf16 (~540 s).
source benchmarks/mla/peer_wheels.sh --install
prefetch_sweeps() {  # the loaders reading the block table after the slot wait, interleave $1
  timeout 100 python3 benchmarks/mla/sweep_decode.py --heads 64,128 --fp8 token --interleave $1 \
    --variants "registry,cute fp8 ring regs64 late_pages" \
    --out $OUT/sweep_regs64_late_pages.json 2>&1 | tail -5
  timeout 70 python3 benchmarks/mla/sweep_decode.py --heads 16,32 --fp8 token --interleave $1 \
    --variants "registry,cute fp8 ring regs late_pages" \
    --out $OUT/sweep_regs_late_pages.json 2>&1 | tail -5
}
if [ "${1:-}" = "tests" ]; then
  timeout 560 python3 -m pytest tests/gpu/test_mla_cute_gpu.py tests/gpu/test_mla_gpu.py \
    tests/gpu/test_deepseek_gpu.py -p no:cacheprovider -q -x \
    -k "more_than_32_rows or regs64 or cuda_graph or plan or fp8_flashmla or fp8_latent or page_prefetch" \
    2>&1 | grep -v Warning | tail -6
elif [ "${1:-}" = "readings" ]; then  # every FlashMLA shape's registry, FlashInfer beside bf16
  timeout 240 python3 benchmarks/mla/sweep_decode.py --heads 16,32,64,128 --interleave 6 \
    --variants "registry,flashinfer fa3" --out $OUT/sweep_bf16_registry_all.json 2>&1 | tail -10
  timeout 300 python3 benchmarks/mla/sweep_decode.py --heads 16,32,64,128 --q-lens 1,2 \
    --fp8 token --interleave 6 --variants "registry" \
    --out $OUT/sweep_fp8_registry_all.json 2>&1 | tail -10
elif [ "${1:-}" = "short" ]; then  # one call: the kernels' own tests, then the loader timed
  timeout 170 python3 -m pytest tests/gpu/test_mla_cute_gpu.py -p no:cacheprovider -q -x \
    -k "(regs64_ragged and True) or regs64_max_slack or regs64_page or page_prefetch" \
    2>&1 | grep -v Warning | tail -6
  prefetch_sweeps 6
else
  timeout 100 python3 benchmarks/mla/trace_regs64.py --heads 128 --out $OUT/trace_regs64.json \
    2>&1 | tail -2
  timeout 300 python3 benchmarks/mla/sweep_decode.py --heads 16,32,64,128 --q-lens 1,2 \
    --fp8 token --interleave 6 --variants "registry" \
    --out $OUT/sweep_fp8_registry_all.json 2>&1 | tail -10
  prefetch_sweeps 8
fi
nvidia-smi --query-gpu=name,clocks.sm --format=csv
