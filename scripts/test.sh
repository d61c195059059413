#!/usr/bin/env bash
# test.sh: installs what is missing, builds (warnings are errors) and runs the whole test
# suite: the C++ tests with CTest, then the Python package's tests with pytest (tests/python,
# against the package setup.sh built into .venv), the C++ tests under sanitizers
# (scripts/sanitize.sh; GDN_SANITIZE=0 skips them) and bounded fuzz runs (scripts/fuzz.sh;
# GDN_FUZZ=0 skips them), and gdn.vllm's tests inside vLLM's CPU engine (tests/vllm, in the
# second environment .venv-vllm that `setup.sh --vllm` makes: about 3 GB to download the first
# time; GDN_VLLM_TESTS=0 skips both). Extra arguments go to ctest (e.g. -R Cli,
# -L cpu, --repeat until-fail:3); GDN_PYTEST_ARGS to pytest (e.g. "-k serving").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build/test -G Ninja -DCMAKE_BUILD_TYPE=Release -DGDN_WERROR=ON \
      -DGDN_PYTHON="$PWD/.venv/bin/python"
cmake --build build/test -j "$jobs"
ctest --test-dir build/test --output-on-failure -j "$jobs" "$@"
# The C++ tests again under ASan + UBSan and TSan (build/asan, build/tsan); GDN_SANITIZE=0 skips.
[[ "${GDN_SANITIZE:-1}" == 0 ]] || scripts/sanitize.sh
# The fuzz targets, about a minute (docs/fuzzing.md); GDN_FUZZ=0 skips them.
[[ "${GDN_FUZZ:-1}" == 0 ]] || scripts/fuzz.sh
# shellcheck disable=SC2086
.venv/bin/python -m pytest tests/python -q -rs ${GDN_PYTEST_ARGS:-}
# vLLM's CPU build cannot share .venv (it pins torch 2.13 and transformers < 5.20).
if [[ "${GDN_VLLM_TESTS:-1}" != 0 ]]; then
  scripts/setup.sh --vllm
  .venv-vllm/bin/python -m pytest tests/vllm -q -rs -p no:cacheprovider
fi
