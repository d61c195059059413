#!/usr/bin/env bash
# bench.sh: installs what is missing, builds the gdn tool (Release) and runs the default
# benchmark, `gdn bench`. Extra arguments go to gdn bench (e.g. --threads 1, --tokens 65536,
# --json); see `build/release/gdn bench --help`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DGDN_BUILD_TESTS=OFF >/dev/null
cmake --build build/release -j "$(nproc 2>/dev/null || echo 2)"
exec build/release/gdn bench "$@"
