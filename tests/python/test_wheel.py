"""`pip wheel .` without Debian's -dev packages, and the wheel at work (issue 44).

The wheel test builds the package as a user would, in a fresh virtual environment with
pip's build isolation, offline: the build requirements are the wheel files scripts/setup.sh
keeps in .deps/wheels (--no-index --find-links). The build is told to take nothing from the
system (TPCHECK_DEPS=bundled) and CMake ignores /, /usr and /usr/local
(CMAKE_IGNORE_PREFIX_PATH; / because Debian's /lib is /usr/lib). CUDA is off: CI machines
have nvcc, and a CUDA build would add 2 CPU-minutes. Then it checks what came out:
  * the name's tag is manylinux_X_Y for this machine's glibc (pip for an older glibc refuses
    it), and the file is at most 10 MB;
  * the module and the OpenBLAS library it carries need no shared library but glibc's,
    libstdc++ and libgcc (readelf's NEEDED, ldd from the installed wheel, RUNPATH $ORIGIN),
    and no glibc symbol version newer than the tag; debug information is out;
  * no compiler read a header of fmt, CLI11, nlohmann-json or OpenBLAS from /usr (ninja's
    dependency log of the build);
and installs it with `pip install --no-deps` into another fresh environment that sees
.venv's torch (a .pth file: no second 3 GB download), where `tpcheck.compare`, `python -m
tpcheck emulate -n 2` with an all-reduce, the pytest plugin (its entry point) and `python -m
tpcheck run` (recording scipy-openblas32's OpenBLAS) must work.

Next to it: the configure with the system hidden, bundled and auto (the development
build's default, which falls back to the bundled copies); a compiler without C++20, or none,
stops at configure naming what is missing; the CUDA loader (src/backend/cuda/
cuda_libraries.cpp as a wheel builds it) against this machine's cuBLASLt and NCCL, and its
message when one cannot be loaded.

The whole file is about 3.5 CPU-minutes, 2 minutes on 2 cores (bench/RESULTS.md), most of
it the wheel's build; TPCHECK_TEST_WHEEL=0 leaves the wheel out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".deps" / "wheels"
FULL = os.environ.get("TPCHECK_TEST_WHEEL", "1") != "0"
HIDDEN = "/;/usr;/usr/local"  # CMAKE_IGNORE_PREFIX_PATH: the system's packages
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)
MAX_WHEEL_BYTES = 10 * 1000 * 1000

# What a manylinux wheel may need from the system (PEP 600: glibc, libstdc++, libgcc).
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
               "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "linux-vdso.so.1"}
# Headers a bundled build must never read from the system.
SYSTEM_HEADERS = re.compile(r"^\s*/usr/(local/)?include/(fmt|CLI|nlohmann|cblas|openblas|"
                            r"x86_64-linux-gnu/(cblas|openblas))", re.M)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points Python at ctest's build tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("PIP_")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", **extra)
    return env


def run(cmd, *, cwd=None, env=None, timeout=900, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or clean_env(), text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-6000:]}")
    return r


def configure(tmp_path: Path, *args: str, deps: str = "bundled") -> subprocess.CompletedProcess:
    """CMake configure of the wheel's build (no tests, no benchmarks, no CUDA), the system's
    packages hidden."""
    return run(["cmake", "-S", ROOT, "-B", tmp_path / "cfg", "-G", "Ninja",
                f"-DPython3_EXECUTABLE={sys.executable}", "-DTPCHECK_BUILD_TESTS=OFF",
                "-DTPCHECK_BUILD_BENCH=OFF", "-DTPCHECK_CUDA=OFF", "-DTPCHECK_PYTHON=ON",
                f"-DTPCHECK_DEPS={deps}", f"-DCMAKE_IGNORE_PREFIX_PATH={HIDDEN}", *args],
               timeout=300, check=False)


def glibc_version() -> tuple[int, int]:
    major, minor = os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2]
    return int(major), int(minor)


def needed(path: Path) -> tuple[list[str], str]:
    """The NEEDED entries and the RUNPATH of an ELF file (readelf -d)."""
    out = run(["readelf", "-d", path]).stdout
    return (re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out),
            "".join(re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", out)))


# --- quick -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def build_requirements_here():
    for module in ("nlohmann_json", "scipy_openblas32"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed in {sys.executable}: run scripts/setup.sh")


def words(text: str) -> str:
    """CMake wraps its messages: compare them with runs of white space made one space."""
    return " ".join(text.split())


@pytest.mark.parametrize("deps", ["bundled", "auto"])
def test_configure_takes_nothing_from_the_system(tmp_path, build_requirements_here, deps):
    r = configure(tmp_path, deps=deps)
    assert r.returncode == 0, r.stdout[-4000:]
    line = next(x for x in r.stdout.splitlines() if "tpcheck dependencies" in x)
    assert "fmt third_party/fmt (9.1.0)" in line and "CLI11 third_party/cli11 (2.1.2)" in line, line
    assert "nlohmann-json PyPI nlohmann-json 3.11.2" in line, line
    assert "OpenBLAS PyPI scipy-openblas32" in line and "libscipy_openblas" in line, line
    cache = (tmp_path / "cfg" / "CMakeCache.txt").read_text()
    assert "/usr/lib/x86_64-linux-gnu/libopenblas" not in cache
    assert not re.search(r"^(fmt|CLI11|nlohmann_json)_DIR:PATH=/usr", cache, re.M)


def test_a_compiler_without_cxx20_stops_at_configure(tmp_path, build_requirements_here):
    # g++ with its C++20 switch turned into C++17: CMake sees GCC 12, the library lacks
    # std::span, std::bit_cast and <numbers> in that mode.
    old = tmp_path / "old-c++"
    old.write_text(textwrap.dedent("""\
        #!/bin/sh
        for a; do
          shift
          case "$a" in -std=c++20|-std=gnu++20|-std=c++2a|-std=gnu++2a) a=-std=c++17 ;; esac
          set -- "$@" "$a"
        done
        exec g++ "$@"
        """))
    old.chmod(0o755)
    r = configure(tmp_path, f"-DCMAKE_CXX_COMPILER={old}")
    out = words(r.stdout)
    assert r.returncode != 0
    assert f"The C++ compiler {old} (GNU " in out and "cannot build C++20" in out, r.stdout[-3000:]
    assert "GCC 11 or newer, or Clang 14 or newer" in out, r.stdout[-3000:]
    assert "tpcheck dependencies" not in out  # it stopped before anything else


def test_no_compiler_stops_at_configure(tmp_path, build_requirements_here):
    r = configure(tmp_path, "-DCMAKE_CXX_COMPILER=/nonexistent/c++")
    out = words(r.stdout)
    assert r.returncode != 0
    assert "The CMAKE_CXX_COMPILER: /nonexistent/c++ is not a full path to an existing compiler" \
        in out, r.stdout[-3000:]


def _cuda_headers() -> list[str]:
    dirs = []
    for name in ("cublasLt.h", "nccl.h"):
        for d in (os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/include", "/usr/local/cuda/include",
                  "/usr/local/include", "/usr/include"):
            if os.path.isfile(os.path.join(d, name)):
                dirs.append(d)
                break
        else:
            return []
    return sorted(set(dirs))


LOADER_MAIN = r"""
#include <cublasLt.h>
#include <nccl.h>
#include <cstdio>
#include "backend/cuda/cuda_libraries.h"
#include "tpcheck/error.h"
int main() {
  try {
    const std::size_t lt = cublasLtGetVersion();  // loads it: the location is known after
    std::printf("cuBLASLt %zu at %s\n", lt, tpcheck::cuda::cublaslt_location().c_str());
    int version = 0;
    ncclGetVersion(&version);
    std::printf("NCCL %d at %s\n", version, tpcheck::cuda::nccl_location().c_str());
  } catch (const tpcheck::Error& e) {
    std::printf("Error kind %d: %s\n", static_cast<int>(e.kind()), e.what());
    return 3;
  }
  return 0;
}
"""


def test_cuda_loader_as_the_wheel_builds_it(tmp_path):
    includes = _cuda_headers()
    if not includes or shutil.which("g++") is None:
        pytest.skip("no cublasLt.h / nccl.h here (CUDA toolkit, NCCL) or no g++")
    (tmp_path / "main.cpp").write_text(LOADER_MAIN)
    exe = tmp_path / "loader"
    run(["g++", "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
         "-DTPCHECK_CUDA_DLOPEN=1", f"-I{ROOT / 'src'}", f"-I{ROOT / 'include'}",
         f"-I{ROOT / 'third_party' / 'fmt' / 'include'}", *(f"-I{d}" for d in includes),
         tmp_path / "main.cpp", ROOT / "src" / "backend" / "cuda" / "cuda_libraries.cpp",
         "-ldl", "-o", exe])
    # Linked to neither library: each is loaded at its first call.
    linked, _ = needed(exe)
    assert not [lib for lib in linked if "cublas" in lib or "nccl" in lib], linked
    found = run([exe], check=False)
    if "could not be loaded" in found.stdout:
        pytest.skip(f"this machine has no loadable cuBLASLt / NCCL: {found.stdout[-800:]}")
    assert found.returncode == 0, found.stdout
    assert re.search(r"cuBLASLt \d+ at /\S+libcublasLt\.so\.\d+", found.stdout), found.stdout
    assert re.search(r"NCCL \d+ at /\S+libnccl\.so\.\d+", found.stdout), found.stdout
    # A library that cannot be loaded: the first call throws Error(kInput), naming the
    # library, the variable and the file.
    for variable, title in (("TPCHECK_CUBLASLT_LIBRARY", "cuBLASLt"), ("TPCHECK_NCCL_LIBRARY", "NCCL")):
        missing = run([exe], env=clean_env(**{variable: str(tmp_path / "nope.so")}), check=False)
        assert missing.returncode == 3, missing.stdout
        assert f"Error kind 0: {title} could not be loaded from {variable}=" in missing.stdout
        assert "nope.so" in missing.stdout and "cannot open shared object file" in missing.stdout


# --- the wheel -------------------------------------------------------------------------------

SMOKE_COMPARE = r"""
import numpy as np, torch, tpcheck
rng = np.random.default_rng(0)
x, w = rng.standard_normal((8, 256)), rng.standard_normal((256, 32))
truth = x @ w
single = x.astype(np.float32) @ w.astype(np.float32)
halves = [x[:, i * 128:(i + 1) * 128].astype(np.float32) @ w[i * 128:(i + 1) * 128].astype(np.float32)
          for i in range(2)]
