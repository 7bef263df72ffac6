// Shared by the compiled kernels: how a block of neurons of a whole-run kernel of an uncoupled
// population (lif_run.cc, hh_run.cc) writes its spike record, the huge-page advice on
// a fresh output buffer, the sharing of a kernel's independent tasks between the threads
// of XLA's intra-op pool (hh_run.cc, spike_matmul.cc), and the software prefetch of a byte
// range (the STDP and assembly kernels). Part of the compiled library's source hash
// (neurojax.kernels._build).

#ifndef NEUROJAX_KERNELS_COMMON_H_
#define NEUROJAX_KERNELS_COMMON_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>

#if defined(__linux__)
#include <sched.h>
#include <sys/mman.h>
#endif

namespace nj_run {

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

// Runs task(0) .. task(total - 1), each once, on the calling thread and on helpers scheduled
// on `pool` (an FFI ThreadPool: num_threads() and Schedule(fn)). Tasks are claimed one at a
// time; the caller returns once every task is done. A helper that starts late finds nothing
// left to claim and only touches the shared counters, which it keeps alive.
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

struct TaskCounter {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t total = 0;
  std::mutex mu;
  std::condition_variable cv;
};

template <typename Pool, typename Task>
void RunTasks(int64_t total, Pool& pool, Task task) {
  if (total <= 0) return;
  auto work = std::make_shared<TaskCounter>();
  work->total = total;
  const auto drain = [task](TaskCounter& w) {
    for (int64_t b; (b = w.next.fetch_add(1)) < w.total;) {
      task(b);
      if (w.done.fetch_add(1) + 1 == w.total) {
        std::lock_guard<std::mutex> lock(w.mu);
        w.cv.notify_all();
      }
    }
  };
  // The calling thread works too: with the pool's workers, at most one thread per core the
  // process may use (neurojax sizes XLA's pool one below the cores; XLA's own default has one
  // worker per core, and then one of them stays idle rather than oversubscribe the cores).
  const int64_t threads =
      std::min<int64_t>({static_cast<int64_t>(pool.num_threads()) + 1, AllowedCpus(), total});
  const int64_t helpers = threads - 1;
  for (int64_t j = 0; j < helpers; ++j) pool.Schedule([work, drain] { drain(*work); });
  drain(*work);
  std::unique_lock<std::mutex> lock(work->mu);
  work->cv.wait(lock, [&] { return work->done.load() == work->total; });
}

}  // namespace nj_run

#endif  // NEUROJAX_KERNELS_COMMON_H_
