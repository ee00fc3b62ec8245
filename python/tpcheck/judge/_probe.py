"""The rounding probe's factors in torch: 1 + u·r, r uniform in [-1, 1), from the same
splitmix64 stream as `random_math::probe_factor` (src/core/random_math.h), computed on the
tensor's own device.

The C++ side computes, for stream position `counter` (>= 1),

    z = seed + 0x9E3779B97F4A7C15 · counter            (mod 2^64)
    z = (z ^ (z >> 30)) · 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) · 0x94D049BB133111EB
    z ^= z >> 31
    r = (z >> 11) · 2^-52 − 1
    factor = u · r + 1                                 (two roundings)

On the CPU the C++ function itself fills the tensor (_tpcheck.probe_factors_into: one
definition, a few ns per factor). On a GPU torch computes it on the device: torch has no
unsigned 64-bit arithmetic on every device, so this runs on int64: addition and
multiplication wrap identically in two's complement, and a logical right shift is an
arithmetic shift masked to the bits that came from the word (test_torch_truth.py checks both
against the formula written out in Python integers).
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


def _signed(x: int) -> int:
    """The int64 whose bits are the unsigned 64-bit value x."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 words (bits as unsigned)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


# Every probed run starts its stream at position 1, so the factors of one (u, seed, device)
# are the same tensor prefix in every run: the cache keeps the first CACHE_LIMIT positions
# per (u, seed, device), grown by appending the missing positions.
CACHE_LIMIT = 1 << 24
_cache: dict[tuple, torch.Tensor] = {}


def probe_factors(u: float, seed: int, first: int, count: int,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """float64 factors 1 + u·r for stream positions first, first+1, ..., first+count-1."""
    end = first + count - 1
    if end <= CACHE_LIMIT:
        key = (float(u), int(seed), str(torch.device(device)))
        have = _cache.get(key)
        if have is None or have.numel() < end:
            known = have.numel() if have is not None else 0
            size = min(CACHE_LIMIT, max(end, 2 * known, 1 << 16))
            more = _compute(u, seed, known + 1, size - known, device)
            have = more if have is None else torch.cat([have, more])
            _cache[key] = have
        return have[first - 1:end]
    return _compute(u, seed, first, count, device)


def _compute(u: float, seed: int, first: int, count: int, device) -> torch.Tensor:
    if torch.device(device).type == "cpu":
        from .. import _tpcheck

        out = torch.empty(count, dtype=torch.float64)
        _tpcheck.probe_factors_into(out.data_ptr(), first, count, float(u), int(seed) & _MASK64)
        return out
    return _compute_torch(u, seed, first, count, device)


def _compute_torch(u: float, seed: int, first: int, count: int, device) -> torch.Tensor:
    counters = torch.arange(first, first + count, dtype=torch.int64, device=device)
    z = counters * _signed(_GOLDEN) + _signed(seed)
    z = (z ^ _shr(z, 30)) * _signed(_MUL1)
    z = (z ^ _shr(z, 27)) * _signed(_MUL2)
    z = z ^ _shr(z, 31)
    r = _shr(z, 11).to(torch.float64) * 2.0 ** -52 - 1.0
    return r * u + 1.0


def probe_factor_reference(u: float, seed: int, counter: int) -> float:
    """One factor with Python integers: the C++ formula, written out (for tests)."""
    z = (seed + _GOLDEN * counter) & _MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & _MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & _MASK64
    z ^= z >> 31
    r = float(z >> 11) * 2.0 ** -52 - 1.0
    return u * r + 1.0
