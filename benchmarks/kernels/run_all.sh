#!/usr/bin/env bash
# Run every kernel benchmark and the GPU kernel tests; one failing step does not stop the rest.
#   benchmarks/kernels/run_all.sh OUTDIR
set -uo pipefail
OUT="${1:?usage: run_all.sh OUTDIR}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python
mkdir -p "$OUT"
unset TRITON_INTERPRET
status=0
run() {  # name, command...
  local name="$1"; shift
  echo "=== $name"
  if "$@" >"$OUT/$name.log" 2>&1; then echo "ok   $name"; else echo "FAIL $name (see $OUT/$name.log)"; status=1; fi
  tail -n 5 "$OUT/$name.log"
}
cd "$ROOT"
# PYTHONSAFEPATH: with the repository root on sys.path, our kernels/ would shadow Hugging
# Face's kernels package, which transformers >= 5.25 imports (as in the Makefile)
run gpu_tests env PYTHONSAFEPATH=1 "$PY" -m pytest tests/gpu -q -p no:cacheprovider
run numerics "$PY" -m tokenspeed.kernels.numerics --device cuda
for bench in decode_attention extend_attention fused_moe rms_norm; do
  run "bench_$bench" "$PY" "$HERE/bench_$bench.py" --out "$OUT/$bench.json" ${BENCH_ARGS:-}
done
echo "results in $OUT"
exit $status
