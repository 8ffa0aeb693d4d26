#!/usr/bin/env bash
# The baseline (v1) kernels on an emulated CPU without AVX: qemu-user's Nehalem (SSE4.2, no AVX,
# 2008) runs this environment's python over a subset of the op tests, NORMLAB_CPU_LEVEL unset, so
# the library must pick v1 by itself (cpuid under the emulator reports Nehalem; /proc/cpuinfo would
# show the host). The emulator raises SIGILL on any AVX/AVX2/AVX-512 instruction: a kernel, the
# level choice or a static initialiser run at load that used one would crash the run. Also checks
# the library statically (scripts/check-isa.py) and that a forced v4 is refused there.
#
#   scripts/qemu-baseline-tests.sh [pytest args...]      # default: the subset below
#
# Needs qemu-user (Debian: apt-get install qemu-user) and the extension built (setup.py
# build_ext --inplace, or installed). The emulator is slow (about 20-50x): a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v qemu-x86_64 >/dev/null || { echo "qemu-baseline: needs qemu-x86_64 (apt-get install qemu-user)"; exit 2; }
PY=$(python -c 'import sys; print(sys.executable)')
export OMP_NUM_THREADS=2 PYTHONDONTWRITEBYTECODE=1
unset NORMLAB_CPU_LEVEL
EMU=(qemu-x86_64 -cpu Nehalem)

python scripts/check-isa.py

echo "qemu-baseline: control: an AVX2 instruction under the emulated Nehalem must be refused (SIGILL)"
probe=$(mktemp -d)
cat > "$probe/p.c" <<'C'
#include <immintrin.h>
#include <stdio.h>
int main(int argc, char** argv) {
  volatile float in[8] = {1, 2, 3, 4, 5, 6, 7, (float)argc}, out[8];
  __m256 a = _mm256_loadu_ps((const float*)in);
  _mm256_storeu_ps((float*)out, _mm256_add_ps(a, a));
  printf("%g\n", out[7]);
  return 0;
}
C
cc -O1 -mavx2 "$probe/p.c" -o "$probe/p"
if "${EMU[@]}" "$probe/p" 2>/dev/null; then echo "qemu-baseline: the emulator ran AVX2: no proof"; exit 1; fi
rm -rf "$probe"

echo "qemu-baseline: the level chosen on the emulated Nehalem"
"${EMU[@]}" "$PY" -c "from normlab.ops import extension; i = extension.cpu_level(); print(i); assert i['level'] == 'v1', i" 2>&1 | grep -v "TCG doesn't support"
out=$(NORMLAB_CPU_LEVEL=v4 "${EMU[@]}" "$PY" -c "
try:
    import normlab
except ImportError as e:
    print('refused:', e)" 2>&1 | grep -v "TCG doesn't support")
echo "$out"
grep -q "refused: .*lacks.*avx512f" <<<"$out"

if [ $# -eq 0 ]; then
    # the differential tests: every family's paths at shapes drawn from the bound level's lanes
    # (chains, tails, chunk and task boundaries), each op against torch and float64; and DyT's
    set -- tests/ops/test_differential.py tests/ops/dyt/test_dyt.py
fi
echo "qemu-baseline: pytest $* on the emulated Nehalem"
"${EMU[@]}" "$PY" -m pytest -q -n 0 -p no:cacheprovider "$@" 2>&1 | grep -v "TCG doesn't support"
exit "${PIPESTATUS[0]}"
