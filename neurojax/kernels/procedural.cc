// Procedural spike delivery: the CPU kernel of neurojax.network._layout._procedural (kernel
// entry `procedural_deliver`), called through XLA's FFI.
//
// One call delivers the spikes of one sending group (`n_source` neurons per trial) through K
// procedural projections (`fixed_prob` or `fixed_total` descriptions), in the order given.
// For every projection p, every trial b and every neuron i of p's presynaptic population
// with s[b, i] > 0 (ascending), the row r = i - pre_offset[p] is regenerated from the
// projection's key exactly as neurojax.connectivity._procedural.Procedural.rows does:
//   row key   = threefry2x32(key; 0, r)                      (jax.random.fold_in(key, r))
//   word j    = XOR of the two words of threefry2x32(row key; 0, j)   (jax.random.bits)
//   targets   = `fixed_prob`: the keyed Feistel permutation of 0 .. counts[r] - 1 over the
//               candidates, with cycle walking; `fixed_total`: two words per target reduced
//               as jax.random.randint does; without autapses, targets >= r move up by one
//   weights   = a scalar, or uniform / normal / non-negative normal draws at the 24-bit
//               uniform of the entry's weight word
//   delays    = the projection's scalar delay in steps, or uniform / normal draws conditioned
//               on [low, high], rounded to steps and capped at max_steps
// and s[b, i] * w is added into the ring at
//   ring[(b * n_slots + slot) * n_targets + target_offset[p] + target],
//   slot = (step + 1 + delay) mod n_slots (0 when n_slots == 1),
// in the order of the XLA path (projection, then neuron, then the row's entries).
//
// Integers (targets, delays in steps from a given float, slots) are those of the XLA path, bit
// for bit. The floating-point transforms replicate XLA:CPU's formulas (fused multiply-adds
// where XLA contracts, written as std::fma; Giles' erf_inv; Cephes' ndtri as JAX writes it),
// but use the C library's log and log1p where XLA has its own approximations: a weight may
// differ from the XLA path's by a few units in the last place, and a delay may round to the
// neighbouring step where the XLA value lies within an ulp of a half step (measured and
// documented in the Python module and the tests).
//
// Arguments: spikes (*batch, n_source) float32, step () int32, ring (*batch, n_slots,
// n_targets) float32, then per projection: counts (n_pre,) int32, key (2,) uint32, params
// (kParams,) float32 (see Params below). Result: the ring, aliased to the input ring; with
// `overwrite` the input ring is ignored and the result starts from zeros.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "pool.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif


namespace ffi = xla::ffi;


namespace {

constexpr int64_t kParams = 12;
constexpr uint32_t kParity = 0x1BD11BDA;
constexpr int kRotations[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
constexpr int kRounds = 4;

inline uint32_t Rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

// The 20 rounds and key injections of Threefry-2x32 on (x0, x1), the keys already added
// once (jax.random's hash; neurojax.connectivity._threefry). Inlined and fully unrolled, so
// that `Words` stays a flat loop the compiler vectorises across words.
__attribute__((always_inline)) inline void ThreefryRounds(uint32_t& x0, uint32_t& x1,
                                                           const uint32_t ks[3]) {
#pragma GCC unroll 8
  for (int group = 0; group < 5; ++group) {
#pragma GCC unroll 8
    for (int q = 0; q < 4; ++q) {
      x0 += x1;
      x1 = Rotl(x1, kRotations[group % 2][q]);
      x1 ^= x0;
    }
    x0 += ks[(group + 1) % 3];
    x1 += ks[(group + 2) % 3] + static_cast<uint32_t>(group + 1);
  }
}

// Threefry-2x32 of the counters (x0, x1) under the key (k0, k1).
inline void Threefry(uint32_t k0, uint32_t k1, uint32_t x0, uint32_t x1, uint32_t* y0,
                     uint32_t* y1) {
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ kParity};
  x0 += ks[0];
  x1 += ks[1];
  ThreefryRounds(x0, x1, ks);
  *y0 = x0;
  *y1 = x1;
}

inline uint32_t Word(uint32_t r0, uint32_t r1, uint32_t j) {
  uint32_t y0, y1;
  Threefry(r0, r1, 0u, j, &y0, &y1);
  return y0 ^ y1;
}

// x % d and x / d for a fixed divisor d >= 1 of 32 bits by one 64-bit multiply each (Lemire,
// Kaser and Kurz 2019, "Faster remainder by direct computation"), exact for every 32-bit x:
// the rows' reductions without a hardware division per target.
struct Divisor {
  uint64_t m = 0;
  uint32_t d = 1;
  void Set(uint32_t divisor) {
    d = divisor;
    m = ~uint64_t{0} / d + 1;
  }
  uint32_t Mod(uint32_t x) const {
    const uint64_t low = m * x;
    return static_cast<uint32_t>((static_cast<unsigned __int128>(low) * d) >> 64);
  }
  uint32_t Div(uint32_t x) const {
    if (d == 1) return x;
    return static_cast<uint32_t>((static_cast<unsigned __int128>(m) * x) >> 64);
  }
};

// Words start .. start + n - 1 of a row key into out: a branch-free loop that the compiler
// vectorises across the words.
inline void Words(uint32_t r0, uint32_t r1, uint32_t start, int64_t n, uint32_t* __restrict out) {
  const uint32_t ks2 = r0 ^ r1 ^ kParity;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x0 = r0, x1 = start + static_cast<uint32_t>(i) + r1;
    const uint32_t ks[3] = {r0, r1, ks2};
    ThreefryRounds(x0, x1, ks);
    out[i] = x0 ^ x1;
  }
}

