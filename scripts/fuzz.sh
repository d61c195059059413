#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, in build/fuzz) and runs
# each for a bounded time on a copy of its committed corpus fuzz/corpus/<target>/ (the run's
# new inputs stay in build/fuzz/runs/, the checkout is not touched). Fails on any finding: a
# crash, a sanitizer report, a leak, a timeout, an unexpected exception; the input that
# triggered it is saved under build/fuzz/findings/ (docs/fuzzing.md: reproduce, minimise,
# turn it into a regression test).
#   scripts/fuzz.sh                      every target, GDN_FUZZ_SECONDS (default 12) seconds each
#   scripts/fuzz.sh step_validate_fuzz   only the named targets
#   GDN_FUZZ_SECONDS=3600 scripts/fuzz.sh core_validate_fuzz    a longer run of one
# scripts/test.sh runs it (GDN_FUZZ=0 skips it there).
set -euo pipefail
cd "$(dirname "$0")/.."
all=(npy_fuzz cli_args_fuzz core_validate_fuzz layer_validate_fuzz step_validate_fuzz)
targets=("${@:-${all[@]}}")
seconds=${GDN_FUZZ_SECONDS:-12}
jobs=$(nproc 2>/dev/null || echo 2)
cxx=${GDN_FUZZ_CXX:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz: no $cxx (scripts/setup.sh --tests installs clang)" >&2; exit 1; }

# OpenMP off: one thread per run (libFuzzer's own -jobs/-workers parallelise).
cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
      -DGDN_BUILD_FUZZERS=ON -DGDN_BUILD_TESTS=OFF -DGDN_THREADS=OFF >/dev/null
echo "fuzz: building ${targets[*]} in build/fuzz (log build/fuzz/build.log)"
if ! cmake --build build/fuzz -j "$jobs" --target "${targets[@]}" >build/fuzz/build.log 2>&1; then
  tail -40 build/fuzz/build.log >&2
  exit 1
fi

runs=build/fuzz/runs
findings=build/fuzz/findings
mkdir -p "$findings"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${targets[@]}"; do
  [[ -d fuzz/corpus/$t ]] || { echo "fuzz: no corpus fuzz/corpus/$t" >&2; exit 2; }
  rm -rf "${runs:?}/$t"
  mkdir -p "$runs/$t"
  cp fuzz/corpus/"$t"/* "$runs/$t/"
  log="$runs/$t.log"
  echo "fuzz: $t for ${seconds} s"
  if build/fuzz/fuzz/"$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$findings/$t-" "$runs/$t" >"$log" 2>&1; then
    grep -E '^Done ' "$log" | sed 's/^/  /' || true
  else
    echo "fuzz: $t FOUND SOMETHING (log $log):" >&2
    grep -v -E '^#[0-9]+|^INFO:' "$log" | tail -60 >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]}; inputs in $findings (docs/fuzzing.md)" >&2
  exit 1
fi
echo "fuzz: no findings (${#targets[@]} targets, ${seconds} s each)"
