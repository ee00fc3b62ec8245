#!/usr/bin/env bash
# Installs everything tpcheck needs on a fresh Debian 12 machine (as root, or with sudo):
# the C++ dependencies from Debian packages and the Python packages the tests use.
# Idempotent: a second run installs nothing new.
set -euo pipefail

apt_packages=(
  build-essential cmake ninja-build pkg-config
  libcli11-dev         # command-line parsing for the tpcheck program
  nlohmann-json3-dev   # JSON reports
  libfmt-dev           # message and table formatting
  libopenblas-dev      # CPU GEMMs (sgemm / dgemm)
  libgtest-dev libgmock-dev  # unit tests
  libbenchmark-dev     # bench/ programs
  clang libclang-rt-14-dev  # libFuzzer + sanitizer runtimes for scripts/fuzz.sh (fuzz/)
  gcovr                # line and branch coverage of the layers (scripts/coverage.py)
  python3 python3-pip python3-venv
  chromium             # headless browser: tests/python/test_html_report.py renders the HTML report
                       # (measured 2026-11-30, Debian 12: 25 packages, 81 MB download, 54 s)
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python packages are used by the tests only (independent references):
#   jax (x64, CPU)  autodiff reference for every layer
#   ml_dtypes       bit-exact reference for the number formats
#   safetensors, numpy, pytest
#   torch           the tpcheck.torch package's tests (CPU tensors)
# They go into .venv (Debian's own python3 refuses system-wide pip installs, PEP 668);
# --system-site-packages reuses what the machine already has; --no-cache-dir keeps pip's
# downloads (torch's are 3 GB) out of the home directory.
root="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$root/.venv/bin/python" ] || python3 -m venv --system-site-packages "$root/.venv"
"$root/.venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
  -r "$root/tests/python/requirements.txt"

# cuDNN's header-only frontend (its C++ graph API) for the CUDA backend's fused attention
# (src/backend/cuda/fused_attention.cpp). Only its include/ folder is used: the package is
# installed into .deps/, not into the venv, and without its dependencies.
frontend="$root/.deps/cudnn-frontend"
if [ ! -f "$frontend/include/cudnn_frontend.h" ]; then
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$frontend" nvidia-cudnn-frontend==1.32.0
fi

# The wheel's build requirements (pyproject.toml's [build-system] requires: scikit-build-core,
# nanobind, nlohmann-json, scipy-openblas32, and what they need), kept as wheel files in
# .deps/wheels so tests/python/test_wheel.py builds the wheel offline, with pip's own build
# isolation (--no-index --find-links .deps/wheels); and installed in .venv, where a
# development build without Debian's -dev packages finds nlohmann-json and OpenBLAS
# (TPCHECK_DEPS=auto, cmake/TpcheckDependencies.cmake). Downloaded again only when
# pyproject.toml's list changes.
wheels="$root/.deps/wheels"
mapfile -t build_reqs < <("$root/.venv/bin/python" -c \
  'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' \
  "$root/pyproject.toml")
if [ "$(cat "$wheels/requirements.txt" 2>/dev/null)" != "$(printf '%s\n' "${build_reqs[@]}")" ]; then
  rm -rf "$wheels"
  "$root/.venv/bin/python" -m pip download -q --disable-pip-version-check --no-cache-dir \
    --dest "$wheels" "${build_reqs[@]}"
  printf '%s\n' "${build_reqs[@]}" >"$wheels/requirements.txt"
fi
"$root/.venv/bin/python" -m pip install -q --disable-pip-version-check --no-index \
  --find-links "$wheels" "${build_reqs[@]}"
