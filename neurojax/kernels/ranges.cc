// Whether an integer array holds a value outside [lo, hi), through XLA's FFI, split over the
// kernels' threads (pool.h): the run-start check of a network's indices and delays
// (neurojax.kernels._ranges, used by the layouts' and the network's check_invariants on
// traced arrays).
//
// nj_out_of_range: out = any(x < lo or x >= hi) over every element of x (int8, int16, int32,
// uint8, uint16 or uint32, any shape), lo and hi int64 attributes. Each element is tested as
// (unsigned)(x - lo) >= (unsigned)(hi - lo) in x's own width after the bounds are clamped to
// x's type (one comparison per element, vectorised), and the threads OR their parts: the
// answer does not depend on the number of threads.
//
// Why a kernel: XLA's CPU backend reduces an array on one thread; a scale-0.1 microcircuit
// passed into the caller's jit as an argument paid 8-9 ms per call checking its 29.9 million
// postsynaptic indices on one core, and about 6 ms its per-synapse delays, before a run of
// 80-160 ms that the network run spreads over every thread (benchmarks/results/
// thread_scaling.md). The check is bound by memory bandwidth, which the cores share, so
// threads shorten it by what the machine's bandwidth allows.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "pool.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

namespace ffi = xla::ffi;

namespace {

// Whether x[begin, end) holds a value v with (U)(v - lo) >= span.
template <typename T>
bool Outside(const T* x, int64_t begin, int64_t end, T lo, std::make_unsigned_t<T> span) {
  using U = std::make_unsigned_t<T>;
  const U ulo = static_cast<U>(lo);
  U bad = 0;
  constexpr int64_t kBlock = 1 << 16;  // an early answer for arrays that are mostly bad
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t e = std::min(end, b + kBlock);
    for (int64_t i = b; i < e; ++i) {
      bad |= static_cast<U>(static_cast<U>(static_cast<U>(x[i]) - ulo) >= span);
    }
    if (bad) return true;
  }
  return false;
}

// The measured cost of one byte on one thread (see nj_pool::OwnCost).
nj_pool::OwnCost byte_cost;

template <typename T>
bool AnyOutside(const T* x, int64_t n, int64_t lo, int64_t hi) {
  constexpr int64_t kMin = std::numeric_limits<T>::min();
  constexpr int64_t kMax = std::numeric_limits<T>::max();
  lo = std::max(lo, kMin);
  hi = std::min(hi, kMax + 1);
  if (n == 0) return false;
  if (lo >= hi) return true;                    // nothing is allowed
  if (lo == kMin && hi == kMax + 1) return false;  // everything is
  using U = std::make_unsigned_t<T>;
  const T tlo = static_cast<T>(lo);
  const U span = static_cast<U>(hi - lo);  // < 2**bits: one bound at least is inside T
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  int64_t work = 0;
  const int threads = byte_cost.Threads(bytes, work);
  if (threads <= 1) {
    const int64_t t0 = nj_pool::NowNs();
    const bool bad = Outside(x, 0, n, tlo, span);
    if (!bad && bytes >= (1 << 16)) byte_cost.Record(bytes, nj_pool::NowNs() - t0);
    return bad;
  }
  std::atomic<bool> found{false};
  auto part = [&](int t) {
    int64_t begin, end;
    nj_pool::Split(n, t, threads, begin, end);
    if (Outside(x, begin, end, tlo, span)) found.store(true, std::memory_order_relaxed);
  };
  const int64_t t0 = nj_pool::NowNs();
  nj_pool::RunParts(threads, part);
  nj_pool::RecordShared(work, threads, nj_pool::NowNs() - t0);
  return found.load();
}

ffi::Error OutOfRangeImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out, int64_t lo,
                          int64_t hi) {
  if (out->element_type() != ffi::DataType::PRED || out->element_count() != 1) {
    return ffi::Error::InvalidArgument("nj_out_of_range: the result must be one bool");
  }
  const int64_t n = static_cast<int64_t>(x.element_count());
  const void* d = x.untyped_data();
  bool bad;
  switch (x.element_type()) {
    case ffi::DataType::S8: bad = AnyOutside(static_cast<const int8_t*>(d), n, lo, hi); break;
    case ffi::DataType::S16: bad = AnyOutside(static_cast<const int16_t*>(d), n, lo, hi); break;
    case ffi::DataType::S32: bad = AnyOutside(static_cast<const int32_t*>(d), n, lo, hi); break;
    case ffi::DataType::U8: bad = AnyOutside(static_cast<const uint8_t*>(d), n, lo, hi); break;
    case ffi::DataType::U16: bad = AnyOutside(static_cast<const uint16_t*>(d), n, lo, hi); break;
    case ffi::DataType::U32: bad = AnyOutside(static_cast<const uint32_t*>(d), n, lo, hi); break;
    default:
      return ffi::Error::InvalidArgument(
          "nj_out_of_range: x must be int8, int16, int32, uint8, uint16 or uint32");
  }
  *static_cast<bool*>(out->untyped_data()) = bad;
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjOutOfRange, nj_ffi::Ordered<OutOfRangeImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // x, any shape
                                  .Ret<ffi::AnyBuffer>()   // () bool
                                  .Attr<int64_t>("lo")
                                  .Attr<int64_t>("hi"));
