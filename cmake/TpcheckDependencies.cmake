# Where tpcheck's C++ dependencies come from: fmt, nlohmann-json, CLI11, OpenBLAS.
#
#   TPCHECK_DEPS=system   Debian's packages (scripts/setup.sh: libfmt-dev, nlohmann-json3-dev,
#                         libcli11-dev, libopenblas-dev); an error when one is missing.
#   TPCHECK_DEPS=bundled  nothing from the system: fmt and CLI11 from third_party/ (Debian's
#                         own sources, the same versions), nlohmann-json and OpenBLAS from the
#                         PyPI packages nlohmann-json and scipy-openblas32 in the configuring
#                         Python (pyproject.toml's build requirements). No find_package() of
#                         them at all, so a system copy can never be picked up.
#   TPCHECK_DEPS=auto     each one from the system when found, else bundled.
#
# `pip install .` / `pip wheel .` (SKBUILD) default to bundled: a wheel must not depend on
# the build machine's shared libraries. A development build defaults to auto, so a machine
# with the Debian packages builds as it always did.
#
# Defines fmt::fmt, nlohmann_json::nlohmann_json, CLI11::CLI11, TPCHECK_BLAS_LIBRARIES and
# CBLAS_INCLUDE_DIR (the folder whose cblas.h the CPU backend includes), and for the wheel
# TPCHECK_BUNDLED_SHARED_LIBS (shared libraries to install beside the module) and
# TPCHECK_BUNDLED_LICENSES (the bundled code's licence files, as "file|name" pairs).

if(SKBUILD)
  set(_tpcheck_deps_default bundled)
else()
  set(_tpcheck_deps_default auto)
endif()
set(TPCHECK_DEPS ${_tpcheck_deps_default} CACHE STRING
    "Where fmt, nlohmann-json, CLI11 and OpenBLAS come from: system, bundled or auto")
set_property(CACHE TPCHECK_DEPS PROPERTY STRINGS system bundled auto)
if(NOT TPCHECK_DEPS MATCHES "^(system|bundled|auto)$")
  message(FATAL_ERROR "TPCHECK_DEPS is '${TPCHECK_DEPS}': expected system, bundled or auto")
endif()

set(TPCHECK_BUNDLED_SHARED_LIBS)
set(TPCHECK_BUNDLED_LICENSES)
set(_tpcheck_third_party ${PROJECT_SOURCE_DIR}/third_party)

# The Python whose PyPI packages supply the bundled nlohmann-json and OpenBLAS: pip's build
# environment under scikit-build-core, else the one the build was configured with.
function(_tpcheck_python out)
  if(DEFINED Python_EXECUTABLE)
    set(${out} ${Python_EXECUTABLE} PARENT_SCOPE)
  elseif(DEFINED Python3_EXECUTABLE)
    set(${out} ${Python3_EXECUTABLE} PARENT_SCOPE)
  else()
    find_package(Python3 COMPONENTS Interpreter)
    set(${out} "${Python3_EXECUTABLE}" PARENT_SCOPE)
  endif()
endfunction()

