# The C++ compiler must build C++20 with its standard library (std::span, std::bit_cast,
# <numbers>, concepts): GCC 11 or newer, Clang 14 or newer. Checked at configure, before
# anything else, so an older compiler fails here with the reason instead of deep in a
# build. (No compiler at all already stops project(): CMake names CMAKE_CXX_COMPILER / CXX.)
include(CheckCXXSourceCompiles)

set(_tpcheck_cxx "${CMAKE_CXX_COMPILER} (${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION})")
set(_tpcheck_cxx_fix
    "tpcheck needs a C++20 compiler and standard library: GCC 11 or newer, or Clang 14 or newer. "
    "Install one and name it: CXX=g++-12 pip install . (or cmake -DCMAKE_CXX_COMPILER=g++-12).")
if(NOT CMAKE_CXX20_STANDARD_COMPILE_OPTION)
  message(FATAL_ERROR "The C++ compiler ${_tpcheck_cxx} has no C++20 mode. ${_tpcheck_cxx_fix}")
endif()

set(CMAKE_REQUIRED_QUIET ON)
check_cxx_source_compiles([=[
#include <bit>
#include <concepts>
#include <cstdint>
#include <numbers>
#include <span>
template <std::floating_point T> T twice(T x) { return 2 * x; }
int main() {
  float f[2] = {1.0f, 2.0f};
  std::span<const float> s(f);
  const auto bits = std::bit_cast<std::uint32_t>(twice(s[1]));
  return static_cast<int>(bits != 0 && std::numbers::pi > 3 ? 0 : std::bit_width(bits));
}
]=] TPCHECK_CXX20_WORKS)
unset(CMAKE_REQUIRED_QUIET)
if(NOT TPCHECK_CXX20_WORKS)
  unset(TPCHECK_CXX20_WORKS CACHE)  # check again at the next configure (another CXX)
  message(FATAL_ERROR
    "The C++ compiler ${_tpcheck_cxx} cannot build C++20 (std::span, std::bit_cast, <numbers>, "
    "concepts; its compiler and library are too old, or its C++20 mode is incomplete). "
    "${_tpcheck_cxx_fix}")
endif()
