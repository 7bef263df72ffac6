// The per-step counts of independent Poisson sources (the microcircuit's background,
// neurojax.models.PoissonCounts) in one call through XLA's FFI, split by source ranges over
// the kernels' threads (pool.h).
//
// nj_poisson_counts: for every element q of the output (row-major, shape (*batch, n)), with
// source i = q mod n:
//   w = word q of JAX's Threefry sequence under `key` (threefry.h)
//   u = bitcast<float>((w >> 9) | 0x3F800000) - 1        (jax.random.uniform, float32)
//   counts[q] = #{k : u > table[level[i], k]}              (inversion of the Poisson CDF)
// the same integers as the pure-JAX path (`jr.uniform` then `sum(u[..., None] >
// table[level])`), whatever the number of threads: each element is computed on its own.
//
// Why a kernel: JAX evaluates Threefry on CPU as a loop of small XLA computations and the
// table lookup as an (n, n_terms) gather; at the microcircuit's scale 0.1 the background's
// draws were about 45 % of a network step, on one thread (benchmarks/results/
// thread_scaling.md). Here the draws of a range of sources stay in registers and the ranges
// go to the pool's threads.
//
// Arguments: key (2,) uint32 (threefry key data), level (n,) int32 (each source's row of the
// table), table (n_levels, n_terms) float32 (the CDF per rate). Result: counts, float32, of
// n_rows * n elements.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "pool.h"
#include "threefry.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

namespace ffi = xla::ffi;

namespace {

// Elements [begin, end) of the counts.
void Counts(uint32_t k0, uint32_t k1, const int32_t* level, const float* table, float* out,
            int64_t n, int64_t n_terms, int64_t begin, int64_t end) {
  constexpr int64_t kChunk = 256;
  uint32_t words[kChunk];
  for (int64_t q = begin; q < end;) {
    const int64_t i0 = q % n;
    const int64_t m = std::min({kChunk, end - q, n - i0});
    nj_threefry::Words(k0, k1, words, m, q);
    for (int64_t j = 0; j < m; ++j) {
      const uint32_t bits = (words[j] >> 9) | 0x3F800000u;
      float one_to_two;
      std::memcpy(&one_to_two, &bits, sizeof(float));
      const float u = one_to_two - 1.0f;
      const float* row = table + static_cast<int64_t>(level[i0 + j]) * n_terms;
      int32_t c = 0;
      for (int64_t k = 0; k < n_terms; ++k) c += u > row[k] ? 1 : 0;
      out[q + j] = static_cast<float>(c);
    }
    q += m;
  }
}

// The measured cost of one element on one thread (see nj_pool::OwnCost).
nj_pool::OwnCost element_cost;

ffi::Error PoissonCountsImpl(ffi::AnyBuffer key, ffi::AnyBuffer level, ffi::AnyBuffer table,
                             ffi::Result<ffi::AnyBuffer> counts) {
  if (key.element_type() != ffi::DataType::U32 || key.element_count() != 2) {
    return ffi::Error::InvalidArgument("nj_poisson_counts: key must be (2,) uint32");
  }
  if (level.element_type() != ffi::DataType::S32 || table.element_type() != ffi::DataType::F32 ||
      counts->element_type() != ffi::DataType::F32) {
    return ffi::Error::InvalidArgument(
        "nj_poisson_counts: level must be int32, table and counts float32");
  }
  const auto td = table.dimensions();
  const int64_t n = static_cast<int64_t>(level.element_count());
  const int64_t total = static_cast<int64_t>(counts->element_count());
  if (td.size() != 2 || n == 0 || total % n != 0 || total >= (int64_t{1} << 32)) {
    return ffi::Error::InvalidArgument(
        "nj_poisson_counts: table must be (n_levels, n_terms), counts a whole number of rows "
        "of n sources, fewer than 2**32 elements");
  }
  const int64_t n_levels = td[0], n_terms = td[1];
  const auto* lv = static_cast<const int32_t*>(level.untyped_data());
  for (int64_t i = 0; i < n; ++i) {
    if (lv[i] < 0 || lv[i] >= n_levels) {
      return ffi::Error::InvalidArgument("nj_poisson_counts: level[" + std::to_string(i) +
                                         "] = " + std::to_string(lv[i]) + " is not in [0, " +
                                         std::to_string(n_levels) + ")");
    }
  }
  const auto* k = static_cast<const uint32_t*>(key.untyped_data());
  const auto* tb = static_cast<const float*>(table.untyped_data());
  auto* out = static_cast<float*>(counts->untyped_data());
  // Until a call has been timed on one thread, calls run on one thread (and are timed).
  int64_t work = 0;
  const int threads = element_cost.Threads(total, work);
  if (threads <= 1) {
    const int64_t t0 = nj_pool::NowNs();
    Counts(k[0], k[1], lv, tb, out, n, n_terms, 0, total);
    if (total >= 1024) element_cost.Record(total, nj_pool::NowNs() - t0);
    return ffi::Error::Success();
  }
  auto part = [&](int t) {
    int64_t begin, end;
    nj_pool::Split(total, t, threads, begin, end);
    Counts(k[0], k[1], lv, tb, out, n, n_terms, begin, end);
  };
  const int64_t t0 = nj_pool::NowNs();
  nj_pool::RunParts(threads, part);
  nj_pool::RecordShared(work, threads, nj_pool::NowNs() - t0);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjPoissonCounts, nj_ffi::Ordered<PoissonCountsImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // key (2,) uint32
                                  .Arg<ffi::AnyBuffer>()   // level (n,) int32
                                  .Arg<ffi::AnyBuffer>()   // table (n_levels, n_terms)
                                  .Ret<ffi::AnyBuffer>());  // counts (*batch, n) float32
