# The GPU calls that check and time the CuTe MLA decodes the plan picks (bf16: tokens on M up
# to 32 rows, pairs of tiles above; FP8: widened in registers, 16/32/64-row blocks):
#   run(command="bash benchmarks/mla/cute_decode_run.sh tests1", carry=[".whl-peer"])
#   run(command="bash benchmarks/mla/cute_decode_run.sh readings", carry=[".whl-peer"])
# after `bash benchmarks/mla/peer_wheels.sh` here. "tests1" / "tests2": each half of the CuTe
# decode GPU tests (~360 s each on an H100); "tests-engine": the registry's MLA tests and the
# DeepSeek-V3 and runtime engine tests (~300 s); "readings": every
# FlashMLA shape's registry, FlashInfer beside bf16, then FP8 at q_len 1 and 2 (~400 s);
# "pairs64": the bf16 64-head shape, where the H200 read 80 % of copy against FlashInfer's 85
# % (forty-second session): the pairs kernel's tiles and rope release, and its ring filled
# from L2, beside FlashInfer (~120 s). "spec": the speculative-decoding GPU tests (the
# verify-row check against a plain decode at V3 shapes, the strided per-request views) and
# the MTP timing of docs/performance.md (~300 s on an H100).
source benchmarks/mla/peer_wheels.sh --install
if [ "${1:-}" = "tests1" ] || [ "${1:-}" = "tests2" ]; then
  # the CuTe decode tests take ~720 s on an H100, more than one call may run: each call runs
  # half of them (tests1 the first, tests2 the second; the log comes back with $OUT even when
  # the limit cuts a run short, and its dots count)
  python3 -m pytest tests/gpu/test_mla_cute_gpu.py --collect-only -q -p no:cacheprovider \
    | grep "::" > $OUT/ids.txt
  half=$(( ($(wc -l < $OUT/ids.txt) + 1) / 2 ))
  if [ "$1" = "tests1" ]; then head -n $half $OUT/ids.txt; else tail -n +$((half + 1)) $OUT/ids.txt; fi \
    > $OUT/part.txt
  mapfile -t ids < $OUT/part.txt  # one node id a line (ids hold spaces and brackets)
  timeout 540 python3 -m pytest "${ids[@]}" -p no:cacheprovider -q -x --durations=10 \
    > $OUT/gpu_tests.log 2>&1
  grep -v Warning $OUT/gpu_tests.log | tail -20
elif [ "${1:-}" = "tests-engine" ]; then
  # the registry's MLA tests and the DeepSeek / runtime engine tests (~300 s on an H100)
  timeout 540 python3 -m pytest tests/gpu/test_mla_gpu.py tests/gpu/test_deepseek_gpu.py \
    tests/gpu/test_runtime_gpu.py -p no:cacheprovider -q -x > $OUT/gpu_tests.log 2>&1
  grep -v Warning $OUT/gpu_tests.log | tail -20
elif [ "${1:-}" = "readings" ]; then
  timeout 240 python3 benchmarks/mla/sweep_decode.py --heads 16,32,64,128 --interleave 6 \
    --variants "registry,flashinfer fa3" --out $OUT/sweep_bf16_registry_all.json 2>&1 | tail -10
  timeout 300 python3 benchmarks/mla/sweep_decode.py --heads 16,32,64,128 --q-lens 1,2 \
    --fp8 token --interleave 6 --variants "registry" \
    --out $OUT/sweep_fp8_registry_all.json 2>&1 | tail -10
elif [ "${1:-}" = "pairs64" ]; then
  timeout 300 python3 benchmarks/mla/sweep_decode.py --heads 64 --interleave 10 \
    --variants "registry,flashinfer fa3,cute pairs t32,cute pairs t32 lazy,cute pairs t64 rope,cute ablation l2_loads,cute pairs t32 ablation l2_loads" \
    --out $OUT/sweep_bf16_pairs64.json 2>&1 | grep -v "^{" | tail -10
elif [ "${1:-}" = "spec" ]; then
  timeout 200 python3 -m pytest tests/gpu/test_deepseek_gpu.py tests/gpu/test_mla_cute_gpu.py \
    -k "ngram or mtp or verify or strided" -p no:cacheprovider -q -rA 2>&1 \
    | grep -E "PASSED|FAILED|ERROR|passed|failed|assert" | head -20
  timeout 260 python3 benchmarks/speculative_decoding.py --algorithm MTP --draft-tokens 2 \
    --device cuda --model deepseek-v3 --load-format dummy --dtype bfloat16 \
    --hf-overrides '{"num_hidden_layers": 8, "first_k_dense_replace": 1, "n_routed_experts": 16, "vocab_size": 32768}' \
    --num-prompts 32 --batch 32 --prompt-len 512 --output-len 64 --repeats 2 \
    --control --out $OUT/mtp_k2_dummy_v3_8layer.json 2>&1 | grep -E "part|median|plain|mtp|speedup" | head -20
else
  echo "usage: cute_decode_run.sh tests1|tests2|tests-engine|readings|pairs64|spec" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,clocks.sm --format=csv