// MurmurHash3's 32-bit finaliser (`_mix`).
inline uint32_t Mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  return x ^ (x >> 16);
}

// The 24-bit uniform in (0, 1) of a word (`_uniform`).
inline float Uniform(uint32_t word) {
  const float u = (static_cast<float>(static_cast<int32_t>(word >> 8)) + 0.5f) * (1.0f / 16777216.0f);
  const float top = 1.0f - 1.0f / 16777216.0f;
  return u < top ? u : top;
}

template <int N>
inline float Polyval(const float (&c)[N], float x) {
  float y = 0.0f;
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) y = std::fma(y, x, c[i]);
  return y;
}

// Branch-free versions of the transforms, for loops over a block of a row's entries that the
// compiler vectorises (the C library's log is a call per value). The logarithm is Cephes'
// single-precision one (a degree-8 polynomial after reduction to [sqrt(1/2), sqrt(2))),
// within about one ulp of the exact value, like XLA's own: the draws stay within float32
// rounding of the XLA path's (measured in tests/test_procedural_kernel.py).
// sqrt without the C library's errno path (a branch and a call on negative inputs, which
// keeps the loops below from vectorising); the argument is never negative here.
// Square roots of x[0 .. n) in place: AVX's vsqrtps (correctly rounded, as sqrtss and as
// XLA's sqrt) where the compiler targets AVX, std::sqrt otherwise. A loop calling std::sqrt
// does not vectorise (it keeps the C library's errno path), so the transforms below take
// their square roots a block at a time through this function, between loops that do.
inline void SqrtArray(float* __restrict x, int64_t n) {
  int64_t t = 0;
#if defined(__AVX__)
  for (; t + 8 <= n; t += 8) _mm256_storeu_ps(x + t, _mm256_sqrt_ps(_mm256_loadu_ps(x + t)));
#endif
  for (; t < n; ++t) x[t] = std::sqrt(x[t]);
}

inline float LogV(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, 4);
  float e = static_cast<float>((bits >> 23) - 126);
  const int32_t mb = (bits & 0x007FFFFF) | 0x3F000000;  // mantissa in [0.5, 1)
  float m;
  std::memcpy(&m, &mb, 4);
  const bool lo = m < 0.707106781186547524f;
  e = lo ? e - 1.0f : e;
  m = lo ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = std::fma(y, m, -1.1514610310e-1f);
  y = std::fma(y, m, 1.1676998740e-1f);
  y = std::fma(y, m, -1.2420140846e-1f);
  y = std::fma(y, m, 1.4249322787e-1f);
  y = std::fma(y, m, -1.6668057665e-1f);
  y = std::fma(y, m, 2.0000714765e-1f);
  y = std::fma(y, m, -2.4999993993e-1f);
  y = std::fma(y, m, 3.3333331174e-1f);
  y = y * m * z;
  y = std::fma(e, -2.12194440e-4f, y);
  y = std::fma(z, -0.5f, y);
  float r = m + y;
  r = std::fma(e, 0.693359375f, r);
  return x > 0.0f ? r : (x == 0.0f ? -INFINITY : NAN);
}

// log(1 + t) for t in (-1, 0]: log(w) * t / (w - 1) with w = 1 + t (Goldberg's correction
// of the rounding of 1 + t), t itself where w == 1.
inline float Log1pV(float t) {
  const float w = 1.0f + t;
  const float d = w - 1.0f;
  const float safe = d == 0.0f ? 1.0f : d;
  return d == 0.0f ? t : LogV(w) * (t / safe);
}

constexpr int64_t kBlock = 64;  // entries of a row drawn together

// XLA's f32 erf_inv (Giles 2010) of x[0 .. n) into out, fused multiply-adds where XLA:CPU
// contracts; log1p is Log1pV, not XLA's own.
inline void ErfInvBlock(const float* __restrict x, float* __restrict out, int64_t n) {
  static const float kLow[9] = {2.81022636e-08f,  3.43273939e-07f, -3.5233877e-06f,
                                -4.39150654e-06f, 0.00021858087f,  -0.00125372503f,
                                -0.00417768164f,  0.246640727f,    1.50140941f};
  static const float kHigh[9] = {-0.000200214257f, 0.000100950558f, 0.00134934322f,
                                 -0.00367342844f,  0.00573950773f,  -0.0076224613f,
                                 0.00943887047f,   1.00167406f,     2.83297682f};
  float w[kBlock], root[kBlock];
  for (int64_t t = 0; t < n; ++t) {
    w[t] = -Log1pV(-(x[t] * x[t]));
    root[t] = w[t];
  }
  SqrtArray(root, n);
  for (int64_t t = 0; t < n; ++t) {
    const bool low = w[t] < 5.0f;
    const float v = low ? w[t] - 2.5f : root[t] - 3.0f;
    float p = low ? kLow[0] : kHigh[0];
#pragma GCC unroll 16
    for (int i = 1; i < 9; ++i) p = std::fma(p, v, low ? kLow[i] : kHigh[i]);
    out[t] = std::fabs(x[t]) == 1.0f ? x[t] * INFINITY : p * x[t];
  }
}