ok = tpcheck.compare(torch.from_numpy(single), torch.from_numpy(halves[0] + halves[1]), truth,
                     reduction_length=256, tp_size=2)
bug = tpcheck.compare(single, halves[0], truth, reduction_length=256, tp_size=2)  # a lost shard
print("compare", ok.passed, bug.passed, tpcheck.__file__)
assert ok.passed and not bug.passed, (ok, bug)
"""

SMOKE_EMULATE = r"""
import torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
t = torch.arange(4, dtype=torch.float32) + rank
dist.all_reduce(t)
assert t.tolist() == [1.0, 3.0, 5.0, 7.0], t
import tpcheck
print("rank", rank, "all_reduce", t.tolist(), "backend", dist.get_backend(), tpcheck.__file__)
dist.destroy_process_group()
"""

SMOKE_PYTEST = r"""
import pytest
import torch
import torch.distributed as dist


@pytest.mark.tpcheck(tp=[2])
def test_all_reduce(tpcheck_group):
    t = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0, 3.0]
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if not FULL:
        pytest.skip("TPCHECK_TEST_WHEEL=0: the wheel is not built")
    if not (WHEELS / "requirements.txt").is_file():
        pytest.skip(f"no build requirements in {WHEELS}: run scripts/setup.sh")
    tmp = tmp_path_factory.mktemp("wheel")
    run([BASE_PYTHON, "-m", "venv", tmp / "build-venv"])
    hide = tmp / "hide-system.cmake"
    hide.write_text(f'set(CMAKE_IGNORE_PREFIX_PATH "{HIDDEN}" CACHE STRING "" FORCE)\n')
    build = run([tmp / "build-venv" / "bin" / "python", "-m", "pip", "wheel", ROOT, "--no-deps",
                 "--no-index", "--find-links", WHEELS, "-w", tmp / "dist", "-v",
                 "-C", f"build-dir={tmp / 'build'}", "-C", "cmake.define.TPCHECK_CUDA=OFF",
                 "-C", "cmake.define.TPCHECK_DEPS=bundled", "-C", f"cmake.args=-C{hide}"],
                env=clean_env(CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2)), timeout=1800)
    (tmp / "build.log").write_text(build.stdout)
    wheels = list((tmp / "dist").glob("tpcheck-*.whl"))
    assert len(wheels) == 1, build.stdout[-3000:]
    return {"tmp": tmp, "path": wheels[0], "build": tmp / "build", "log": build.stdout}


