#!/usr/bin/env bash
# MLA kernels on a GPU: the GPU tests, the benchmark (FlashMLA decode shapes, prefill vs
# cuDNN SDPA) and a short decode launch-config sweep. One failing step does not stop the rest.
#   PYTHON=python3 bash benchmarks/mla/run_all.sh OUTDIR
set -uo pipefail
OUT="${1:?usage: run_all.sh OUTDIR}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1
status=0
run() {  # name, command...
  local name="$1"; shift
  echo "=== $name"
  if "$@" >"$OUT/$name.log" 2>&1; then echo "ok   $name"; else echo "FAIL $name (see $OUT/$name.log)"; status=1; fi
  tail -n 40 "$OUT/$name.log"
}
cd "$ROOT"
# PYTHONSAFEPATH: with the repository root on sys.path, our kernels/ would shadow Hugging
# Face's kernels package, which transformers >= 5.25 imports (as in the Makefile)
run mla_gpu_tests env PYTHONSAFEPATH=1 "$PY" -m pytest tests/gpu/test_mla_gpu.py -q -p no:cacheprovider
run mla_bench "$PY" -m tokenspeed.mla.bench --out "$OUT/mla_bench.json" ${BENCH_ARGS:-}
if [ -z "${SKIP_SWEEP:-}" ]; then
  run mla_sweep "$PY" -m tokenspeed.mla.bench --sweep --only sweep --sweep-seconds "${SWEEP_SECONDS:-30}" --out "$OUT/mla_sweep.json"
fi
echo "results in $OUT"
exit $status