// jax.scipy.special.ndtri (Cephes' rational approximations, as JAX writes them in float32)
// of p[0 .. n) into out: both branches evaluated, then selected.
inline void NdtriBlock(const float* __restrict p, float* __restrict out, int64_t n) {
  static const float p0[5] = {-5.99633501014107895267E1f, 9.80010754185999661536E1f,
                              -5.66762857469070293439E1f, 1.39312609387279679503E1f,
                              -1.23916583867381258016E0f};
  static const float q0[9] = {1.0f, 1.95448858338141759834E0f, 4.67627912898881538453E0f,
                              8.63602421390890590575E1f, -2.25462687854119370527E2f,
                              2.00260212380060660359E2f, -8.20372256168333339912E1f,
                              1.59056225126211695515E1f, -1.18331621121330003142E0f};
  static const float p1[9] = {4.05544892305962419923E0f,   3.15251094599893866154E1f,
                              5.71628192246421288162E1f,   4.40805073893200834700E1f,
                              1.46849561928858024014E1f,   2.18663306850790267539E0f,
                              -1.40256079171354495875E-1f, -3.50424626827848203418E-2f,
                              -8.57456785154685413611E-4f};
  static const float q1[9] = {1.0f, 1.57799883256466749731E1f, 4.53907635128879210584E1f,
                              4.13172038254672030440E1f, 1.50425385692907503408E1f,
                              2.50464946208309415979E0f, -1.42182922854787788574E-1f,
                              -3.80806407691578277194E-2f, -9.33259480895457427372E-4f};
  static const float p2[9] = {3.23774891776946035970E0f,  6.91522889068984211695E0f,
                              3.93881025292474443415E0f,  1.33303460815807542389E0f,
                              2.01485389549179081538E-1f, 1.23716634817820021358E-2f,
                              3.01581553508235416007E-4f, 2.65806974686737550832E-6f,
                              6.23974539184983293730E-9f};
  static const float q2[9] = {1.0f, 6.02427039364742014255E0f, 3.67983563856160859403E0f,
                              1.37702099489081330271E0f, 2.16236993594496635890E-1f,
                              1.34204006088543189037E-2f, 3.28014464682127739104E-4f,
                              2.89247864745380683936E-6f, 6.79019408009981274425E-9f};
  const float big = 0.864664716763387308f;    // 1 - exp(-2)
  const float small = 0.135335283236612692f;  // exp(-2)
  float mcp[kBlock], z[kBlock];
  for (int64_t t = 0; t < n; ++t) {
    float m = p[t] > big ? 1.0f - p[t] : p[t];
    m = m == 0.0f ? 0.5f : m;
    mcp[t] = m;
    z[t] = -2.0f * LogV(m);
  }
  SqrtArray(z, n);
  for (int64_t t = 0; t < n; ++t) {
    const float w = mcp[t] - 0.5f;
    const float ww = w * w;
    float central = std::fma(w * ww, Polyval(p0, ww) / Polyval(q0, ww), w);
    central = central * -2.50662827463100050242f;
    const float zz = z[t];
    const float first = zz - LogV(zz) / zz;
    const float iz = 1.0f / zz;
    const float tail2 = Polyval(p2, iz) / Polyval(q2, iz) / zz;
    const float tail1 = Polyval(p1, iz) / Polyval(q1, iz) / zz;
    float x = mcp[t] > small ? central : (zz >= 8.0f ? first - tail2 : first - tail1);
    x = p[t] > big ? x : -x;
    x = p[t] == 0.0f ? -INFINITY : x;
    out[t] = p[t] == 1.0f ? INFINITY : x;
  }
}

enum WeightKind : int64_t { kScalar = 0, kUniformW = 1, kNormalW = 2, kNonnegNormalW = 3 };
enum DelayKind : int64_t { kNoDelay = 0, kUniformD = 1, kNormalD = 2 };

// x / d and x mod d for 2 <= d < 2^16 and any uint32 x, with one 32 x 32 -> 64-bit multiply
// and a correction, which the compiler vectorises (there is no vector integer division):
// with M = floor(2^32 / d) (`SmallReciprocal`), q = (x M) >> 32 is the quotient or one less.
inline uint32_t SmallReciprocal(uint32_t d) {
  return static_cast<uint32_t>((uint64_t{1} << 32) / d);
}

inline uint32_t SmallQuotient(uint32_t x, uint32_t d, uint32_t m) {
  const uint32_t q = static_cast<uint32_t>((static_cast<uint64_t>(x) * m) >> 32);
  return q + ((x - q * d) >= d ? 1u : 0u);
}

