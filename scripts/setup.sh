#!/usr/bin/env bash
# setup.sh: installs what the build needs and is missing (Debian/Ubuntu, apt-get). Safe to
# re-run: it installs nothing that is already there.
#   scripts/setup.sh           compiler, CMake, Ninja (the library, the gdn tool)
#   scripts/setup.sh --tests   also GoogleTest and python3-venv, and the project-local
#                              virtual environment .venv with NumPy (tests/requirements.txt)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake ninja-build)
tests=0
if [[ "${1:-}" == "--tests" ]]; then
  tests=1
  packages+=(libgtest-dev python3 python3-venv)
fi

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

if ((tests)); then
  if ! .venv/bin/python -c "import numpy" 2>/dev/null; then
    echo "setup: creating .venv with $(tr '\n' ' ' < tests/requirements.txt)"
    rm -rf .venv
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
  fi
fi
