"""safetensors interoperability: tpcheck's reader and writer against the reference
`safetensors` Python package (numpy API).

Both directions, every dtype tpcheck stores, every bit pattern of the 8- and 16-bit
formats:
  * a file written by tpcheck loads in Python with the same shapes, bytes and values;
  * a file written by the Python package loads in tpcheck with the same shapes, bytes
    and values (tpcheck's decoding to f64 must equal ml_dtypes' decoding, NaN for NaN).
The C++ side is the helper program tests/tools/safetensors_roundtrip, found through
TPCHECK_TOOLS_DIR (ctest sets it). A missing helper fails the test: a skipped interop
test would hide exactly the breakage it exists to catch.

safetensors 0.8's numpy API loads F64/F32/F16/BF16 (BF16 through ml_dtypes) but not the
FP8 types: it looks up `numpy.float8_e4m3fn`, which numpy does not have. For those two
dtypes only, the raw bytes come from the package's own parser (`safetensors.deserialize`)
and are viewed as ml_dtypes arrays. The test asserts that this fallback is used for FP8
alone, so a regression in BF16 support would not be masked.
"""

import json
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors import deserialize, safe_open
from safetensors.numpy import save_file

NUMPY_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
FP8 = {"F8_E4M3", "F8_E5M2"}


@pytest.fixture(scope="module")
def tool():
    tools_dir = os.environ.get("TPCHECK_TOOLS_DIR")
    if not tools_dir:
        pytest.fail("TPCHECK_TOOLS_DIR is not set (run through ctest, or set it to build/tests)")
    path = os.path.join(tools_dir, "safetensors_roundtrip")
    if not os.access(path, os.X_OK):
        pytest.fail(f"helper program {path} is missing; build the safetensors_roundtrip target")
    return path


def run_tool(tool, *args):
    result = subprocess.run([tool, *args], capture_output=True, text=True)
    assert result.returncode == 0, f"{tool} {' '.join(args)} failed: {result.stderr}"


def expected_values(desc):
    # Text written by fmt's shortest round-trip formatting: exact, with nan/inf/-0.
    return np.array([float(v) for v in desc["values"]], dtype=np.float64)


def to_f64(array):
    # Widening is exact; numpy warns "invalid value" when NaNs pass through the cast.
    with np.errstate(invalid="ignore"):
        return array.astype(np.float64).ravel()


def assert_same_values(actual_f64, expected_f64, name):
    # Equal as numbers, NaN where NaN, and the sign of zero preserved.
    np.testing.assert_array_equal(actual_f64, expected_f64, err_msg=name)
    np.testing.assert_array_equal(np.signbit(actual_f64), np.signbit(expected_f64), err_msg=name)


def test_file_written_by_tpcheck_loads_in_python(tool, tmp_path):
    st_path, json_path = str(tmp_path / "tp.safetensors"), str(tmp_path / "tp.json")
    run_tool(tool, "write", st_path, json_path)
    with open(json_path) as f:
        written = json.load(f)
    with open(st_path, "rb") as f:
        raw = dict(deserialize(f.read()))

    assert set(written["tensors"]) >= {"f8e4m3_all", "bf16_all", "f16_empty", "f32_scalar"}
    with safe_open(st_path, framework="np") as f:
        assert f.metadata() == written["metadata"]
        assert set(f.keys()) == set(written["tensors"])
        for name, desc in written["tensors"].items():
            dtype = NUMPY_DTYPES[desc["dtype"]]
            try:
                array = f.get_tensor(name)
            except AttributeError:
                assert desc["dtype"] in FP8, f"{name}: numpy API failed on {desc['dtype']}"
                assert raw[name]["dtype"] == desc["dtype"]
                array = np.frombuffer(bytes(raw[name]["data"]), dtype=dtype).reshape(raw[name]["shape"])
            assert array.dtype == dtype, name
            assert list(array.shape) == desc["shape"], name
            assert array.tobytes().hex() == desc["hex"], name
            assert_same_values(to_f64(array), expected_values(desc), name)


def python_tensors():
    rng = np.random.default_rng(5)
    tensors = {
        "f64_normal": rng.standard_normal((3, 5)),
        "f32_normal": rng.standard_normal((2, 2, 3)).astype(np.float32),
        "f16_normal": (rng.standard_normal((4, 3)) * 100).astype(np.float16),
        "bf16_normal": (rng.standard_normal((7,)) * 1e20).astype(ml_dtypes.bfloat16),
        "f8e4m3_normal": (rng.standard_normal((2, 3)) * 30).astype(ml_dtypes.float8_e4m3fn),
        "f8e5m2_normal": (rng.standard_normal((3, 2)) * 1e4).astype(ml_dtypes.float8_e5m2),
        # Every bit pattern: NaNs, infinities, subnormals and signed zeros included.
        "f16_all": np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256),
        "bf16_all": np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16),
        "f8e4m3_all": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).reshape(16, 16),
        "f8e5m2_all": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2).reshape(4, 64),
        "f64_special": np.array([0.0, -0.0, 5e-324, -np.inf, np.nan, 1.0 / 3.0]),
        "f32_scalar": np.array(0.1, dtype=np.float32),
        "f16_empty": np.zeros((0, 3), dtype=np.float16),
        "f32_4d": rng.standard_normal((2, 1, 3, 2)).astype(np.float32),
    }
    return tensors


def test_file_written_by_python_loads_in_tpcheck(tool, tmp_path):
    st_path, json_path = str(tmp_path / "py.safetensors"), str(tmp_path / "py.json")
    tensors = python_tensors()
    metadata = {"producer": "safetensors-python", "note": 'quote " and unicode \u00e9'}
    save_file(tensors, st_path, metadata=metadata)
    run_tool(tool, "dump", st_path, json_path)
    with open(json_path) as f:
        read = json.load(f)

    assert read["metadata"] == metadata
    assert set(read["tensors"]) == set(tensors)
    for name, array in tensors.items():
        desc = read["tensors"][name]
        assert NUMPY_DTYPES[desc["dtype"]] == array.dtype, name
        assert desc["shape"] == list(array.shape), name
        assert desc["hex"] == array.tobytes().hex(), name
        # tpcheck's decoding of each element against ml_dtypes' / numpy's.
        assert_same_values(expected_values(desc), to_f64(array), name)


def test_tpcheck_rejects_a_truncated_python_file(tool, tmp_path):
    st_path = str(tmp_path / "cut.safetensors")
    save_file({"w": np.ones((8, 8), dtype=np.float32)}, st_path)
    with open(st_path, "rb") as f:
        data = f.read()
    with open(st_path, "wb") as f:
        f.write(data[:-4])
    result = subprocess.run([tool, "dump", st_path, str(tmp_path / "cut.json")],
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "truncated" in result.stderr and '"w"' in result.stderr, result.stderr
