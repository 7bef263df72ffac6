"""JAX's threefry key operations and random bits, computed in NumPy on the host.

A connectivity builder needs a few key splits and a few million random bits. Through
`jax.random` each distinct array shape is a program that a fresh process traces, lowers and
compiles (or loads from the compilation cache) before it runs: about 30-100 ms per program
on a 2-core machine, most of the time of building a small network. The same values computed
here in NumPy cost microseconds for a key and ~20 ns per random word, with nothing to
compile.

The values are JAX's, bit for bit, for JAX's default key implementation (`threefry2x32`) in
its default "partitionable" mode (`jax_threefry_partitionable`, on since JAX 0.5):

- `split(key, n)[i]` is the threefry-2x32 hash of the 64-bit counter `i` under `key`;
- `fold_in(key, d)` hashes the pair `(0, d)` and keeps both output words;
- `bits(key, shape)` hashes the row-major flat index of each element and keeps the XOR of
  the two output words.

`HostKey.of` returns None for any other key implementation or mode, and callers then use
`jax.random` itself; tests compare every function here with `jax.random` over many keys and
shapes.
"""

import jax
import jax.random as jr
import numpy as np

__all__ = ["HostKey", "threefry2x32"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA
_MASK = 0xFFFFFFFF


def threefry2x32(k0, k1, x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 hash (20 rounds, Salmon et al. 2011) of the counter pairs `(x0, x1)`
    under the key `(k0, k1)`, as JAX computes it. Arrays of uint32 in, arrays out."""
    k0, k1 = int(k0) & _MASK, int(k1) & _MASK
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0 = np.array(x0, dtype=np.uint32, copy=True)
    x1 = np.array(x1, dtype=np.uint32, copy=True)
    tmp = np.empty_like(x1)
    x0 += np.uint32(ks[0])
    x1 += np.uint32(ks[1])
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 += x1
            np.left_shift(x1, np.uint32(r), out=tmp)
            x1 >>= np.uint32(32 - r)
            x1 |= tmp
            x1 ^= x0
        x0 += np.uint32(ks[(group + 1) % 3])
        x1 += np.uint32((ks[(group + 2) % 3] + group + 1) & _MASK)
    return x0, x1


def _counters(start: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit counters start .. start + size - 1 as (high, low) uint32 words."""
    c = np.arange(start, start + size, dtype=np.uint64)
    return (c >> np.uint64(32)).astype(np.uint32), c.astype(np.uint32)


class HostKey:
    """A threefry key's two data words, split and folded in NumPy exactly as `jax.random`."""

    __slots__ = ("data",)

    def __init__(self, data) -> None:
        self.data = np.asarray(data, dtype=np.uint32).reshape(2)

    @classmethod
    def of(cls, key: jax.Array) -> "HostKey | None":
        """The host form of a single concrete JAX key (typed or raw uint32 data), or None when
        the key is not a default threefry key in partitionable mode (use `jax.random`)."""
        if not jax.config.jax_threefry_partitionable:
            return None
        if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
            if str(jr.key_impl(key)) != "threefry2x32" or key.shape != ():
                return None
            return cls(np.asarray(jr.key_data(key)))
        if key.dtype == np.uint32 and key.shape == (2,):
            return cls(np.asarray(key))
        return None

    def split(self, n: int) -> list["HostKey"]:
        """`jax.random.split(key, n)`, as n host keys."""
        hi, lo = _counters(0, n)
        y0, y1 = threefry2x32(self.data[0], self.data[1], hi, lo)
        return [HostKey((a, b)) for a, b in zip(y0, y1, strict=True)]

    def fold_in(self, d: int) -> "HostKey":
        """`jax.random.fold_in(key, d)` for 0 <= d < 2**32."""
        y0, y1 = threefry2x32(
            self.data[0], self.data[1], np.zeros(1, np.uint32), np.array([d], np.uint32)
        )
        return HostKey((y0[0], y1[0]))

    def bits(self, shape: tuple[int, ...]) -> np.ndarray:
        """`jax.random.bits(key, shape, jnp.uint32)`."""
        size = int(np.prod(shape, dtype=np.int64))
        hi, lo = _counters(0, size)
        y0, y1 = threefry2x32(self.data[0], self.data[1], hi, lo)
        y0 ^= y1
        return y0.reshape(shape)

    def jax(self) -> jax.Array:
        """The same key as a typed JAX key."""
        return jr.wrap_key_data(self.data, impl="threefry2x32")
