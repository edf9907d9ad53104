#!/usr/bin/env bash
# The MLA sweep's device kit: CuTe DSL and FlashInfer (the peer) for the lent H200, which lacks
# both, in one carry under the 64 MiB a call may take (the two wheels are 66 MB; their trees as
# tar.xz are 45 MB), plus xgrammar for the structured-output GPU test. Git-ignored, like
# ../shared/device's .whl folders.
#   bash benchmarks/mla/peer_wheels.sh          # here, once: .whl-peer/ (about 46 MB)
#   run(carry=[".whl-peer"]): source benchmarks/mla/peer_wheels.sh --install && python3 benchmarks/mla/sweep_decode.py ...
# FlashInfer 0.6.6 is the version every peer number in docs/mla*.md was measured with.
if [ "${1:-}" = "--install" ]; then  # on the device, sourced from the repository root
  mkdir -p /tmp/site
  python3 -c "import tarfile
for t in ('.whl-peer/cdsl.tar.xz', '.whl-peer/flashinfer.tar.xz'): tarfile.open(t).extractall('/tmp/site')"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl-peer/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/python_packages:/tmp/site:$PWD/benchmarks/mla
  export CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH FLASHINFER_CUDA_ARCH_LIST=9.0a
  export PYTHONUNBUFFERED=1
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  python3 -c "import cutlass, flashinfer; print('cutlass-dsl and flashinfer', flashinfer.__version__)"
  return 0 2>/dev/null || exit 0
fi
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .git/info .whl-peer
grep -qx '/.whl-peer/' .git/info/exclude 2>/dev/null || echo '/.whl-peer/' >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
          --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
          --platform manylinux2014_x86_64 --platform any -d "$1" "${@:2}" 2>&1 | grep -vi warning || true; }
get "$work" nvidia-cutlass-dsl==4.3.5 flashinfer-python==0.6.6
# FlashInfer's imports that the image lacks (cudnn-frontend left out: the MLA path never uses it)
get .whl-peer "apache-tvm-ffi>=0.1.6,<0.2" einops nvidia-ml-py tabulate xgrammar==0.2.8
python3 - "$work" <<'PY'
import glob, sys, zipfile
work = sys.argv[1]
for name, pattern in (("c", "nvidia_cutlass_dsl-*.whl"), ("f", "flashinfer_python-*.whl")):
    (wheel,) = glob.glob(f"{work}/{pattern}")
    zipfile.ZipFile(wheel).extractall(f"{work}/{name}")
PY
tar -C "$work/c" -cf - . | xz -T0 -7 > .whl-peer/cdsl.tar.xz
tar -C "$work/f" -cf - . | xz -T0 -7 > .whl-peer/flashinfer.tar.xz
du -sh .whl-peer
