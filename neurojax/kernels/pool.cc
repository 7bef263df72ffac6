// The one thread pool of neurojax's compiled kernels: see pool.h.

#include "pool.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace nj_pool {
namespace {

// How long a worker that finished a job looks for the next one before it sleeps: long enough
// to bridge the XLA operations between two kernel calls of a network step (tens of
// microseconds), short enough that a pool between runs costs no CPU time.
constexpr int64_t kSpinNs = 100'000;

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
#else
  (void)word;
  (void)expected;
  std::this_thread::yield();
#endif
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
#else
  (void)word;
#endif
}

struct State {
  std::mutex run_mu;  // held by the one call that uses the workers
  std::atomic<int> threads{1};  // the setting (NjSetThreads; read by calls without the lock)
  std::vector<std::thread> workers;
  std::atomic<uint32_t> generation{0};  // bumped once per job (and to stop the workers)
  std::atomic<int> sleepers{0};
  std::atomic<int> pending{0};  // workers that have not finished the current job
  std::atomic<bool> quit{false};
  // The current job: written before `generation` is bumped, read after it is seen.
  void (*fn)(void*, int) = nullptr;
  void* ctx = nullptr;
  int n_job = 0;      // threads taking part (the caller included)
  int n_parts = 0;    // parts of the job: thread t runs t, t + n_job, ...
  // The cost model: the round trip of an empty job (ns) and the cost of one unit of work on
  // one thread (ns, an exponential average).
  std::atomic<int64_t> round_trip_ns{0};
  std::atomic<double> unit_ns{0.0};
  // 0: the measured rule decides; 1: every call with work is shared out; 2: none is (the
  // tests' switches, NjSetSharing). And the number of jobs handed to the workers so far.
  std::atomic<int> sharing{0};
  std::atomic<int64_t> jobs{0};
  // What a shared call costs beyond its work divided among its threads (ns, an exponential
  // average of measured calls; the calibration's round trips to begin with), and the calls
  // declined since the last shared one (every 32nd that would gain on an idle machine is
  // shared anyway, so that the average follows the machine's load both ways). A probe shares
  // a burst of `kBurst` calls: its first call finds the workers asleep (they stop spinning
  // 0.1 ms after their last job) and pays their wake-up, which a call in a run of shared calls
  // does not pay; timed alone, probes would keep a rule that declined from ever seeing what
  // sharing costs once the workers are awake.
  std::atomic<double> overhead_ns{0.0};
  std::atomic<int64_t> declined{0};
  std::atomic<int> burst{0};  // calls of the current probe still to share
  // Declined calls between two probes: 32 at first and after a call that the rule shares,
  // doubled after each probe that did not make sharing worth it (up to 4096), so that a
  // network whose calls never gain (COBA's few hundred synapses a step) soon stops paying
  // for probes.
  std::atomic<int64_t> probe_every{32};
};

constexpr int kBurst = 4;

// Never destroyed: workers may still sleep in it while the process exits.
State& S() {
  static State* s = new State;
  return *s;
}

void Worker(State& s, int id, uint32_t seen) {
  for (;;) {
    const int64_t start = NowNs();
    int64_t spins = 0;
    while (s.generation.load(std::memory_order_seq_cst) == seen) {
      CpuRelax();
      if ((++spins & 63) == 0 && NowNs() - start > kSpinNs) {
        s.sleepers.fetch_add(1, std::memory_order_seq_cst);
        while (s.generation.load(std::memory_order_seq_cst) == seen) {
          FutexWait(&s.generation, seen);
        }
        s.sleepers.fetch_sub(1, std::memory_order_seq_cst);
        break;
      }
    }
    seen = s.generation.load(std::memory_order_acquire);
    if (s.quit.load(std::memory_order_acquire)) return;
    for (int part = id; part < s.n_parts && id < s.n_job; part += s.n_job) s.fn(s.ctx, part);
    s.pending.fetch_sub(1, std::memory_order_acq_rel);
  }
}

// Hands the job to every worker, runs part 0, waits for the others. run_mu held.
void Dispatch(State& s, int n, int parts, void (*fn)(void*, int), void* ctx) {
  s.fn = fn;
  s.ctx = ctx;
  s.n_job = n;
  s.n_parts = parts;
  s.pending.store(static_cast<int>(s.workers.size()), std::memory_order_relaxed);
  s.generation.fetch_add(1, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&s.generation);
  for (int part = 0; part < parts; part += n) fn(ctx, part);
  // A machine shared with other processes may not run a worker at once: after a short spin
  // the caller gives its core away while it waits.
  for (int64_t spins = 0; s.pending.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 4096) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

void StopWorkers(State& s) {
  if (s.workers.empty()) return;
  s.quit.store(true, std::memory_order_release);
  s.generation.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&s.generation);
  for (std::thread& w : s.workers) w.join();
  s.workers.clear();
  s.quit.store(false, std::memory_order_release);
}

