# The GPU calls that check and time the 64-row FP8 kernel's early_max (two calls, ~8 min each):
#   run(command="bash benchmarks/mla/regs64_early_max_run.sh tests", carry=[".whl-peer"])
#   run(command="bash benchmarks/mla/regs64_early_max_run.sh sweep", carry=[".whl-peer"])
# after `bash benchmarks/mla/peer_wheels.sh` here. The tests passed (188, H100, thirty-fourth
# session); early_max is off by default until the sweep shows it faster than without.
source benchmarks/mla/peer_wheels.sh --install
cd $PWD
if [ "${1:-}" = "tests" ]; then
  timeout 540 python3 -m pytest tests/gpu/test_mla_cute_gpu.py -p no:cacheprovider -q -x \
    -k "regs or registers" 2>&1 | grep -v Warning | tail -12
else
  timeout 100 python3 benchmarks/mla/trace_regs64.py --heads 128 --out $OUT/trace_regs64.json \
    2>&1 | tail -2
  timeout 100 python3 benchmarks/mla/trace_regs64.py --heads 128 --config '{"early_max": 1}' \
    --out $OUT/trace_regs64_early_max.json 2>&1 | tail -2
  timeout 240 python3 benchmarks/mla/sweep_decode.py --heads 64,128 --fp8 token \
    --interleave 8 --variants "registry,cute fp8 ring regs64,cute fp8 ring regs64 early_max,cute fp8 ring pairs 2+2,cute fp8 ring regs64 ablation l2_loads" \
    --out $OUT/sweep_regs64_early_max.json 2>&1 | tail -12
  # the 16/32-row kernel with its loads addressed from few bases: against the previous
  # session's readings on the same kind of card (117.8 / 126.6 us on an H100)
  timeout 90 python3 benchmarks/mla/sweep_decode.py --heads 16,32 --fp8 token \
    --interleave 8 --variants "registry" --out $OUT/sweep_regs_offsets.json 2>&1 | tail -4
fi
nvidia-smi --query-gpu=name,clocks.sm --format=csv
