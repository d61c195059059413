#!/usr/bin/env bash
# sanitize.sh: the C++ test suite under sanitizers (issue 16). scripts/test.sh runs it after
# CTest (GDN_SANITIZE=0 skips it there); extra arguments go to both ctest runs (e.g. -R Step).
#   build/asan  g++, AddressSanitizer + UndefinedBehaviorSanitizer (leaks too): every test
#               program, every op (core forward and backward, layer, conv, step, the CLI) on
#               every CPU variant this host runs (the tests loop over them);
#   build/tsan  clang + LLVM's OpenMP runtime (libomp, whose TSan support, Archer, tells
#               ThreadSanitizer about OpenMP's synchronisation; libgomp cannot), the threaded
#               tests (every op's BitIdenticalForAnyThreadCount, 1 to 7 threads, every
#               CPU variant) with OMP_NUM_THREADS=2.
# Both trees build with -fno-sanitize-recover=all and run with halt_on_error=1; every report is
# also written under build/{asan,tsan}/reports/, and any file there fails the run (so that a
# report from a child process, e.g. the gdn tool under cli_test, fails it too).
# Left out under ASan: MemoryTest (it measures the resident set, which ASan's shadow memory and
# quarantine change; it skips itself). See docs/reliability.md.
# Time: about N minutes on 2 cores from a cold tree (compile included); see docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --sanitize
jobs=$(nproc 2>/dev/null || echo 2)

# Runs ctest in build tree $1 with the remaining arguments, then fails if a report was written.
run_tree() {
  local tree=$1
  shift
  rm -rf "$tree/reports"
  mkdir -p "$tree/reports"
  local status=0
  ctest --test-dir "$tree" --output-on-failure -j "$jobs" "$@" || status=$?
  local reports
  reports=$(find "$tree/reports" -type f | sort)
  if [[ -n "$reports" ]]; then
    for f in $reports; do
      echo "=== sanitizer report: $f"
      cat "$f"
    done
    echo "sanitize: $(echo "$reports" | wc -l) sanitizer report(s) in $tree/reports" >&2
    return 1
  fi
  if ((status)); then
    echo "sanitize: ctest failed in $tree" >&2
    return "$status"
  fi
  echo "sanitize: $tree: no reports"
}

common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGDN_BUILD_PYTHON=OFF -DGDN_BUILD_DEV=OFF)

# AddressSanitizer + UndefinedBehaviorSanitizer, g++.
cmake -S . -B build/asan "${common[@]}" -DCMAKE_CXX_COMPILER=g++ \
      -DGDN_SANITIZE="address;undefined"
cmake --build build/asan -j "$jobs"
asan_reports="$PWD/build/asan/reports"
ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:log_path=$asan_reports/asan" \
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$asan_reports/ubsan" \
  run_tree build/asan -E '^MemoryTest\.' "$@"

# ThreadSanitizer, clang + libomp.
cmake -S . -B build/tsan "${common[@]}" -DCMAKE_CXX_COMPILER=clang++ -DGDN_SANITIZE=thread
cmake --build build/tsan -j "$jobs"
tsan_reports="$PWD/build/tsan/reports"
OMP_NUM_THREADS=2 \
TSAN_OPTIONS="halt_on_error=1:ignore_noninstrumented_modules=1:second_deadlock_stack=1:log_path=$tsan_reports/tsan" \
  run_tree build/tsan -R 'ForAnyThreadCount' "$@"