// The calibration of the cost model when the workers start: the shortest of seven round
// trips of an empty job with the workers awake (a network step that shares its calls keeps
// them spinning; what waking them costs where calls are sparse, or a worker that another
// thread keeps off its core, shows in the measured overhead of the shared calls,
// `RecordShared`, which decides from then on); and the cost of one unit of work, a scattered
// add into a buffer of the size of a small network's ring, as the delivery kernels do. (A
// median that counted wake-ups or a descheduled worker, as it once did, could make the
// first estimate so large that no call of the process was ever shared, not even a probe.)
void Calibrate(State& s) {
  auto nothing = [](void*, int) {};
  std::vector<int64_t> trips;
  const int n = static_cast<int>(s.workers.size()) + 1;
  Dispatch(s, n, n, nothing, nullptr);  // wakes the workers
  for (int r = 0; r < 7; ++r) {
    const int64_t t0 = NowNs();
    Dispatch(s, n, n, nothing, nullptr);
    trips.push_back(NowNs() - t0);
  }
  std::sort(trips.begin(), trips.end());
  s.round_trip_ns.store(std::max<int64_t>(1, trips.front()));
  if (s.unit_ns.load() == 0.0) {
    constexpr int64_t kCells = 1 << 16, kAdds = 1 << 16;
    std::vector<float> ring(kCells, 0.0f);
    std::vector<uint32_t> idx(kAdds);
    uint32_t x = 12345;
    for (auto& i : idx) {
      x = x * 1664525u + 1013904223u;
      i = (x >> 8) % kCells;
    }
    const int64_t t0 = NowNs();
    for (int64_t k = 0; k < kAdds; ++k) ring[idx[k]] += 0.5f;
    const int64_t dt = NowNs() - t0;
    volatile float sink = ring[kCells / 2];
    (void)sink;
    s.unit_ns.store(std::max(0.1, static_cast<double>(dt) / kAdds));
  }
}

// Starts the workers of the setting and calibrates the cost model, unless done. run_mu held.
void Start(State& s) {
  const int want = s.threads.load() - 1;
  if (static_cast<int>(s.workers.size()) == want && s.round_trip_ns.load() != 0) return;
  StopWorkers(s);
  const uint32_t seen = s.generation.load();
  for (int id = 1; id <= want; ++id) s.workers.emplace_back(Worker, std::ref(s), id, seen);
  if (want > 0) Calibrate(s);
}

}  // namespace

int Threads() { return S().threads.load(std::memory_order_relaxed); }

