# The GPU call that checks and times the 64-row FP8 register kernel as the default from 33 rows
# per request (it was the default only above 64): the plan's tests, then interleaved replays of
# the registry (now regs64) against the pairs kernel at 48, 64 and 128 rows. Timed in the
# thirty-sixth session (H100, docs/mla.md); its tests ran past 270 s at 121 of 137 and the
# rest were run in a second call, so give the pytest line more time.
#   run(command="bash benchmarks/mla/regs64_default_run.sh", carry=[".whl-peer"])
# after `bash benchmarks/mla/peer_wheels.sh` here.
source benchmarks/mla/peer_wheels.sh --install
timeout 400 python3 -m pytest tests/gpu/test_mla_cute_gpu.py tests/gpu/test_mla_gpu.py \
  tests/gpu/test_deepseek_gpu.py -p no:cacheprovider -q -x \
  -k "more_than_32_rows or regs64 or cuda_graph or plan or fp8_flashmla or fp8_latent" 2>&1 | grep -v Warning | tail -6
timeout 120 python3 benchmarks/mla/sweep_decode.py --heads 32,64 --q-lens 2 --fp8 token \
  --interleave 8 --variants "registry,cute fp8 ring pairs 2+2" \
  --out $OUT/sweep_regs64_default_q2.json 2>&1 | tail -4
timeout 90 python3 benchmarks/mla/sweep_decode.py --heads 16 --q-lens 3 --fp8 token \
  --interleave 8 --variants "registry,cute fp8 ring pairs 2+2" \
  --out $OUT/sweep_regs64_default_q3.json 2>&1 | tail -3
timeout 90 python3 benchmarks/mla/sweep_decode.py --heads 64 --fp8 tensor \
  --interleave 8 --variants "registry,cute fp8 ring pairs 2+2" \
  --out $OUT/sweep_regs64_default_tensor.json 2>&1 | tail -3
nvidia-smi --query-gpu=name,clocks.sm --format=csv
