// JAX's Threefry-2x32 words, shared by the kernels that draw JAX's random numbers bit for bit
// (assembly.cc's nj_asm_bits, poisson.cc). Part of the compiled library's source hash
// (neurojax.kernels._build).
//
// Threefry: Salmon, Moraes, Dror and Shaw (2011), "Parallel random numbers: as easy as 1, 2,
// 3", SC'11; rotation constants and key schedule as published for Threefry-2x32. Word i is
// y0 ^ y1 for (y0, y1) = Threefry-2x32 (20 rounds) of the counter (0, i) under the key
// (k0, k1): the 32-bit words that jax.random.bits draws from a threefry key with
// jax_threefry_partitionable on (the callers check that setting).

#ifndef NEUROJAX_KERNELS_THREEFRY_H_
#define NEUROJAX_KERNELS_THREEFRY_H_

#include <cstdint>

namespace nj_threefry {

inline uint32_t RotL(uint32_t v, int d) { return (v << d) | (v >> (32 - d)); }

constexpr int kRot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};

// The key schedule of (k0, k1).
struct Key {
  uint32_t ks[3];
  Key(uint32_t k0, uint32_t k1) : ks{k0, k1, k0 ^ k1 ^ 0x1BD11BDAu} {}
};

// Threefry-2x32 (20 rounds) of the counter (0, counter): the block (x0, x1).
inline void Block(const Key& key, uint32_t counter, uint32_t& x0, uint32_t& x1) {
  const uint32_t* ks = key.ks;
  x0 = 0u + ks[0];
  x1 = counter + ks[1];
#pragma GCC unroll 5
  for (int j = 0; j < 5; ++j) {
#pragma GCC unroll 4
    for (const int r : kRot[j % 2]) {
      x0 += x1;
      x1 = RotL(x1, r) ^ x0;
    }
    x0 += ks[(j + 1) % 3];
    x1 += ks[(j + 2) % 3] + static_cast<uint32_t>(j + 1);
  }
}

// Words first .. first + n - 1 of that sequence.
inline void Words(uint32_t k0, uint32_t k1, uint32_t* out, int64_t n, int64_t first = 0) {
  const Key key(k0, k1);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x0, x1;
    Block(key, static_cast<uint32_t>(first + i), x0, x1);
    out[i] = x0 ^ x1;
  }
}

// The two words of the block at counter (0, counter), unmixed: `jax.random.split` (the
// partitionable scheme) makes key i of a split from the block at counter i.
inline void Pair(uint32_t k0, uint32_t k1, uint32_t counter, uint32_t* out) {
  Block(Key(k0, k1), counter, out[0], out[1]);
}

}  // namespace nj_threefry

#endif  // NEUROJAX_KERNELS_THREEFRY_H_