inline uint32_t SmallRemainder(uint32_t x, uint32_t d, uint32_t m) {
  const uint32_t q = static_cast<uint32_t>((static_cast<uint64_t>(x) * m) >> 32);
  const uint32_t r = x - q * d;
  return r >= d ? r - d : r;
}

// A projection's description. Params (float32): weight [0..2] (scalar: w; uniform: low,
// high - low; normal: mean, std; non-negative normal: mean, std, ndtr(mean / std)); delay
// [3..8] (uniform: a, b - a, low, high; normal: mean, std, A, B - A, low, high, with A, B the
// normal CDF at the standardised bounds), [9] dt.
struct Proj {
  const int32_t* counts;
  uint32_t k0, k1;
  float prm[kParams];
  int64_t pre_offset, n_pre, n_post, rule, allow_self, fan_out, weight_kind, delay_kind;
  int64_t delay_steps, max_steps, target_offset;
  // derived
  uint32_t m, a, b;
  Divisor mod_m, mod_a, mod_b;
  uint32_t recip_a = 0, recip_b = 0;  // SmallReciprocal of a and b, for FeistelBlock
  int64_t width, off_lo, off_w, off_d;
};

struct Faults {
  int64_t counts = 0;
  int64_t targets = 0;
};

inline int64_t Slot(int64_t step, int64_t delay, int64_t n_slots) {
  if (n_slots == 1) return 0;
  // (step + 1 + delay) in int32, as the XLA path computes it, then Python's modulo.
  const int32_t t = static_cast<int32_t>(static_cast<uint32_t>(step) + 1u +
                                         static_cast<uint32_t>(delay));
  int64_t r = static_cast<int64_t>(t) % n_slots;
  return r < 0 ? r + n_slots : r;
}

// The weights and delays of a block of n <= kBlock words.
inline void Weights(const Proj& p, const uint32_t* __restrict words, float* __restrict out,
                    int64_t n) {
  const float* c = p.prm;
  float a[kBlock], z[kBlock];
  switch (p.weight_kind) {
    case kUniformW:
      for (int64_t t = 0; t < n; ++t) out[t] = std::fma(Uniform(words[t]), c[1], c[0]);
      break;
    case kNormalW:  // mean + std * sqrt(2) erfinv(2u - 1)
      for (int64_t t = 0; t < n; ++t) a[t] = std::fma(2.0f, Uniform(words[t]), -1.0f);
      ErfInvBlock(a, z, n);
      for (int64_t t = 0; t < n; ++t) {
        out[t] = std::fma(c[1], 1.41421356237309504880f * z[t], c[0]);
      }
      break;
    case kNonnegNormalW:  // max(mean - std * ndtri(u * ndtr(mean / std)), 0)
      for (int64_t t = 0; t < n; ++t) a[t] = Uniform(words[t]) * c[2];
      NdtriBlock(a, z, n);
      for (int64_t t = 0; t < n; ++t) {
        const float w = std::fma(-c[1], z[t], c[0]);
        out[t] = w > 0.0f ? w : 0.0f;
      }
      break;
    default:
      for (int64_t t = 0; t < n; ++t) out[t] = c[0];
  }
}

inline void Delays(const Proj& p, const uint32_t* __restrict words, int32_t* __restrict out,
                   int64_t n) {
  const float* c = p.prm + 3;
  const float dt = p.prm[9];
  const float top = static_cast<float>(p.max_steps);
  float x[kBlock], a[kBlock];
  float low, high;
  if (p.delay_kind == kUniformD) {
    low = c[2];
    high = c[3];
    for (int64_t t = 0; t < n; ++t) x[t] = std::fma(Uniform(words[t]), c[1], c[0]);
  } else {
    low = c[4];
    high = c[5];
    for (int64_t t = 0; t < n; ++t) a[t] = std::fma(Uniform(words[t]), c[3], c[2]);
    NdtriBlock(a, x, n);
    for (int64_t t = 0; t < n; ++t) x[t] = std::fma(c[1], x[t], c[0]);
  }
  for (int64_t t = 0; t < n; ++t) {
    float v = x[t] < low ? low : x[t];  // jnp.clip
    v = v > high ? high : v;
    const float ratio = v / dt;
    const float big = ratio > 1.0f ? ratio : 1.0f;
    float steps = std::floor(std::fma(1e-6f, big, ratio + 0.5f));
    steps = steps < top ? steps : top;  // (max_steps < 2^24: exact in float32)
    out[t] = static_cast<int32_t>(steps);
  }
}

inline uint32_t Feistel(uint32_t x, const Proj& p, const uint32_t* rk) {
  uint32_t left = p.mod_b.Div(x), right = x - left * p.b;
  for (int r = 0; r < kRounds; ++r) {
    const Divisor& radix = (r % 2 == 0) ? p.mod_a : p.mod_b;
    const uint32_t f = radix.Mod(Mix(right ^ rk[r]));
    const uint32_t next = radix.Mod(left + f);
    left = right;
    right = next;
  }
  return left * p.b + right;
}

