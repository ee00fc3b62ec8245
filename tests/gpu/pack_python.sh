#!/usr/bin/env bash
# Builds the tpcheck Python extension for the GPU machine's Python (3.12 there, 3.11 here)
# from this machine's build tree and that Python's headers, and adds the package to
# .devrun/devrun.tgz (made by tests/gpu/pack.sh) as python/tpcheck, for tests/gpu/run.sh's
# `python` stage. The headers come from one device call:
#   device tool:  bash tests/gpu/python_headers.sh        → $OUT/python-include.tgz
#   here:         tests/gpu/pack.sh build && tests/gpu/pack_python.sh build python-include.tgz
# How: the commands ninja runs for build/'s own extension (nanobind's static library, the
# module's three sources, the link with the project's static libraries), replayed in a
# scratch directory with the other Python's include directory and extension suffix. The
# module links the same libraries as the tpcheck program, so it runs wherever that does.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
build="$(cd "${1:?usage: pack_python.sh BUILD_DIR python-include.tgz}" && pwd)"
headers="$(realpath "${2:?usage: pack_python.sh BUILD_DIR python-include.tgz}")"
[ -f .devrun/devrun.tgz ] || { echo "pack_python.sh: run tests/gpu/pack.sh first" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xzf "$headers"
read -r version suffix <"$work/include/VERSION"
short="python${version%.*}"                       # python3.12
[ -f "$work/include/$short/Python.h" ] || { echo "pack_python.sh: no $short/Python.h in $headers" >&2; exit 2; }
own="$(ls "$build"/python/tpcheck/_tpcheck.cpython-*.so)"
own_suffix=".${own##*/_tpcheck.}"                  # .cpython-311-x86_64-linux-gnu.so
own_include="$(ninja -C "$build" -t commands "python/tpcheck/_tpcheck$own_suffix" |
  grep -o -- '-I[^ ]*/include/python3\.[0-9]*' | head -1)"
[ -n "$own_include" ] || { echo "pack_python.sh: cannot find the build's Python include flag" >&2; exit 2; }
# The arch pyconfig.h (Debian/Ubuntu layout) is found through the parent include directory.
extra="-I$work/include/$short -isystem $work/include"
ninja -C "$build" -t commands "python/tpcheck/_tpcheck$own_suffix" |
  grep -E 'nanobind-static|src/python/CMakeFiles/_tpcheck|_tpcheck\.cpython' |
  sed -e "s#$own_include#$extra#g" -e "s#_tpcheck${own_suffix//./\\.}#_tpcheck$suffix#g" \
      -e "s#-o python/tpcheck/#-o #" >"$work/commands.sh"
mkdir -p "$work/obj"
(
  cd "$work/obj"
  for lib in "$build"/*.a; do ln -s "$lib" .; done
  grep -o -- ' -o [^ ]*\.o' "$work/commands.sh" | awk '{print $2}' | xargs -n1 dirname | sort -u | xargs mkdir -p
  bash -e "$work/commands.sh" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
)
module="$work/obj/_tpcheck$suffix"  # the link's -o, made relative above
[ -f "$module" ] || { echo "pack_python.sh: no module built (see the commands in $work)" >&2; exit 1; }
stage="$work/stage"
mkdir -p "$stage"
tar -C "$stage" -xzf .devrun/devrun.tgz
rm -rf "$stage/python" && mkdir -p "$stage/python/tpcheck"
cp python/tpcheck/*.py python/tpcheck/py.typed "$stage/python/tpcheck/"
# Subpackages (tpcheck.torch and its start-up hook), without caches.
for sub in python/tpcheck/*/; do
  [ -d "$sub" ] || continue
  (cd python/tpcheck && find "$(basename "$sub")" -name __pycache__ -prune -o -type f -name '*.py' \
    -print0 | xargs -0 cp --parents -t "$stage/python/tpcheck")
done
# The type stubs: nanobind's stubgen output for build/'s module (the same sources).
cp "$build/python/tpcheck/_tpcheck.pyi" "$stage/python/tpcheck/"
strip -o "$stage/python/tpcheck/_tpcheck$suffix" "$module"
tar -C "$stage" -cf - . | gzip -6 >.devrun/devrun.tgz
echo "pack_python.sh: tpcheck for Python $version ($(du -h "$stage/python/tpcheck/_tpcheck$suffix" | cut -f1)) added to .devrun/devrun.tgz ($(du -h .devrun/devrun.tgz | cut -f1))"
