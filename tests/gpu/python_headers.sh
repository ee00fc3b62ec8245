#!/usr/bin/env bash
# Run on the GPU machine (device tool): packs its Python's C headers (Python.h and the
# architecture's pyconfig.h) into $OUT/python-include.tgz, so tests/gpu/pack_python.sh can
# build the tpcheck extension for that Python here (that machine has no fmt, CLI11 or
# OpenBLAS headers to build it itself, and nothing can be installed there).
set -euo pipefail
out="${OUT:?set OUT}"
py="${PYTHON:-python3}"
inc=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("INCLUDEPY"))')
plat=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH") or "")')
ver=$(basename "$inc")
stage=$(mktemp -d)
mkdir -p "$stage/include"
cp -r "$inc" "$stage/include/$ver"
if [ -n "$plat" ] && [ -d "/usr/include/$plat/$ver" ]; then
  mkdir -p "$stage/include/$plat"
  cp -r "/usr/include/$plat/$ver" "$stage/include/$plat/$ver"
fi
"$py" -c 'import sysconfig, sys; print(sys.version.split()[0], sysconfig.get_config_var("EXT_SUFFIX"))' >"$stage/include/VERSION"
tar -C "$stage" -czf "$out/python-include.tgz" include
cat "$stage/include/VERSION"