bool Run(int n, void (*fn)(void*, int), void* ctx) {
  State& s = S();
  if (n <= 1) {
    if (n == 1) fn(ctx, 0);
    return true;
  }
  std::unique_lock<std::mutex> lock(s.run_mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  Start(s);
  // Every part runs, whatever the pool's size now (the setting may have changed since the
  // caller split its work into n parts).
  const int threads = std::min(n, static_cast<int>(s.workers.size()) + 1);
  if (threads <= 1) {
    for (int part = 0; part < n; ++part) fn(ctx, part);
    return true;
  }
  s.jobs.fetch_add(1, std::memory_order_relaxed);
  Dispatch(s, threads, n, fn, ctx);
  return true;
}

int Sharing() { return S().sharing.load(std::memory_order_relaxed); }

int Worth(int64_t work, int phases) {
  State& s = S();
  const int n = s.threads.load(std::memory_order_relaxed);
  const int sharing = s.sharing.load(std::memory_order_relaxed);
  if (n <= 1 || work <= 0 || sharing == 2) return 1;
  if (sharing == 1) return n;
  const int64_t trip = s.round_trip_ns.load(std::memory_order_relaxed);
  const double unit = s.unit_ns.load(std::memory_order_relaxed);
  if (trip == 0 || unit == 0.0) {
    // Not calibrated yet: start the workers and time them now (about a millisecond, once
    // per process and setting), unless another call holds the pool.
    std::unique_lock<std::mutex> lock(s.run_mu, std::try_to_lock);
    if (!lock.owns_lock()) return 1;
    Start(s);
    return Worth(work, phases);
  }
  // Sharing over n threads saves work * unit * (1 - 1/n) and costs the measured overhead
  // (at first, `phases` calibrated round trips).
  const double saved = static_cast<double>(work) * unit * (1.0 - 1.0 / n);
  double overhead = s.overhead_ns.load(std::memory_order_relaxed);
  if (overhead == 0.0) overhead = static_cast<double>(phases) * static_cast<double>(trip);
  if (saved > overhead) {
    s.probe_every.store(32, std::memory_order_relaxed);
    return n;
  }
  // Probes are for calls whose saving exceeds the round trips of awake workers; a calibrated
  // trip above a tenth of the spin window means the workers were kept off their cores when
  // it was timed (another thread's spinning, XLA's pool among them), not what a trip costs,
  // so it is capped there and the probes measure the real cost.
  const double probe_trip = std::min<double>(static_cast<double>(trip), kSpinNs / 10.0);
  if (saved > static_cast<double>(phases) * probe_trip) {
    int left = s.burst.load(std::memory_order_relaxed);
    while (left > 0) {
      if (s.burst.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) return n;
    }
    const int64_t every = s.probe_every.load(std::memory_order_relaxed);
    if (s.declined.fetch_add(1, std::memory_order_relaxed) + 1 >= every) {
      // a probe of a machine that may have become quieter
      s.declined.store(0, std::memory_order_relaxed);
      s.probe_every.store(std::min<int64_t>(2 * every, 4096), std::memory_order_relaxed);
      s.burst.store(kBurst - 1, std::memory_order_relaxed);
      return n;
    }
  }
  return 1;
}

void RecordShared(int64_t work, int n, int64_t ns) {
  State& s = S();
  const double unit = s.unit_ns.load(std::memory_order_relaxed);
  if (n <= 1 || ns <= 0 || unit == 0.0) return;
  const double sample =
      std::max(0.0, static_cast<double>(ns) - static_cast<double>(work) * unit / n);
  const double old = s.overhead_ns.load(std::memory_order_relaxed);
  s.overhead_ns.store(old == 0.0 ? sample : 0.8 * old + 0.2 * sample,
                      std::memory_order_relaxed);
}

double UnitNs() { return S().unit_ns.load(std::memory_order_relaxed); }

void RecordSerial(int64_t work, int64_t ns) {
  if (work < 1024 || ns <= 0) return;
  State& s = S();
  const double measured = static_cast<double>(ns) / static_cast<double>(work);
  const double old = s.unit_ns.load(std::memory_order_relaxed);
  s.unit_ns.store(old == 0.0 ? measured : 0.9 * old + 0.1 * measured,
                  std::memory_order_relaxed);
}

}  // namespace nj_pool

// Sets the number of threads the kernels use (the caller included; values below 1 count as 1).
// The workers restart on the next shared call; a call in progress finishes first.
extern "C" void NjSetThreads(int n) {
  nj_pool::State& s = nj_pool::S();
  std::lock_guard<std::mutex> lock(s.run_mu);
  n = std::max(1, n);
  if (n == s.threads) return;
  nj_pool::StopWorkers(s);
  s.threads = n;
  s.round_trip_ns.store(0);
  s.overhead_ns.store(0.0);
  s.probe_every.store(32);
  s.declined.store(0);
}

extern "C" int NjThreads() { return nj_pool::S().threads.load(); }

// The tests' switches: 0, the measured rule (the default); 1, share out every call that has
// work; 2, share out none. Returns the previous mode.
extern "C" int NjSetSharing(int mode) {
  return nj_pool::S().sharing.exchange(mode < 0 || mode > 2 ? 0 : mode);
}

// The number of jobs handed to the workers since the process started.
extern "C" int64_t NjSharedJobs() { return nj_pool::S().jobs.load(); }

// The cost model's current figures, for benchmarks and diagnostics: out[0] the calibrated
// round trip (ns), out[1] the cost of one unit of work on one thread (ns), out[2] the measured
// overhead of a shared call beyond its work divided among its threads (ns, 0 before the first
// shared call).
extern "C" void NjPoolModel(double* out) {
  nj_pool::State& s = nj_pool::S();
  out[0] = static_cast<double>(s.round_trip_ns.load());
  out[1] = s.unit_ns.load();
  out[2] = s.overhead_ns.load();
}
