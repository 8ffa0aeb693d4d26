#!/usr/bin/env bash
# The wheel as a user meets it: build it (pip wheel), install it into a fresh virtual environment
# with no C++ compiler on PATH, check the level it binds and the torch it records, and run tests
# against the installed copy (not the source tree).
#
#   scripts/wheel-check.sh [pytest args...]     # default: tests/ops/test_extension.py tests/ops/dyt
#
# Run it with the environment that has torch 2.13.0 active (the README's .venv): the fresh
# environment gets torch, numpy and the test tools from it through a .pth line (no download), and
# normlab only from the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SITE=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BASE=$(python -c 'import sys; print(sys._base_executable)')
rm -rf dist
start=$(date +%s)
pip wheel -q --no-build-isolation --no-deps . -w dist
echo "wheel-check: built $(ls dist/*.whl) in $(( $(date +%s) - start )) s"
work=$(mktemp -d)
"$BASE" -m venv "$work/venv"
echo "$SITE" > "$work/venv/lib/python$("$BASE" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')/site-packages/from-build-env.pth"
mkdir "$work/bin"
for t in sh bash env uname cat ls rm mkdir cp mv ln grep sed; do ln -s "$(command -v $t)" "$work/bin/$t"; done
NOCC="$work/venv/bin:$work/bin"
env -i HOME="$HOME" PATH="$NOCC" bash -c '! command -v cc c++ gcc g++ >/dev/null' || { echo "wheel-check: a compiler is on PATH"; exit 1; }
start=$(date +%s.%N)
env -i HOME="$HOME" PATH="$NOCC" pip install -q --disable-pip-version-check dist/normlab-*.whl
echo "wheel-check: installed with no compiler on PATH in $(echo "$(date +%s.%N) - $start" | bc) s"
cd "$work"
env -i HOME="$HOME" PATH="$NOCC" python -c "
import normlab, torch, json
from normlab.ops import extension
assert normlab.__file__.startswith('$work'), normlab.__file__
info = extension.build_info()
assert info['torch'] == torch.__version__ and info['level'] == 'dispatch', info
print('wheel-check: installed at', normlab.__file__.rsplit('/', 2)[0], '| built for torch', info['torch'], '| level', extension.cpu_level())
"
[ $# -eq 0 ] && set -- tests/ops/test_extension.py tests/ops/dyt
cd "$ROOT"
# python -m pytest from the checkout puts the checkout (not src/) on sys.path: normlab comes from the wheel
env -i HOME="$HOME" PATH="$NOCC" python -m pytest -q -n 2 -p no:cacheprovider "$@"
rm -rf "$work"