// Feistel(start + t) for t < n into out (before cycle walking), a block at a time in a
// branch-free loop: the same values as `Feistel`, exact integer arithmetic.
void FeistelBlock(uint32_t start, int64_t n, const Proj& p, const uint32_t* rk,
                  uint32_t* __restrict out) {
  if (p.a < 2 || p.b < 2 || p.a >= 65536 || p.b >= 65536) {
    for (int64_t t = 0; t < n; ++t) out[t] = Feistel(start + static_cast<uint32_t>(t), p, rk);
    return;
  }
  const uint32_t a = p.a, b = p.b, ma = p.recip_a, mb = p.recip_b;
  const uint32_t k0 = rk[0], k1 = rk[1], k2 = rk[2], k3 = rk[3];
  static_assert(kRounds == 4, "FeistelBlock unrolls four rounds");
  for (int64_t t = 0; t < n; ++t) {
    const uint32_t x = start + static_cast<uint32_t>(t);
    uint32_t left = SmallQuotient(x, b, mb);
    uint32_t right = x - left * b;
    uint32_t next = SmallRemainder(left + SmallRemainder(Mix(right ^ k0), a, ma), a, ma);
    left = right;
    right = next;
    next = SmallRemainder(left + SmallRemainder(Mix(right ^ k1), b, mb), b, mb);
    left = right;
    right = next;
    next = SmallRemainder(left + SmallRemainder(Mix(right ^ k2), a, ma), a, ma);
    left = right;
    right = next;
    next = SmallRemainder(left + SmallRemainder(Mix(right ^ k3), b, mb), b, mb);
    left = right;
    right = next;
    out[t] = left * b + right;
  }
}

// Row r of projection p (count entries, checked by the caller): for each entry, its place in
// the trial's ring (-1 for a target outside the population, counted in `targets`) and
// v * w, written to idx[0 .. count) and val[0 .. count).
void RowInto(const Proj& p, int64_t r, int64_t count, float v, int64_t step, int64_t n_slots,
             int64_t n_targets, int64_t* __restrict idx, float* __restrict val,
             int64_t& bad_targets) {
  uint32_t r0, r1;
  Threefry(p.k0, p.k1, 0u, static_cast<uint32_t>(r), &r0, &r1);
  uint32_t rk[kRounds];
  if (p.rule == 0) {
    const uint32_t key = Word(r0, r1, 0);
    for (int q = 0; q < kRounds; ++q) {
      rk[q] = Mix(key + static_cast<uint32_t>((0x9E3779B9ull * (q + 1)) & 0xFFFFFFFFull));
    }
  }
  const uint32_t mult = p.rule == 1 ? p.mod_m.Mod(p.mod_m.Mod(65536u) * p.mod_m.Mod(65536u)) : 0u;
  const int64_t fixed_slot = Slot(step, p.delay_steps, n_slots);
  uint32_t hi[kBlock], lo[kBlock], ww[kBlock], dd[kBlock], perm[kBlock];
  float wf[kBlock];
  int32_t ds[kBlock];
  for (int64_t j0 = 0; j0 < count; j0 += kBlock) {
    const int64_t n = count - j0 < kBlock ? count - j0 : kBlock;
    const uint32_t s0 = static_cast<uint32_t>(j0);
    if (p.rule == 1) {
      Words(r0, r1, s0, n, hi);
      Words(r0, r1, static_cast<uint32_t>(p.off_lo) + s0, n, lo);
    }
    if (p.rule == 0) FeistelBlock(s0, n, p, rk, perm);
    if (p.weight_kind != kScalar) {
      Words(r0, r1, static_cast<uint32_t>(p.off_w) + s0, n, ww);
      Weights(p, ww, wf, n);
    }
    if (p.delay_kind != kNoDelay) {
      Words(r0, r1, static_cast<uint32_t>(p.off_d) + s0, n, dd);
      Delays(p, dd, ds, n);
    }
    for (int64_t t = 0; t < n; ++t) {
      uint32_t post;
      if (p.rule == 1) {
        post = p.mod_m.Mod(p.mod_m.Mod(hi[t]) * mult + p.mod_m.Mod(lo[t]));
      } else {
        post = perm[t];
        while (post >= p.m) post = Feistel(post, p, rk);
      }
      int64_t target = static_cast<int64_t>(static_cast<int32_t>(post));
      if (!p.allow_self && target >= r) ++target;
      if (target < 0 || target >= p.width) {
        ++bad_targets;
        idx[j0 + t] = -1;
        continue;
      }
      const float w = p.weight_kind == kScalar ? p.prm[0] : wf[t];
      const int64_t slot = p.delay_kind == kNoDelay ? fixed_slot : Slot(step, ds[t], n_slots);
      idx[j0 + t] = slot * n_targets + p.target_offset + target;
      val[j0 + t] = v * w;
    }
  }
}

