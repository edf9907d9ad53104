# GPU calls that time launches of the Triton MLA decode (the PORTABLE kernel; the registry picks
# the CuTe decodes on SM90) against its default, after `bash benchmarks/mla/peer_wheels.sh`:
#   run(command="bash benchmarks/mla/triton_space_run.sh space", carry=[".whl-peer"])
#   run(command="bash benchmarks/mla/triton_space_run.sh layouts", carry=[".whl-peer"])
# "space": the launches of triton_decode_space.json at 16-128 heads, q_len 1 (~140 s on an
# H100); "layouts": the Triton GPU tests, then the 16- and 32-row launches of
# triton_decode_layouts.json interleaved at q_len 1 and 2, bf16 and FP8 (~400 s).
# "tma": the TMA path's GPU tests, then triton_decode_tma.json at 16-128 heads (~280 s);
# "confirm": pointer-load and TMA launches beside the default, bf16 and FP8 (~200 s);
# "fp8_tma": the same over FP8 only; "tokens_tma": 32-row transposed launches, pointer loads
# against TMA, bf16 and FP8 (these three need no peer wheels);
# "modules": untracked copies mla/triton_decode_<name>.py (earlier or parked versions) timed
# beside the default over FP8, per token then per tensor, 16-128 heads (~300 s);
# "profile": Nsight Compute of the default launch at 16 / 32 / 64 heads (stalls, details).
# Kernels compile in four processes first (Triton's disk cache), so the timed pass only times.
case "${1:-}" in confirm|fp8_tma|tokens_tma|modules) ;; *) source benchmarks/mla/peer_wheels.sh --install >/dev/null 2>&1 ;; esac
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
sweep() {  # sweep NAME HEADS QLENS CONFIGS [args...]: compile in parallel, then time
  local name=$1 heads=$2 qlens=$3 cfg=$4; shift 4
  for h in ${heads//,/ }; do
    timeout 200 python3 benchmarks/mla/sweep_decode.py --heads $h --q-lens $qlens --replays 1 \
      --variants "triton default" --triton-configs $cfg "$@" > $OUT/warm_${name}_$h.log 2>&1 &
  done
  wait
  timeout 300 python3 benchmarks/mla/sweep_decode.py --heads $heads --q-lens $qlens \
    --variants "${VARIANTS:-triton default,registry}" --triton-configs $cfg --out $OUT/triton_$name.json \
    "$@" 2>&1 | grep -v "^{" | tail -60
}
if [ "${1:-}" = "space" ]; then
  sweep space 16,32,64,128 1 benchmarks/mla/triton_decode_space.json
elif [ "${1:-}" = "layouts" ]; then
  timeout 200 python3 -m pytest tests/gpu/test_mla_gpu.py -p no:cacheprovider -q -x \
    > $OUT/gpu_tests.log 2>&1
  grep -v Warning $OUT/gpu_tests.log | tail -8
  sweep layouts_bf16 16,32 1,2 benchmarks/mla/triton_decode_layouts.json --interleave 6
  sweep layouts_fp8 16,32 1 benchmarks/mla/triton_decode_layouts.json --interleave 4 --fp8 token
elif [ "${1:-}" = "tma" ]; then
  # whole tiles fetched by TMA: the GPU tests of that path, then its launches at 16-128 heads
  timeout 200 python3 -m pytest tests/gpu/test_mla_gpu.py -p no:cacheprovider -q -x -k tma \
    > $OUT/gpu_tests_tma.log 2>&1
  grep -v Warning $OUT/gpu_tests_tma.log | tail -8
  sweep tma_bf16 16,32,64,128 1 benchmarks/mla/triton_decode_tma.json
elif [ "${1:-}" = "confirm" ]; then
  # pointer-load and TMA launches beside the default, bf16 and FP8 (no
  # peer wheels, no CuTe: the Triton launches alone)
  VARIANTS="triton default"
  sweep confirm_bf16 16,64,128 1 benchmarks/mla/triton_decode_confirm.json --interleave 4
  sweep confirm_fp8 16,64,128 1 benchmarks/mla/triton_decode_confirm.json --interleave 4 \
    --fp8 token
elif [ "${1:-}" = "fp8_tma" ]; then
  # FP8 (per-token scales): pointer-load and TMA launches beside the default (no peer wheels)
  VARIANTS="triton default"
  sweep confirm_fp8 16,64,128 1 benchmarks/mla/triton_decode_confirm.json --interleave 4 \
    --fp8 token
elif [ "${1:-}" = "tokens_tma" ]; then
  # 32-row blocks, KV tokens on M, tiles by pointer loads or TMA; bf16 then FP8 (per token)
  VARIANTS="triton default"
  sweep tokens_tma_bf16 32 1,2 benchmarks/mla/triton_decode_tokens_tma.json --interleave 4
  sweep tokens_tma_fp8 32 1 benchmarks/mla/triton_decode_tokens_tma.json --interleave 4 \
    --fp8 token
elif [ "${1:-}" = "modules" ]; then
  # other versions of the decode (untracked copies mla/triton_decode_<name>.py, see
  # sweep_triton_modules.py) beside the default, FP8 per token then per tensor, all heads
  mods=$(ls mla/triton_decode_*.py | sed 's|mla/||;s|\.py$||' | paste -sd,)
  vars="triton default,$(echo $mods | sed 's/\(^\|,\)/\1triton /g')"
  echo "modules: $mods"
  for fp8 in token tensor; do
    for h in 16 32 64 128; do  # compile each module's launches in parallel first
      timeout 200 python3 benchmarks/mla/sweep_triton_modules.py --modules $mods --heads $h \
        --replays 1 --fp8 $fp8 --variants "$vars" > $OUT/warm_modules_${fp8}_$h.log 2>&1 &
    done
    wait
    timeout 240 python3 benchmarks/mla/sweep_triton_modules.py --modules $mods \
      --heads 16,32,64,128 --fp8 $fp8 --interleave 6 --variants "$vars" \
      --out $OUT/triton_modules_$fp8.json 2>&1 | grep -v "^{" | tail -30
  done
elif [ "${1:-}" = "profile" ]; then
  # Nsight Compute of the default launch at 16 / 32 / 64 heads: stall reasons per instruction
  export PATH=$PATH:/usr/local/cuda/bin
  for h in 16 32 64; do
    timeout 150 ncu --profile-from-start off --set full --clock-control none -o /tmp/ncu_$h \
      python3 benchmarks/mla/profile_decode.py --kernel triton --heads $h > $OUT/ncu_$h.log 2>&1
    ncu -i /tmp/ncu_$h.ncu-rep --page source --csv --print-source sass > /tmp/src_$h.csv
    python3 tools/ncu_stalls.py /tmp/src_$h.csv --top 25 --by-opcode --kernel split \
      > $OUT/stalls_$h.txt
    ncu -i /tmp/ncu_$h.ncu-rep --page details > $OUT/details_$h.txt
    head -30 $OUT/stalls_$h.txt
  done
else
  echo "usage: triton_space_run.sh space|layouts|tma|confirm|fp8_tma|tokens_tma|modules|profile" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,clocks.sm --format=csv