# Runs a Python snippet that prints lines; fails with `hint` when it cannot.
function(_tpcheck_python_query out code hint)
  _tpcheck_python(py)
  if(NOT py)
    message(FATAL_ERROR "TPCHECK_DEPS=${TPCHECK_DEPS} needs a Python with ${hint}: none found "
                        "(configure with -DPython3_EXECUTABLE=...)")
  endif()
  execute_process(COMMAND "${py}" -c "${code}" RESULT_VARIABLE rc OUTPUT_VARIABLE lines
                  ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "The bundled dependencies need ${hint} in ${py}: ${err}")
  endif()
  string(REPLACE "\n" ";" lines "${lines}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

# A PyPI package's folder and version, found without importing it (scipy_openblas32 loads
# its library on import; nlohmann_json imports importlib_resources).
set(_tpcheck_locate [=[
import importlib.metadata as md, importlib.util, os
spec = importlib.util.find_spec("@MODULE@")
dist = md.distribution("@DIST@")
lic = [str(dist.locate_file(f)) for f in (dist.files or []) if "LICENSE" in f.name.upper()]
print(os.path.dirname(spec.origin) if spec.origin else list(spec.submodule_search_locations)[0])
print(dist.version)
print(lic[0] if lic else "")
]=])

# The system's package under TPCHECK_DEPS system (required) or auto (if found); nothing
# under bundled. A macro: find_package's variables (<pkg>_VERSION) stay in the caller.
macro(_tpcheck_find_system package)
  if(TPCHECK_DEPS STREQUAL "system")
    find_package(${package} REQUIRED)
  elseif(TPCHECK_DEPS STREQUAL "auto")
    find_package(${package} QUIET)
  endif()
endmacro()

# --- fmt ---------------------------------------------------------------------------------
_tpcheck_find_system(fmt)
if(TARGET fmt::fmt)
  set(TPCHECK_FMT_FROM "system (${fmt_VERSION})")
else()
  # {fmt} 9.1.0, Debian's source (third_party/fmt/README.md), as a static library.
  add_library(tpcheck_fmt STATIC ${_tpcheck_third_party}/fmt/src/format.cc)
  target_include_directories(tpcheck_fmt SYSTEM PUBLIC ${_tpcheck_third_party}/fmt/include)
  set_target_properties(tpcheck_fmt PROPERTIES POSITION_INDEPENDENT_CODE ON)
  add_library(fmt::fmt ALIAS tpcheck_fmt)
  set(TPCHECK_FMT_FROM "third_party/fmt (9.1.0)")
  list(APPEND TPCHECK_BUNDLED_LICENSES "${_tpcheck_third_party}/fmt/LICENSE.rst|fmt-LICENSE.rst")
endif()

# --- CLI11 -------------------------------------------------------------------------------
_tpcheck_find_system(CLI11)
if(TARGET CLI11::CLI11)
  set(TPCHECK_CLI11_FROM "system (${CLI11_VERSION})")
else()
  add_library(tpcheck_cli11 INTERFACE)
  target_include_directories(tpcheck_cli11 SYSTEM INTERFACE ${_tpcheck_third_party}/cli11/include)
  add_library(CLI11::CLI11 ALIAS tpcheck_cli11)
  set(TPCHECK_CLI11_FROM "third_party/cli11 (2.1.2)")
  list(APPEND TPCHECK_BUNDLED_LICENSES "${_tpcheck_third_party}/cli11/LICENSE|CLI11-LICENSE")
endif()

# --- nlohmann-json -----------------------------------------------------------------------
_tpcheck_find_system(nlohmann_json)
if(TARGET nlohmann_json::nlohmann_json)
  set(TPCHECK_JSON_FROM "system (${nlohmann_json_VERSION})")
else()
  string(REPLACE "@MODULE@" "nlohmann_json" _code "${_tpcheck_locate}")
  string(REPLACE "@DIST@" "nlohmann-json" _code "${_code}")
  _tpcheck_python_query(_json "${_code}" "the PyPI package nlohmann-json (pip install nlohmann-json==3.11.2)")
  list(GET _json 0 _json_dir)
  list(GET _json 1 _json_version)
  list(GET _json 2 _json_license)
  if(NOT EXISTS ${_json_dir}/include/nlohmann/json.hpp)
    message(FATAL_ERROR "nlohmann-json ${_json_version} in ${_json_dir} has no include/nlohmann/json.hpp")
  endif()
  add_library(tpcheck_json INTERFACE)
  target_include_directories(tpcheck_json SYSTEM INTERFACE ${_json_dir}/include)
  add_library(nlohmann_json::nlohmann_json ALIAS tpcheck_json)
  set(TPCHECK_JSON_FROM "PyPI nlohmann-json ${_json_version} (${_json_dir})")
  if(_json_license)
    list(APPEND TPCHECK_BUNDLED_LICENSES "${_json_license}|nlohmann_json-LICENSE")
  endif()
endif()

# --- OpenBLAS ----------------------------------------------------------------------------
set(TPCHECK_BLAS_LIBRARIES)
if(NOT TPCHECK_DEPS STREQUAL "bundled")
  set(BLA_VENDOR OpenBLAS)
  if(TPCHECK_DEPS STREQUAL "system")
    find_package(BLAS REQUIRED)
    find_path(CBLAS_INCLUDE_DIR cblas.h
              PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas REQUIRED)
  else()
    find_package(BLAS QUIET)
    find_path(CBLAS_INCLUDE_DIR cblas.h
              PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas)
  endif()
  if(BLAS_FOUND AND CBLAS_INCLUDE_DIR)
    set(TPCHECK_BLAS_LIBRARIES ${BLAS_LIBRARIES})
    set(TPCHECK_BLAS_FROM "system (${BLAS_LIBRARIES})")
  endif()
endif()
if(NOT TPCHECK_BLAS_LIBRARIES)
  # scipy-openblas32: OpenBLAS as numpy's and scipy's wheels build it (32-bit integers,
  # DYNAMIC_ARCH, pthreads), every symbol prefixed scipy_. A generated cblas.h includes its
  # header and maps the five names tpcheck calls; the library is installed beside the module.
  string(REPLACE "@MODULE@" "scipy_openblas32" _code "${_tpcheck_locate}")
  string(REPLACE "@DIST@" "scipy-openblas32" _code "${_code}")
  _tpcheck_python_query(_ob "${_code}" "the PyPI package scipy-openblas32 (pip install scipy-openblas32)")
  list(GET _ob 0 _ob_dir)
  list(GET _ob 1 _ob_version)
  list(GET _ob 2 _ob_license)
  file(GLOB _ob_lib ${_ob_dir}/lib/libscipy_openblas*.so)
  if(NOT _ob_lib OR NOT EXISTS ${_ob_dir}/include/cblas.h)
    message(FATAL_ERROR "scipy-openblas32 ${_ob_version} in ${_ob_dir}: no lib/libscipy_openblas*.so "
                        "or include/cblas.h")
  endif()
  list(GET _ob_lib 0 _ob_lib)
  get_filename_component(_ob_soname ${_ob_lib} NAME)
  add_library(tpcheck_openblas SHARED IMPORTED)
  set_target_properties(tpcheck_openblas PROPERTIES IMPORTED_LOCATION ${_ob_lib}
                        IMPORTED_SONAME ${_ob_soname})
  set(CBLAS_INCLUDE_DIR ${PROJECT_BINARY_DIR}/generated/scipy_openblas)
  set(TPCHECK_SCIPY_OPENBLAS_CBLAS ${_ob_dir}/include/cblas.h)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/scipy_openblas_cblas.h.in ${CBLAS_INCLUDE_DIR}/cblas.h @ONLY)
  set(TPCHECK_BLAS_LIBRARIES tpcheck_openblas)
  set(TPCHECK_BUNDLED_SHARED_LIBS ${_ob_lib})
  set(TPCHECK_BLAS_FROM "PyPI scipy-openblas32 ${_ob_version} (${_ob_lib})")
  if(_ob_license)
    list(APPEND TPCHECK_BUNDLED_LICENSES "${_ob_license}|OpenBLAS-LICENSE.txt")
  endif()
endif()

message(STATUS "tpcheck dependencies (TPCHECK_DEPS=${TPCHECK_DEPS}): fmt ${TPCHECK_FMT_FROM}; "
               "CLI11 ${TPCHECK_CLI11_FROM}; nlohmann-json ${TPCHECK_JSON_FROM}; "
               "OpenBLAS ${TPCHECK_BLAS_FROM}")