def test_wheel_tag_size_and_contents(wheel):
    path = wheel["path"]
    major, minor = glibc_version()
    tag = f"manylinux_{major}_{minor}_x86_64"
    assert re.fullmatch(rf"tpcheck-0\.1\.0-cp3\d+-cp3\d+-{tag}\.whl", path.name), path.name
    assert path.stat().st_size <= MAX_WHEEL_BYTES, f"{path.name}: {path.stat().st_size} bytes"
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        assert f"Tag: {path.name.split('-')[2]}-{path.name.split('-')[3]}-{tag}" in \
            z.read("tpcheck-0.1.0.dist-info/WHEEL").decode()
    for want in ("tpcheck/__init__.py", "tpcheck/py.typed", "tpcheck/_tpcheck.pyi",
                 "tpcheck/libscipy_openblas.so", "tpcheck-0.1.0.dist-info/entry_points.txt",
                 "tpcheck-0.1.0.dist-info/licenses/fmt-LICENSE.rst",
                 "tpcheck-0.1.0.dist-info/licenses/CLI11-LICENSE",
                 "tpcheck-0.1.0.dist-info/licenses/nlohmann_json-LICENSE",
                 "tpcheck-0.1.0.dist-info/licenses/OpenBLAS-LICENSE.txt"):
        assert want in names, f"{want} not in {path.name}"
    assert any(re.fullmatch(r"tpcheck/_tpcheck\.cpython-3\d+-x86_64-linux-gnu\.so", n) for n in names)
    assert any(n.endswith("/_hook/sitecustomize.py") for n in names)  # emulate's start-up hook
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_pip_refuses_it_where_glibc_is_older(wheel, tmp_path):
    # pip on a machine whose glibc is one minor older: "not a supported wheel", nothing installed.
    major, minor = glibc_version()
    pip = [wheel["tmp"] / "build-venv" / "bin" / "python", "-m", "pip", "install", "--dry-run",
           "--no-deps", "--no-index", "--only-binary=:all:", "--target", tmp_path / "t"]
    older = run([*pip, "--platform", f"manylinux_{major}_{minor - 1}_x86_64", wheel["path"]], check=False)
    assert older.returncode != 0 and "is not a supported wheel on this platform" in older.stdout, older.stdout
    same = run([*pip, "--platform", f"manylinux_{major}_{minor}_x86_64", wheel["path"]])
    assert "Would install tpcheck-0.1.0" in same.stdout, same.stdout