ffi::Error ProceduralDeliverImpl(ffi::ThreadPool pool, ffi::AnyBuffer s, ffi::AnyBuffer step, ffi::AnyBuffer ring_in,
                                 ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> ring_out,
                                 int64_t n_source, int64_t n_slots, int64_t n_targets,
                                 int64_t overwrite, ffi::Span<const int64_t> pre_offset,
                                 ffi::Span<const int64_t> n_pre, ffi::Span<const int64_t> n_post,
                                 ffi::Span<const int64_t> rule,
                                 ffi::Span<const int64_t> allow_self,
                                 ffi::Span<const int64_t> fan_out,
                                 ffi::Span<const int64_t> weight_kind,
                                 ffi::Span<const int64_t> delay_kind,
                                 ffi::Span<const int64_t> delay_steps,
                                 ffi::Span<const int64_t> max_steps,
                                 ffi::Span<const int64_t> target_offset) {
  const char* name = "nj_procedural_deliver: ";
  if (s.element_type() != ffi::DataType::F32 || ring_in.element_type() != ffi::DataType::F32 ||
      ring_out->element_type() != ffi::DataType::F32) {
    return ffi::Error::InvalidArgument(std::string(name) + "spikes and ring must be float32");
  }
  if (step.element_type() != ffi::DataType::S32 || step.element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(name) + "step must be one int32");
  }
  const size_t k = pre_offset.size();
  if (rest.size() != 3 * k || n_pre.size() != k || n_post.size() != k || rule.size() != k ||
      allow_self.size() != k || fan_out.size() != k || weight_kind.size() != k ||
      delay_kind.size() != k || delay_steps.size() != k || max_steps.size() != k ||
      target_offset.size() != k) {
    return ffi::Error::InvalidArgument(std::string(name) + "inconsistent projection arguments");
  }
  if (n_source < 1 || n_slots < 1 || n_targets < 0) {
    return ffi::Error::InvalidArgument(std::string(name) + "bad sizes or no ring slot");
  }
  const int64_t n_trials = static_cast<int64_t>(s.element_count()) / n_source;
  if (static_cast<int64_t>(s.element_count()) != n_trials * n_source ||
      static_cast<int64_t>(ring_in.element_count()) != n_trials * n_slots * n_targets ||
      ring_out->element_count() != ring_in.element_count()) {
    return ffi::Error::InvalidArgument(
        std::string(name) + "the spikes and the ring do not match the trials and sizes");
  }
  std::vector<Proj> projs(k);
  for (size_t q = 0; q < k; ++q) {
    auto counts = rest.get<ffi::AnyBuffer>(3 * q);
    auto key = rest.get<ffi::AnyBuffer>(3 * q + 1);
    auto prm = rest.get<ffi::AnyBuffer>(3 * q + 2);
    if (!counts.has_value() || !key.has_value() || !prm.has_value()) {
      return ffi::Error::InvalidArgument(std::string(name) + "missing projection buffer");
    }
    const std::string which = std::string(name) + "projection " + std::to_string(q) + ": ";
    if (counts->element_type() != ffi::DataType::S32 ||
        key->element_type() != ffi::DataType::U32 || key->element_count() != 2 ||
        prm->element_type() != ffi::DataType::F32 || prm->element_count() != kParams) {
      return ffi::Error::InvalidArgument(
          which + "counts must be int32, the key two uint32 and the parameters float32[12]");
    }
    if (n_pre[q] < 1 || pre_offset[q] < 0 || pre_offset[q] + n_pre[q] > n_source ||
        static_cast<int64_t>(counts->element_count()) != n_pre[q] || n_post[q] < 1 ||
        n_post[q] >= (int64_t{1} << 31) || target_offset[q] < 0 ||
        target_offset[q] + n_post[q] > n_targets || (rule[q] != 0 && rule[q] != 1) ||
        fan_out[q] < 0 || fan_out[q] >= (int64_t{1} << 30) || weight_kind[q] < 0 ||
        weight_kind[q] > 3 || delay_kind[q] < 0 || delay_kind[q] > 2 || delay_steps[q] < 0 ||
        max_steps[q] < 0 || (delay_kind[q] != kNoDelay && max_steps[q] >= n_slots) ||
        (delay_kind[q] == kNoDelay && delay_steps[q] >= n_slots && n_slots > 1) ||
        (!allow_self[q] && n_post[q] < 2)) {
      return ffi::Error::InvalidArgument(
          which + "sizes, offsets, rule, fan-out or delays outside their ranges");
    }
    Proj& p = projs[q];
    p.counts = static_cast<const int32_t*>(counts->untyped_data());
    const uint32_t* kd = static_cast<const uint32_t*>(key->untyped_data());
    p.k0 = kd[0];
    p.k1 = kd[1];
    std::memcpy(p.prm, prm->untyped_data(), sizeof(p.prm));
    p.pre_offset = pre_offset[q];
    p.n_pre = n_pre[q];
    p.n_post = n_post[q];
    p.rule = rule[q];
    p.allow_self = allow_self[q];
    p.fan_out = fan_out[q];
    p.weight_kind = weight_kind[q];
    p.delay_kind = delay_kind[q];
    p.delay_steps = delay_steps[q];
    p.max_steps = max_steps[q];
    p.target_offset = target_offset[q];
    p.width = n_post[q];
    const int64_t m = n_post[q] - (allow_self[q] ? 0 : 1);
    p.m = static_cast<uint32_t>(m < 1 ? 1 : m);
    // The mixed-radix domain Z_a x Z_b of the permutation (`permute`).
    int64_t a = 1;
    if (p.m > 1) {
      int64_t root = static_cast<int64_t>(std::sqrt(static_cast<double>(p.m - 1)));
      while (root * root > static_cast<int64_t>(p.m - 1)) --root;
      while ((root + 1) * (root + 1) <= static_cast<int64_t>(p.m - 1)) ++root;
      a = root + 1;
    }
    const int64_t b = (static_cast<int64_t>(p.m) + a - 1) / a;
    p.a = static_cast<uint32_t>(a);
    p.b = static_cast<uint32_t>(b < 1 ? 1 : b);
    p.mod_m.Set(p.m);
    p.mod_a.Set(p.a);
    p.mod_b.Set(p.b);
    if (p.a >= 2 && p.a < 65536 && p.b >= 2 && p.b < 65536) {
      p.recip_a = SmallReciprocal(p.a);
      p.recip_b = SmallReciprocal(p.b);
    }
    // Word offsets of the row's parts, as Procedural.rows lays them out.
    const int64_t kk = fan_out[q] < 1 ? 1 : fan_out[q];
    int64_t next = p.rule == 1 ? 2 * kk : 1;
    p.off_lo = kk;
    p.off_w = next;
    if (p.weight_kind != kScalar) next += kk;
    p.off_d = next;
    if (p.delay_kind != kNoDelay && !(p.prm[9] > 0.0f)) {
      return ffi::Error::InvalidArgument(which + "dt must be positive");
    }
  }
  if (overwrite) {
    std::memset(ring_out->untyped_data(), 0, ring_out->size_bytes());
  } else if (ring_out->untyped_data() != ring_in.untyped_data()) {
    std::memcpy(ring_out->untyped_data(), ring_in.untyped_data(), ring_in.size_bytes());
  }
  const int64_t t = *static_cast<const int32_t*>(step.untyped_data());
  const float* spikes = static_cast<const float*>(s.untyped_data());
  float* ring = static_cast<float*>(ring_out->untyped_data());
  Faults bad;
  // Per projection and trial, the spiking rows in ascending order are drawn in batches of
  // about kBatch entries, each row into its own stretch of (index, value) buffers; the values
  // are then added into the ring in the rows' order (the order of the XLA walk). When a batch
  // is large enough to gain (nj_pool::Worth, measured), both passes run on the kernels'
  // threads (pool.h): the rows split into runs of about equal entries, then the trial's ring
  // into equal runs of cells, each thread adding, in the buffers' order, the entries of its
  // own cells; a cell thus receives the same additions in the same order with any number of
  // threads, and no two threads write one cell.
  (void)pool;
  constexpr int64_t kBatch = int64_t{1} << 17;
  std::vector<int64_t> rows, starts;
  std::vector<int64_t> idx;
  std::vector<float> val;
  const int64_t trial_cells = n_slots * n_targets;
  for (const Proj& p : projs) {
    for (int64_t b = 0; b < n_trials; ++b) {
      const float* sb = spikes + b * n_source + p.pre_offset;
      float* rb = ring + b * n_slots * n_targets;
      int64_t r = 0;
      while (r < p.n_pre) {
        rows.clear();
        starts.assign(1, 0);
        for (; r < p.n_pre && starts.back() < kBatch; ++r) {
          if (!(sb[r] > 0.0f)) continue;
          const int64_t count = p.counts[r];
          if (count < 0 || count > p.fan_out) {
            ++bad.counts;
            continue;
          }
          rows.push_back(r);
          starts.push_back(starts.back() + count);
        }
        const int64_t total = starts.back();
        if (rows.empty() || total == 0) continue;
        idx.resize(total);
        val.resize(total);
        const int64_t n_rows = static_cast<int64_t>(rows.size());
        std::vector<int64_t> bad_targets(n_rows, 0);
        auto task = [&](int64_t k) {
          const int64_t row = rows[k];
          RowInto(p, row, starts[k + 1] - starts[k], sb[row], t, n_slots, n_targets,
                  idx.data() + starts[k], val.data() + starts[k], bad_targets[k]);
        };
        const int64_t* __restrict ix = idx.data();
        const float* __restrict vx = val.data();
        const int n = n_rows > 1 ? nj_pool::Worth(total, 2) : 1;
        if (n <= 1) {
          for (int64_t k = 0; k < n_rows; ++k) task(k);
          for (int64_t e = 0; e < total; ++e) {
            if (ix[e] >= 0) rb[ix[e]] += vx[e];
          }
        } else {
          const int64_t t0 = nj_pool::NowNs();
          auto draw = [&](int part) {
            // Rows whose first entry falls in this part's share of the entries.
            const int64_t lo = std::lower_bound(starts.begin(), starts.end() - 1,
                                                total * part / n) - starts.begin();
            const int64_t hi = std::lower_bound(starts.begin(), starts.end() - 1,
                                                total * (part + 1) / n) - starts.begin();
            for (int64_t k = lo; k < (part == n - 1 ? n_rows : hi); ++k) task(k);
          };
          auto add = [&](int part) {
            int64_t lo, hi;
            nj_pool::Split(trial_cells, part, n, lo, hi);
            for (int64_t e = 0; e < total; ++e) {
              const int64_t c = ix[e];
              if (c >= lo && c < hi) rb[c] += vx[e];
            }
          };
          if (!nj_pool::ParallelFor(n, draw)) {
            for (int part = 0; part < n; ++part) draw(part);
          }
          if (!nj_pool::ParallelFor(n, add)) {
            for (int part = 0; part < n; ++part) add(part);
          }
          nj_pool::RecordShared(total, n, nj_pool::NowNs() - t0);
        }
        for (int64_t k = 0; k < n_rows; ++k) bad.targets += bad_targets[k];
      }
    }
  }
  if (bad.counts || bad.targets) {
    return ffi::Error::InvalidArgument(
        std::string(name) + "corrupted description: " + std::to_string(bad.counts) +
        " rows with a count outside [0, max_fan_out], " + std::to_string(bad.targets) +
        " targets outside the population");
  }
  return ffi::Error::Success();
}

