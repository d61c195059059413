#!/usr/bin/env bash
# test.sh: installs what is missing, builds (warnings are errors) and runs the whole test
# suite with CTest. Extra arguments go to ctest (e.g. -R Cli, -L cpu, --repeat until-fail:3).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build/test -G Ninja -DCMAKE_BUILD_TYPE=Release -DGDN_WERROR=ON \
      -DGDN_PYTHON="$PWD/.venv/bin/python"
cmake --build build/test -j "$jobs"
ctest --test-dir build/test --output-on-failure -j "$jobs" "$@"