def test_no_system_header_was_read(wheel):
    assert "tpcheck dependencies (TPCHECK_DEPS=bundled): fmt third_party/fmt" in wheel["log"]
    deps = run(["ninja", "-C", wheel["build"], "-t", "deps"]).stdout
    assert "third_party/fmt/include/fmt/format.h" in deps and "scipy_openblas32/include/cblas.h" in deps
    assert "nlohmann_json/include/nlohmann/json.hpp" in deps
    bad = sorted(set(m.group(0).strip() for m in SYSTEM_HEADERS.finditer(deps)))
    assert not bad, f"system headers read by the bundled build: {bad}"


@pytest.fixture(scope="module")
def installed(wheel):
    """Another fresh environment (the base interpreter's packages, as .venv sees them) that
    sees .venv's torch and pytest through a .pth file; the wheel installed with --no-deps."""
    tmp = wheel["tmp"]
    venv = tmp / "user-venv"
    run([BASE_PYTHON, "-m", "venv", "--system-site-packages", venv])
    py = venv / "bin" / "python"
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "tpcheck-test-torch.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([py, "-m", "pip", "install", "--no-deps", "--no-index", wheel["path"]])
    env = clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    home = tmp / "work"
    home.mkdir()
    return {"venv": venv, "python": py, "site": site, "env": env, "cwd": home}