// The weight and the delay in steps that the kernel draws from each word of `words` for one
// projection's parameters (used by the tests to compare the transforms with the XLA path
// over every 24-bit uniform).
ffi::Error ProceduralDrawsImpl(ffi::Buffer<ffi::U32> words, ffi::Buffer<ffi::F32> prm,
                               ffi::ResultBuffer<ffi::F32> weights,
                               ffi::ResultBuffer<ffi::S32> steps, int64_t weight_kind,
                               int64_t delay_kind, int64_t max_steps) {
  if (prm.element_count() != kParams || weights->element_count() != words.element_count() ||
      steps->element_count() != words.element_count() || weight_kind < 0 || weight_kind > 3 ||
      delay_kind < 0 || delay_kind > 2 || max_steps < 0 ||
      (delay_kind != kNoDelay && !(prm.typed_data()[9] > 0.0f))) {
    return ffi::Error::InvalidArgument("nj_procedural_draws: inconsistent arguments");
  }
  Proj p{};
  std::memcpy(p.prm, prm.typed_data(), sizeof(p.prm));
  p.weight_kind = weight_kind;
  p.delay_kind = delay_kind;
  p.max_steps = max_steps;
  const uint32_t* w = words.typed_data();
  float* out_w = weights->typed_data();
  int32_t* out_d = steps->typed_data();
  const int64_t total = static_cast<int64_t>(words.element_count());
  for (int64_t i = 0; i < total; i += kBlock) {
    const int64_t n = total - i < kBlock ? total - i : kBlock;
    Weights(p, w + i, out_w + i, n);
    if (delay_kind == kNoDelay) {
      std::memset(out_d + i, 0, n * sizeof(int32_t));
    } else {
      Delays(p, w + i, out_d + i, n);
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjProceduralDraws, nj_ffi::Ordered<ProceduralDrawsImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()  // words
                                  .Arg<ffi::Buffer<ffi::F32>>()  // parameters
                                  .Ret<ffi::Buffer<ffi::F32>>()  // weights
                                  .Ret<ffi::Buffer<ffi::S32>>()  // delays in steps
                                  .Attr<int64_t>("weight_kind")
                                  .Attr<int64_t>("delay_kind")
                                  .Attr<int64_t>("max_steps"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjProceduralDeliver, nj_ffi::Ordered<ProceduralDeliverImpl>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // spikes (*batch, n_source)
                                  .Arg<ffi::AnyBuffer>()  // step () int32
                                  .Arg<ffi::AnyBuffer>()  // ring in (*batch, D, T)
                                  .RemainingArgs()        // 3 buffers per projection
                                  .Ret<ffi::AnyBuffer>()  // ring out (aliased)
                                  .Attr<int64_t>("n_source")
                                  .Attr<int64_t>("n_slots")
                                  .Attr<int64_t>("n_targets")
                                  .Attr<int64_t>("overwrite")
                                  .Attr<ffi::Span<const int64_t>>("pre_offset")
                                  .Attr<ffi::Span<const int64_t>>("n_pre")
                                  .Attr<ffi::Span<const int64_t>>("n_post")
                                  .Attr<ffi::Span<const int64_t>>("rule")
                                  .Attr<ffi::Span<const int64_t>>("allow_self")
                                  .Attr<ffi::Span<const int64_t>>("fan_out")
                                  .Attr<ffi::Span<const int64_t>>("weight_kind")
                                  .Attr<ffi::Span<const int64_t>>("delay_kind")
                                  .Attr<ffi::Span<const int64_t>>("delay_steps")
                                  .Attr<ffi::Span<const int64_t>>("max_steps")
                                  .Attr<ffi::Span<const int64_t>>("target_offset"));
