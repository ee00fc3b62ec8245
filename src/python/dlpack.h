// dlpack.h — DLPack arrays (numpy, PyTorch, JAX, CuPy; CPU or CUDA) as tpcheck Tensors
// without copying, and f64 host Tensors back as numpy arrays (which speak DLPack).
//
// Accepted: float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2; device CPU or
// CUDA; C-contiguous (a dimension of size 1 may have any stride). Anything else is a
// TypeError (dtype) or ValueError (layout, device) naming what was given and what is
// accepted: tpcheck reads tensors in place and never makes a silent copy.
// Thread safety: call with the GIL held.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "tpcheck/tensor.h"

namespace tpcheck::python {

struct WrappedArray {
  Tensor tensor;   // 1-D view of every element (rank-free), sharing the array's memory
  Shape shape;     // the array's own shape (any rank)
  int device_id = 0;
};

// `what` names the argument in errors ("single", "params['fc1_weight']").
WrappedArray wrap_array(const nanobind::ndarray<>& array, const std::string& what);

// The same memory with its own shape (rank <= 4, else a ValueError naming `what`).
Tensor shaped(const WrappedArray& a, const std::string& what);

// A host tensor as a new numpy array (a copy; f64 stays f64, other dtypes widen to f64).
nanobind::object to_numpy(const Tensor& t);

}  // namespace tpcheck::python
