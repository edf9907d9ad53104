# The GPU call that checks and measures this branch (run: bash benchmarks/mla/wip_max_slack_run.sh).
source benchmarks/mla/peer_wheels.sh --install
cd $PWD
echo "== tests"; timeout 230 python3 -m pytest tests/gpu/test_mla_cute_gpu.py -p no:cacheprovider -q -k "slack" 2>&1 | tail -6
echo "== sweep"; timeout 200 python3 benchmarks/mla/sweep_decode.py --heads 16,32 --fp8 token --interleave 10 --variants "registry,cute fp8 ring regs slack4,cute fp8 ring regs slack8,cute fp8 ring regs ablation l2_loads,cute fp8 ring regs slack8 ablation l2_loads" --out $OUT/sweep_slack_token.json 2>&1 | tail -16
echo "== trace"; timeout 60 python3 benchmarks/mla/trace_regs.py --heads 16,32 --out $OUT/trace_regs.json 2>&1 | tail -3
echo "== rate"; timeout 80 python3 benchmarks/mla/wgmma_rate.py --feed --n 16,32 --groups 2,3,4 --buffers 2,3,4 --out $OUT/wgmma_rate_feed_buffers.json 2>&1 | python3 -c "
import sys, json
for l in sys.stdin:
    try: r = json.loads(l)
    except Exception: print(l.rstrip()); continue
    print(r['n'], r['groups'], r['buffers'], round(r['ns_per_wgmma'], 2), round(r['cycles_per_wgmma'], 1))"
echo "== rate64"; timeout 60 python3 benchmarks/mla/wgmma_rate.py --feed --n 64 --groups 1,2 --buffers 2,3 --out $OUT/wgmma_rate_feed_n64.json 2>&1 | tail -8
timeout 40 python3 benchmarks/mla/wgmma_rate.py --n 64 --groups 1,2 --out $OUT/wgmma_rate_n64.json 2>&1 | tail -4
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
