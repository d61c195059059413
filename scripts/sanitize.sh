#!/usr/bin/env bash
# sanitize.sh: the C++ test suite under sanitizers (issue 16); scripts/test.sh runs it after
# CTest (GDN_SANITIZE=0 skips it there). docs/sanitizers.md has what it covers and why.
#   build/asan  g++, AddressSanitizer + UndefinedBehaviorSanitizer, leaks too: the whole
#               CTest suite (every op: core forward and backward, layer, conv, step, the gdn
#               tool; every CPU variant this host runs, the tests loop over them);
#   build/tsan  clang, OMP_NUM_THREADS=2 (the default thread count): the threaded tests (every
#               op's BitIdenticalForAnyThreadCount, 1 to 7 threads on every CPU variant; the
#               library's pool and item loop, CpuThreads and WorkItems; the conv op's, the
#               step's and the floating-point environment's tests); it runs first (the shorter).
# Both build with -fno-sanitize-recover=all and run with halt_on_error=1; every report is also
# written under build/{asan,tsan}/reports/, and a file there fails the run (so a report from a
# child process, the gdn tool under cli_test, fails it too). Memory.* skip themselves (they
# measure the resident set, which shadow memory changes).
# Time, from cold on 2 idle cores of a Zen 4 host: the ASan tree about 7.5 minutes (build 4,
# tests 3.7; 11.5 before -g1 and -O1 for the tests), the TSan tree under 3 (docs/sanitizers.md).
# Extra arguments go to both ctest runs (e.g. -R CpuStep).
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

# ThreadSanitizer, clang: the threaded tests (CpuStep.OnePrefillOf8192Tokens left out:
# the same code as the step's other prefills, 8192 tokens long).
cmake -S . -B build/tsan "${common[@]}" -DCMAKE_CXX_COMPILER=clang++ -DGDN_SANITIZE=thread
cmake --build build/tsan -j "$jobs"
tsan_reports="$PWD/build/tsan/reports"
OMP_NUM_THREADS=2 \
TSAN_OPTIONS="halt_on_error=1:ignore_noninstrumented_modules=1:second_deadlock_stack=1:log_path=$tsan_reports/tsan" \
  run_tree build/tsan -R 'ForAnyThreadCount|^CpuThreads[.]|^WorkItems[.]|^SubnormalsAsZero[.]|^CpuConv[.]|^Matrix/ConvMatchesReference[.]|^CpuStep[.]' \
  -E '^CpuStep[.]OnePrefillOf8192Tokens$' "$@"

# AddressSanitizer + UndefinedBehaviorSanitizer, g++: the whole suite.
cmake -S . -B build/asan "${common[@]}" -DCMAKE_CXX_COMPILER=g++ -DGDN_SANITIZE="address;undefined"
cmake --build build/asan -j "$jobs"
asan_reports="$PWD/build/asan/reports"
ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:log_path=$asan_reports/asan" \
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$asan_reports/ubsan" \
  run_tree build/asan "$@"
