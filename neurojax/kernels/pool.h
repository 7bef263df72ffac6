// The one thread pool of neurojax's compiled kernels (pool.cc): persistent workers that a
// kernel call hands one job at a time, so that a call of a few microseconds can use several
// cores without creating threads. Part of the compiled library's source hash
// (neurojax.kernels._build).
//
// Sized by `NjSetThreads(n)` (called from neurojax._threads through the library's loader:
// `nj.use_cpu_threads`, `NEUROJAX_CPU_THREADS`, else the CPUs the process may run on): n
// threads in all, the calling thread included, so n - 1 workers. A worker that finishes a job
// spins for a short while for the next one (a network step calls its kernels every few
// microseconds) and then sleeps on a futex (Linux; elsewhere it yields), so an idle pool costs
// nothing.
//
// Every kernel that uses the pool splits its work so that each thread writes only its own
// part of the outputs (the targets, ring columns or synapses it owns), with no atomics and no
// locks, and sums floating-point values in an order that does not depend on the number of
// threads: results are bit for bit the same with 1 or n threads.
//
// Whether a call is worth sharing out is decided by a measured cost model (`Worth`): the
// call's work (synapses touched) times the measured cost of one unit of work on one thread,
// against the measured overhead of a shared call (the pool's round trips, timed when its
// workers start, then an average over the shared calls, which follows the machine's load).

#ifndef NEUROJAX_KERNELS_POOL_H_
#define NEUROJAX_KERNELS_POOL_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace nj_pool {

// Threads the kernels may use (the setting; >= 1).
int Threads();

// Runs fn(ctx, t) once for every part t in [0, n) on up to n threads (the pool's size: a
// thread runs parts t, t + threads, ...), the caller running part 0, and returns once all
// are done. Returns false, having run nothing, when
// another call holds the pool (a kernel called concurrently from two XLA threads): the caller
// then does the work on its own thread.
bool Run(int n, void (*fn)(void*, int), void* ctx);

template <typename Fn>
bool ParallelFor(int n, Fn& fn) {
  return Run(n, [](void* c, int t) { (*static_cast<Fn*>(c))(t); }, &fn);
}

// ParallelFor, or the same parts one after the other on the calling thread when the pool is
// held by another call.
template <typename Fn>
void RunParts(int n, Fn& fn) {
  if (!ParallelFor(n, fn)) {
    for (int t = 0; t < n; ++t) fn(t);
  }
}

// How many threads a call of `work` units (synapses touched) should use, given `phases`
// hand-overs to the pool: 1 unless sharing it out saves more than the round trips cost.
int Worth(int64_t work, int phases);

// The sharing rule in force (NjSetSharing, the tests' switch): 0 the measured rule decides,
// 1 every call with work is shared out, 2 none is.
int Sharing();

// Feeds the measured time of a call of `work` units shared out over n threads into the cost
// model (what sharing costs beyond the work divided among the threads).
void RecordShared(int64_t work, int n, int64_t ns);

// The measured cost of one unit of work (a synapse touched) on one thread, in ns (0 before
// the pool's first calibration): a kernel whose work is of another kind converts its own
// measured cost into these units.
double UnitNs();

// Feeds the measured cost of `work` units done on one thread in `ns` nanoseconds into the
// cost model (an exponential average).
void RecordSerial(int64_t work, int64_t ns);

// The measured cost on one thread of one unit of a kernel's own kind of work (a drawn
// element, a byte checked), which converts a call's size into the pool's unit (a synapse
// touched) for Worth. One per kernel, static.
class OwnCost {
 public:
  // How many threads a call of `size` own units should use, with its work in the pool's
  // unit in `work`: one (and work 0) while the cost is unmeasured or there is one thread;
  // such a call is then timed on one thread (Record).
  int Threads(int64_t size, int64_t& work) const {
    work = 0;
    const double per = ns_.load(std::memory_order_relaxed);
    if (per <= 0.0 || nj_pool::Threads() <= 1) return 1;
    const double unit = UnitNs();
    work = unit > 0.0 ? static_cast<int64_t>(static_cast<double>(size) * per / unit) : size;
    return Worth(work, 1);
  }
  // Feeds a call of `size` units that took `ns` on one thread (an exponential average).
  void Record(int64_t size, int64_t ns) {
    if (size <= 0 || ns <= 0) return;
    const double sample = static_cast<double>(ns) / static_cast<double>(size);
    const double per = ns_.load(std::memory_order_relaxed);
    ns_.store(per == 0.0 ? sample : 0.9 * per + 0.1 * sample, std::memory_order_relaxed);
  }

 private:
  std::atomic<double> ns_{0.0};
};

// The pause of a spin-wait loop.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The [begin, end) of part t of n of a range of `total` items split evenly.
inline void Split(int64_t total, int t, int n, int64_t& begin, int64_t& end) {
  begin = total * t / n;
  end = total * (t + 1) / n;
}

}  // namespace nj_pool

#endif  // NEUROJAX_KERNELS_POOL_H_
