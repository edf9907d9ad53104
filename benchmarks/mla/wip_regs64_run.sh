# The GPU calls that check and measure branch wip/fp8-regs64-early-max (two calls, ~8 min each):
#   run(command="bash benchmarks/mla/wip_regs64_run.sh tests", carry=[".whl-peer"])
#   run(command="bash benchmarks/mla/wip_regs64_run.sh sweep", carry=[".whl-peer"])
# after `bash benchmarks/mla/peer_wheels.sh` here. Merge only if the tests pass; keep
# early_max on only if the sweep shows it faster than late_max.
source benchmarks/mla/peer_wheels.sh --install
cd $PWD
if [ "${1:-}" = "tests" ]; then
  timeout 540 python3 -m pytest tests/gpu/test_mla_cute_gpu.py -p no:cacheprovider -q -x \
    -k "regs or registers" 2>&1 | grep -v Warning | tail -12
else
  timeout 540 python3 benchmarks/mla/sweep_decode.py --heads 16,32,64,128 --fp8 token \
    --interleave 8 --variants "registry,cute fp8 ring regs64,cute fp8 ring regs64 late_max,cute fp8 ring pairs 2+2,cute fp8 ring regs64 ablation l2_loads" \
    --out $OUT/sweep_regs64_early_max.json 2>&1 | tail -24
fi
nvidia-smi --query-gpu=name,clocks.sm --format=csv