def test_module_needs_only_glibc_libstdcxx_libgcc(installed):
    pkg = installed["site"] / "tpcheck"
    module = next(pkg.glob("_tpcheck.cpython-*.so"))
    carried = {p.name for p in pkg.glob("*.so") if p != module}
    assert carried == {"libscipy_openblas.so"}, carried
    for lib in [module, *(pkg / c for c in carried)]:
        libs, runpath = needed(lib)
        assert set(libs) <= SYSTEM_LIBS | carried, f"{lib.name} needs {sorted(set(libs) - SYSTEM_LIBS - carried)}"
        sections = run(["readelf", "-S", "-W", lib]).stdout
        assert ".debug_info" not in sections, f"{lib.name} carries debug information"
        symbols = run(["readelf", "-V", "-W", lib]).stdout
        versions = {tuple(map(int, v)) for v in re.findall(r"GLIBC_(\d+)\.(\d+)", symbols)}
        assert max(versions) <= glibc_version(), f"{lib.name} needs glibc {max(versions)}"
    assert needed(module)[1] == "$ORIGIN"
    ldd = run(["ldd", module]).stdout
    assert "not found" not in ldd, ldd
    for line in ldd.splitlines():
        m = re.match(r"\s*(\S+)(?: => (\S+))?", line)
        if m and m.group(2) and m.group(1) not in SYSTEM_LIBS:
            assert Path(m.group(2)).resolve().parent == pkg.resolve(), line


def test_compare_in_the_installed_package(installed):
    r = run([installed["python"], "-c", SMOKE_COMPARE], cwd=installed["cwd"], env=installed["env"])
    assert "compare True False" in r.stdout and str(installed["site"]) in r.stdout, r.stdout


def test_emulate_all_reduce_in_the_installed_package(installed):
    r = run(["python", "-m", "tpcheck", "emulate", "-n", "2", "--", "python", "-c", SMOKE_EMULATE],
            cwd=installed["cwd"], env=installed["env"], timeout=300)
    for rank in (0, 1):
        assert f"rank {rank} all_reduce [1.0, 3.0, 5.0, 7.0]" in r.stdout, r.stdout
    assert str(installed["site"]) in r.stdout, r.stdout


def test_pytest_plugin_from_the_entry_point(installed):
    (installed["cwd"] / "test_smoke_plugin.py").write_text(SMOKE_PYTEST)
    r = run(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_smoke_plugin.py"],
            cwd=installed["cwd"], env=installed["env"], timeout=300)
    assert "1 passed" in r.stdout, r.stdout


def test_the_program_records_the_carried_openblas(installed):
    report = installed["cwd"] / "run.json"
    run(["python", "-m", "tpcheck", "run", "--suite", "te", "--tp", "2", "--backend", "cpu",
         "--filter", r"^Linear\.column\.sp0\.default$", "--json", report],
        cwd=installed["cwd"], env=installed["env"], timeout=300)
    env = json.loads(report.read_text())["environment"]
    assert env["cpu_gemm_library"].startswith("OpenBLAS 0.3.34"), env["cpu_gemm_library"]
