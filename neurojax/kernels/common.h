// Shared by the compiled kernels: how a block of neurons of a whole-run kernel of an uncoupled
// population (lif_run.cc, hh_run.cc) writes its spike record, the huge-page advice on
// a fresh output buffer, the sharing of a kernel's independent tasks between the threads
// of the kernels' pool (pool.h; hh_run.cc, spike_matmul.cc), and the software prefetch of a byte
// range (the STDP and assembly kernels). Part of the compiled library's source hash
// (neurojax.kernels._build).

#ifndef NEUROJAX_KERNELS_COMMON_H_
#define NEUROJAX_KERNELS_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>

#include "pool.h"

#if defined(__linux__)
#include <sched.h>
#include <sys/mman.h>
#endif

namespace nj_run {

// a * b + c, rounded as XLA:CPU rounds it: XLA contracts a multiply feeding an add into one
// fused multiply-add on CPUs that have it (the library is built with -march=native and
// -ffp-contract=off, so only the kernels' explicit MulAdds are fused).
template <typename F>
inline F MulAdd(F a, F b, F c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// An integer of F's width, for the spike flags of one step of a block: as wide as the
// floats of the state, so that the neuron loop that sets them vectorises. They become the
// raster's bytes, or are summed into counts, in second, narrowing loops (RecordStep).
template <typename F>
using FlagOf = std::conditional_t<sizeof(F) == 4, int32_t, int64_t>;

// The record of step t of a block of m neurons: the raster row t (every == 1), or, at the
// last step of each window of `every` steps, the window's spike counts. `counts` carries the
// running sums between calls; rows are `row_stride` elements apart.
template <typename Flag, typename Out>
inline void RecordStep(const Flag* __restrict flags, Flag* __restrict counts, Out* __restrict out,
                       int64_t row_stride, int64_t m, int64_t t, int64_t every) {
  if (every == 1) {
    Out* __restrict row = out + t * row_stride;
    for (int64_t k = 0; k < m; ++k) row[k] = static_cast<Out>(flags[k]);
    return;
  }
  for (int64_t k = 0; k < m; ++k) counts[k] += flags[k];
  if ((t + 1) % every == 0) {
    Out* __restrict row = out + (t / every) * row_stride;
    for (int64_t k = 0; k < m; ++k) row[k] = static_cast<Out>(counts[k]);
    for (int64_t k = 0; k < m; ++k) counts[k] = 0;
  }
}

// Asks for every cache line of [p, p + bytes) ahead of use, for reading or for writing.
inline void PrefetchRange(const void* p, int64_t bytes, bool for_write) {
  if (bytes <= 0) return;
  const uintptr_t last = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes) - 1;
  for (uintptr_t l = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63); l <= last; l += 64) {
    const void* line = reinterpret_cast<const void*>(l);
    if (for_write) {
      __builtin_prefetch(line, 1);
    } else {
      __builtin_prefetch(line, 0);
    }
  }
}

// The record is a fresh buffer that the run touches first. On Linux every first touch of a
// 4 KiB page is a page fault (a few microseconds in a virtual machine), which for a large
// raster costs more than the simulation; asking for transparent huge pages on the buffer
// (2 MiB per fault) where the system allows it on request removes most of them. Only whole
// huge pages inside the buffer are advised, and only for buffers of 32 MiB or more; nothing
// changes if the system has no transparent huge pages.
inline void AdviseHugePages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  if (bytes < int64_t{16} * static_cast<int64_t>(kHuge)) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// The number of CPUs this process may run on (its affinity on Linux), read once.
inline int64_t AllowedCpus() {
  static const int64_t n = [] {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return static_cast<int64_t>(CPU_COUNT(&set));
#endif
    const unsigned hw = std::thread::hardware_concurrency();
    return static_cast<int64_t>(hw == 0 ? 1 : hw);
  }();
  return n;
}

// Runs task(0) .. task(total - 1), each once, on the kernels' one thread pool (pool.h): as
// many threads as neurojax's setting allows (the calling thread included), each claiming
// tasks one at a time, so that unequal tasks balance; returns once every task is done. A call
// made while another holds the pool runs its tasks on its own thread. (`pool`, XLA's
// intra-op pool of the FFI call, is no longer used: one pool per process.)
template <typename Pool, typename Task>
void RunTasks(int64_t total, Pool& pool, Task task) {
  (void)pool;
  if (total <= 0) return;
  const int threads = static_cast<int>(
      std::min<int64_t>(static_cast<int64_t>(nj_pool::Threads()), total));
  std::atomic<int64_t> next{0};
  auto part = [&](int) {
    for (int64_t b; (b = next.fetch_add(1, std::memory_order_relaxed)) < total;) task(b);
  };
  nj_pool::RunParts(threads, part);
}

}  // namespace nj_run

#endif  // NEUROJAX_KERNELS_COMMON_H_
