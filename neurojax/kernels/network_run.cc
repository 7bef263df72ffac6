// A whole run of a network of LIF neurons with exponential synapses on CPU, in one
// call through XLA's FFI, on the kernels' threads (pool.h): neurojax.network._cpu_run, used by
// `nj.simulate` for the networks it describes (the Potjans-Diesmann microcircuit with its
// Poisson background is one).
//
// nj_network_run runs `n_steps` steps of `nj.Network.step`, each in its four phases, with the
// operations of the per-step path in its order, so that both give identical numbers:
//   1. arrivals: every synaptic state s (a projection that has its own) reads its columns of
//      slot k mod D of its ring and decays: g <- g * decay + x (one multiply-add, as XLA:CPU
//      contracts it; see common.h);
//   2. neurons: the current of a neuron is the sum of the currents of the states that reach
//      its population (g, or g * (e_rev - v) for a conductance output), in the network's
//      projection order, then its constant input (see Current for the rounding); then
//      `LIF.step` as lif_run.cc runs it,
//      with v_inf = v_rest + r_m * current (a multiply-add). Poisson count sources
//      (`PoissonCounts`): the key is split as `jax.random.split` splits it (Threefry, the
//      partitionable scheme) and each source's count is drawn from the subkey as poisson.cc
//      draws it;
//   4. delivery: slot k mod D of every ring is zeroed, then each spike of the LIF neurons
//      (ascending), through each event projection of the ring that leaves its population (in
//      the projection order), adds its synapses' weights (ascending) at slot
//      (k + 1 + delay) mod D; a source's counts reach an input projection's targets as
//      count[pre[j]] * w[j], projection by projection. These are the orders of
//      csr_deliver.cc and of the pure-JAX delivery.
//   3. plasticity (pair STDP, `nj.STDP` in both modes and pairings, on event projections
//      without a delay history): the operations of nj_stdp_update (csr_deliver.cc) in its
//      order per synapse: x <- x * decay_x plus this step's presynaptic spikes (or set to 1,
//      `nearest`); every synapse of a spiking presynaptic neuron's row is depressed,
//      w <- clip(w - a_minus * f_-(w) * (y * decay_y) * s); y <- y * decay_y plus this step's
//      postsynaptic spikes; every synapse of a spiking postsynaptic neuron's column is
//      potentiated, w <- clip(w + a_plus * f_+(w) * x * s); the delivery then reads the new
//      weights;
//
// Threads. Thread t owns a range of the LIF neurons and every ring column that feeds one of
// them. A step is: arrivals, neuron update and spike list of its own neurons, then the
// sources' draws in chunks that any thread claims (phase A); one barrier; delivery into its
// own ring columns, walking every thread's spike list in thread order, so every spike in
// ascending order, and taking from each row only the run of targets it owns (rows sorted by
// target) (phase B). A ring cell is written by one thread, in the serial order; the next
// step's phase A reads only columns the same thread wrote; spike lists are kept for two
// steps and counts for three (a thread that waits at the barrier draws the next step's
// chunks while another may still deliver the last step's), so one barrier per step
// suffices, and the results do not depend on the number of threads. Plasticity: thread t
// advances the presynaptic trace of its own neurons in phase A, into the buffer of the
// step's parity (the other parity holds the last step's, which a thread still in phase B
// may read); in phase B it depresses the synapses of the spiking rows that target its own
// neurons (its runs of those rows, the ones it delivers: with rows sorted by target, in the
// same walk as the delivery, which also potentiates a synapse whose target spiked too),
// advances its neurons' postsynaptic trace and potentiates the columns of its own spiking
// neurons, so that every synapse is written by the thread that owns its target, in the
// serial order. The neuron
// ranges are first cut by each population's in-degree, then every 512 steps where the threads'
// measured busy times split evenly, when the wait that saves outweighs the measured cost of
// moving the sorted rows' split points with the cut; a cut changes only at a barrier, so it
// changes no result. The threads are chosen by timing steps on one thread and on all (see
// the call).
//
// Arguments (float32; one trial, vmap calls once per trial):
//   v, r (N,): the LIF neurons' state; params (7, N): v_rest, r_m, c = exp(-dt / tau_m)
//   (or dt / tau_m with `euler`), v_reset, v_th, t_ref, the constant input (bias, read
//   for populations that have one); dts (2,): dt, dt / 2;
//   g (G,): every synaptic state's g, concatenated; decay (G,): its exp(-dt / tau);
//   e_rev (G,): its reversal potential (read for conductance outputs);
//   rings (R_total,): every ring (D_r, W_r) flattened and concatenated;
//   step () int32: the step counter at the start;
//   key (S, 2) uint32, level (n_src,) int32, table (S * n_levels * n_terms) float32,
//   counts (n_src,) float32: the sources' keys, rate rows, CDF tables and last counts;
//   then per event projection: indptr, indices, weights, delays; per input projection:
//   pre, weights.
// Per plastic projection (after those): weights (nnz,), x (n_pre,), y (n_post,), col_ptr
// (n_post + 1,), col_syn (nnz,), col_pre (nnz,) int32, params (6,) = (a_plus, a_minus,
// w_min, w_max, decay_x, decay_y); its columns are checked against its rows before the run.
// Results: v, r, g, rings, key, counts (the state after the run), then per plastic
// projection its weights, x and y, then one raster per LIF
// population (n_rec, n) in the order of pop_meta and one per source (n_rec, n) in the order
// of source_meta: the bool raster (pred) with every == 1, else spike counts per window of
// `every` steps (uint8, uint16 or int32). (One array per population: a slice of one raster
// would cost a copy of it.)

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it (EINVAL)
#endif
#endif

#include "common.h"
#include "pool.h"
#include "spike_events.h"
#include "threefry.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

namespace ffi = xla::ffi;

namespace {

using nj_pool::CpuRelax;
using nj_run::MulAdd;

// A dissemination barrier for the n threads of one run: in round r thread t signals thread
// (t + 2^r) mod n and waits for the signal of thread (t - 2^r) mod n, so ceil(log2 n)
// rounds, each one cache line from one core to another; every line has one writer and no
// read-modify-write stalls a thread (a counting barrier's locked add waits for the line and
// its store buffer, and the thread that opens it stores into a line the others read). A
// waiting thread calls `fill()` (some work that needs no barrier) until it returns false or
// its signal comes, spins, then yields its core (a machine shared with other processes may
// not be running the thread it waits for).
struct Barrier {
  static constexpr int kRounds = 16;  // up to 65 536 threads
  struct alignas(64) Signal {
    std::atomic<uint64_t> count{0};
  };
  struct alignas(64) Count {
    uint64_t passed = 0;
  };
  int n = 1;
  std::unique_ptr<Signal[]> signals;  // [t * kRounds + r]: written by thread t - 2^r only
  std::unique_ptr<Count[]> counts;    // the barriers thread t has passed

  // For n threads, every count at zero (between runs of the threads only).
  void Reset(int threads) {
    n = threads;
    signals.reset(new Signal[static_cast<size_t>(n) * kRounds]);
    counts.reset(new Count[n]);
  }

  void Wait(int t) {
    Wait(t, [] { return false; });
  }

  template <typename Fill>
  void Wait(int t, Fill&& fill) {
    if (n <= 1) return;
    const uint64_t mine = ++counts[t].passed;
    bool filling = true;
    for (int r = 0, d = 1; d < n; ++r, d *= 2) {
      signals[((t + d) % n) * kRounds + r].count.store(mine, std::memory_order_release);
      const std::atomic<uint64_t>& in = signals[t * kRounds + r].count;
      for (int64_t spins = 0; in.load(std::memory_order_acquire) < mine; ++spins) {
        if (filling && (filling = fill())) {
          spins = 0;
          continue;
        }
        if (spins < 20000) {
          CpuRelax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
};

struct EventProj {
  const int32_t* indptr;
  const int32_t* post;
  const float* w;
  const void* delay;
  ffi::DataType delay_type;
  int64_t pre_off, n_pre;   // presynaptic neurons [pre_off, pre_off + n_pre) of the LIF vector
  int64_t ring, col0, n_post, post_off;  // targets: ring columns col0 + j <-> neuron post_off + j
  int64_t delay_steps;      // homogeneous delay (per_synapse false)
  bool per_synapse, sorted;
  int64_t nnz;
  // Sorted rows shared by several threads: split[b - 1][r] is the first synapse of row r
  // whose target is at or past the cut's boundary b (thread b's first neuron), kept with
  // the cut (Splits), so that a thread finds its run of a row without a search.
  std::vector<std::vector<int32_t>> split;
  std::vector<int64_t> split_at;  // the boundaries' targets the splits were made for
  int64_t plastic = -1;           // its plastic state (Run::plastics), or -1
};

// Pair STDP of one event projection (see the header): its weights (which the delivery
// reads), its presynaptic trace by step parity (xb[k & 1]: after step k's spikes), its
// postsynaptic trace and columns.
struct Plastic {
  int64_t e;
  float* w;
  float* xb[2];
  float* y;
  const int32_t* col_ptr;
  const int32_t* col_syn;
  const int32_t* col_pre;
  float a_plus, a_minus, lo, hi, decay_x, decay_y;
  bool multiplicative, nearest;
  std::vector<float> x_other;  // the storage of one parity (the other is the result)
};

struct InputProj {
  const int32_t* pre;
  const float* w;
  int64_t source;  // which source feeds it
  int64_t ring, col0, n_post, post_off, delay_steps;
};

struct Syn {
  int64_t off;  // in g, decay and e_rev
  int64_t ring, col0, n, post_off;
  bool conductance;  // its current is g * (e_rev - v) (else g)
};

struct Pop {
  int64_t off, n;
  std::vector<int64_t> terms;  // synaptic states, in the projection order
  bool input;                  // a constant input current (bias) is added after them
};

struct Source {
  int64_t off, n;  // sources [off, off + n) of the source vector
  int64_t table_off, n_terms;
};

// A run of ring columns [col0, col0 + n_post) that feeds neurons [post_off, + n_post).
struct Target {
  int64_t col0, n_post, post_off;
};

struct Ring {
  float* data;
  int64_t slots, width;
  bool from_source;  // fed by input projections (else by event projections)
  std::vector<int64_t> event, input;  // projections that deliver into it, in order
  std::vector<Target> targets;        // the distinct column runs of those projections
};

// A recorded raster: the bool raster (every == 1) or counts per window.
struct Raster {
  void* data;
  ffi::DataType type;
  int64_t width;
  int64_t bytes;  // the whole record

  void AddBlock(int64_t row, int64_t i0, const int32_t* flags, int64_t m, bool first) const;
};

template <typename T>
inline void AddRow(T* __restrict out, const int32_t* __restrict flags, int64_t m, bool first) {
  if (first) {
    for (int64_t j = 0; j < m; ++j) out[j] = static_cast<T>(flags[j]);
  } else {
    for (int64_t j = 0; j < m; ++j) out[j] = static_cast<T>(out[j] + flags[j]);
  }
}

inline void Raster::AddBlock(int64_t row, int64_t i0, const int32_t* flags, int64_t m,
                             bool first) const {
  const int64_t q = row * width + i0;
  switch (type) {
    case ffi::DataType::PRED:
    case ffi::DataType::U8:
      AddRow(static_cast<uint8_t*>(data) + q, flags, m, first);
      break;
    case ffi::DataType::U16:
      AddRow(static_cast<uint16_t*>(data) + q, flags, m, first);
      break;
    default:
      AddRow(static_cast<int32_t*>(data) + q, flags, m, first);
  }
}

inline int64_t Mod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}

// A thread's claim on the sources' chunks of one step parity: chunks [next, end) are
// unclaimed; its own range comes first (the sources that feed its neurons, so that the
// counts it delivers are in its cache and the claims touch a line no other thread writes
// while it has its own to draw), then it takes from the others'.
struct alignas(64) ChunkCursor {
  std::atomic<int64_t> next{0};
  int64_t begin = 0, end = 0;
};

// A thread's spikes of one step, ascending: the count and the first fifteen ids share one
// cache line, so that another thread reads a step's few spikes with one transfer between
// cores (the count of a std::vector lives apart from its elements, behind a pointer).
struct SpikeList {
  std::vector<int32_t> store;
  int32_t* buf = nullptr;  // 64-byte aligned: buf[0] the count, buf[1..] the ids

  // Room for `capacity` spikes, none listed.
  void Reserve(int64_t capacity) {
    store.assign(static_cast<size_t>(capacity) + 17, 0);
    const uintptr_t at = reinterpret_cast<uintptr_t>(store.data());
    buf = reinterpret_cast<int32_t*>((at + 63) & ~static_cast<uintptr_t>(63));
  }
  const int32_t* begin() const { return buf + 1; }
  const int32_t* end() const { return buf + 1 + buf[0]; }
};

// Everything one run needs, shared read-only by its threads except the arrays each thread
// writes in its own ranges.
struct Run {
  // LIF neurons
  int64_t n = 0;
  float* v;
  float* r;
  const float* v_rest;
  const float* r_m;
  const float* c;
  const float* v_reset;
  const float* v_th;
  const float* t_ref;
  float dt, half_dt;
  bool euler;
  std::vector<Pop> pops;
  // synapses and rings
  const float* bias;  // the constant inputs, per neuron (used by populations that have one)
  float* g;
  const float* decay;
  const float* e_rev;
  std::vector<Syn> syns;
  std::vector<Ring> rings;
  std::vector<EventProj> events;
  std::vector<Plastic> plastics;
  std::vector<InputProj> inputs;
  // sources
  int64_t n_src = 0;
  std::vector<Source> sources;
  uint32_t* keys;  // (S, 2), advanced by thread 0 only, at the barrier's far side
  const int32_t* level;
  const float* table;
  float* counts_out;
  // time and recording
  int64_t step0, n_steps, every;
  std::vector<Raster> rasters, src_rasters;  // per population, per source
  // per thread: its ranges, spike lists (two steps), counts (two steps)
  int n_threads = 1;
  std::vector<int64_t> cut;  // thread t: neurons [cut[t], cut[t+1])
  std::vector<int64_t> busy;          // per thread, ns outside the barrier in the last segment
  int64_t busy_steps = 0;             // the steps of that segment
  int64_t split_ns = 0;               // what the last recomputed splits cost (Splits)
  std::vector<SpikeList> spikes[2];
  // With plasticity, per step parity, 1 at the LIF neurons that spiked in the step (each
  // thread writes its own neurons', 64 to a line, in phase A): the fused walk of a plastic
  // row asks whether a target spiked, the column pass whether a source did.
  std::vector<uint8_t> spiked_store[2];
  uint8_t* spiked[2] = {nullptr, nullptr};
  // per source, the counts of step k in counts[k mod 3]: while a thread still delivers step
  // k - 1's, another may be drawing step k + 1's at the barrier
  std::vector<float> counts[3];
  Barrier barrier;
  std::atomic<int64_t> faults{0};
  // The sources' draws in chunks that any thread claims (per step parity): a thread draws
  // its step's remaining chunks after its neurons, and, while it waits at the barrier, the
  // next step's (their keys are known, they depend on nothing else), so that the draws fill
  // the waits. Chunk c: sources [chunk_at[c], chunk_end[c]) of source chunk_src[c].
  std::vector<int64_t> chunk_at, chunk_end, chunk_src;
  std::unique_ptr<ChunkCursor[]> cursors[2];  // per step parity, per thread
  bool prefetch = false;  // draw the next step's chunks at the barrier (every == 1 only)
};

constexpr int64_t kBlock = 512;  // neurons per block of the update

// `LIF.step` of neurons [i0, i0 + m) under `current`, as lif_run.cc runs it (every load and
// operation unconditional, selects only), with v_inf = v_rest + r_m * current.
template <bool kEuler>
void UpdateBlock(float* __restrict v, float* __restrict r, const float* __restrict v_rest,
                 const float* __restrict r_m, const float* __restrict c,
                 const float* __restrict v_reset, const float* __restrict v_th,
                 const float* __restrict t_ref, const float* __restrict current,
                 int32_t* __restrict flags, int64_t m, float dt, float half_dt) {
  for (int64_t j = 0; j < m; ++j) {
    const float vk = v[j], rk = r[j], ck = c[j], vr = v_reset[j], vt = v_th[j];
    const float tr = t_ref[j], vrest = v_rest[j], rm = r_m[j], cur = current[j];
    const float v_inf = MulAdd(rm, cur, vrest);
    const bool clamped = rk > half_dt;
    const float v_free = kEuler ? MulAdd(ck, v_inf - vk, vk) : MulAdd(vk - v_inf, ck, v_inf);
    const float v1 = clamped ? vr : v_free;
    const bool spike = (v1 - vt) / (vt - vr) >= 0.0f;
    const float r_dec = rk - dt;
    const float r1 = clamped ? r_dec : 0.0f;
    v[j] = spike ? vr : v1;
    r[j] = spike ? tr : r1;
    flags[j] = spike ? 1 : 0;
  }
}

// The input current of neurons [i0, i0 + m) of population `pop`, summed as the per-step
// path sums it (`_phases.total_current`: the terms in the projection order, then the
// constant input) and rounded as XLA:CPU rounds that sum: a product feeding an add is one
// multiply-add (LLVM contracts the left operand of an add when both are products), so a
// conductance term g * (e_rev - v) is fused with the term or input added to it.
void Current(const Run& run, const Pop& pop, int64_t i0, int64_t m, float* __restrict out) {
  const int64_t n_terms = static_cast<int64_t>(pop.terms.size());
  const float* __restrict v = run.v + i0;
  const float* __restrict bias = run.bias + i0;
  auto g_of = [&](const Syn& s) { return run.g + s.off + (i0 - s.post_off); };
  auto e_of = [&](const Syn& s) { return run.e_rev + s.off + (i0 - s.post_off); };
  bool input_done = !pop.input;
  int64_t q = 1;
  if (n_terms == 0) {
    if (pop.input) {
      std::memcpy(out, bias, sizeof(float) * m);
    } else {
      std::fill(out, out + m, 0.0f);
    }
    return;
  }
  const Syn& s0 = run.syns[pop.terms[0]];
  const float* __restrict g0 = g_of(s0);
  if (!s0.conductance) {
    std::memcpy(out, g0, sizeof(float) * m);
  } else {
    // the first product stays unrounded until something is added to it
    const float* __restrict e0 = e_of(s0);
    if (n_terms >= 2) {
      const Syn& s1 = run.syns[pop.terms[1]];
      const float* __restrict g1 = g_of(s1);
      if (s1.conductance) {
        const float* __restrict e1 = e_of(s1);
        for (int64_t j = 0; j < m; ++j) {
          out[j] = MulAdd(g0[j], e0[j] - v[j], g1[j] * (e1[j] - v[j]));
        }
      } else {
        for (int64_t j = 0; j < m; ++j) out[j] = MulAdd(g0[j], e0[j] - v[j], g1[j]);
      }
      q = 2;
    } else if (pop.input) {
      for (int64_t j = 0; j < m; ++j) out[j] = MulAdd(g0[j], e0[j] - v[j], bias[j]);
      input_done = true;
    } else {
      for (int64_t j = 0; j < m; ++j) out[j] = g0[j] * (e0[j] - v[j]);
    }
  }
  for (; q < n_terms; ++q) {
    const Syn& s = run.syns[pop.terms[q]];
    const float* __restrict gq = g_of(s);
    if (s.conductance) {
      const float* __restrict eq = e_of(s);
      for (int64_t j = 0; j < m; ++j) out[j] = MulAdd(gq[j], eq[j] - v[j], out[j]);
    } else {
      for (int64_t j = 0; j < m; ++j) out[j] = out[j] + gq[j];
    }
  }
  if (!input_done) {
    for (int64_t j = 0; j < m; ++j) out[j] = out[j] + bias[j];
  }
}

// Chunk c of the sources' draws of step k (subkeys `sub`, two words per source): counts
// into the step's buffer, and the record.
void DrawChunk(Run& run, int64_t c, int64_t k, int64_t rec_row, bool first, const uint32_t* sub) {
  const int64_t si = run.chunk_src[c];
  const Source& src = run.sources[si];
  const int64_t lo = run.chunk_at[c], hi = run.chunk_end[c];
  float* counts = run.counts[Mod(k, 3)].data();
  constexpr int64_t kChunk = 256;
  uint32_t words[kChunk];
  int32_t cnts[kChunk];
  for (int64_t q = lo; q < hi;) {
    const int64_t m = std::min(kChunk, hi - q);
    nj_threefry::Words(sub[2 * si], sub[2 * si + 1], words, m, q - src.off);
    for (int64_t j = 0; j < m; ++j) {
      const uint32_t bits = (words[j] >> 9) | 0x3F800000u;
      float one_to_two;
      std::memcpy(&one_to_two, &bits, sizeof(float));
      const float u = one_to_two - 1.0f;
      const float* row =
          run.table + src.table_off + static_cast<int64_t>(run.level[q + j]) * src.n_terms;
      int32_t cnt = 0;
      for (int64_t l = 0; l < src.n_terms; ++l) cnt += u > row[l] ? 1 : 0;
      counts[q + j] = static_cast<float>(cnt);
      cnts[j] = cnt;
    }
    run.src_rasters[si].AddBlock(rec_row, q - src.off, cnts, m, first);
    q += m;
  }
}

// Thread t claims and draws one chunk of step k's sources, its own first; false when none
// is left.
bool DrawNext(Run& run, int t, int64_t k, int64_t rec_row, bool first, const uint32_t* sub) {
  ChunkCursor* cursors = run.cursors[k & 1].get();
  const int n = run.n_threads;
  for (int i = 0; i < n; ++i) {
    ChunkCursor& cur = cursors[(t + i) % n];
    if (cur.next.load(std::memory_order_relaxed) >= cur.end) continue;
    const int64_t c = cur.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= cur.end) continue;
    DrawChunk(run, c, k, rec_row, first, sub);
    return true;
  }
  return false;
}

// Thread t's chunks of the step parity p unclaimed again (its cursor at its range).
void ResetChunk(Run& run, int p, int t) {
  run.cursors[p][t].next.store(run.cursors[p][t].begin, std::memory_order_relaxed);
}

// Every chunk of the step parity p unclaimed again.
void ResetChunks(Run& run, int p) {
  for (int t = 0; t < run.n_threads; ++t) ResetChunk(run, p, t);
}

// The threads' chunk ranges for the run's cut: chunk c goes to the thread whose neurons
// hold the neuron at the same fraction of the network as its first source (the source
// that feeds neuron i is source i in the networks served, the microcircuit's background).
void ChunkRanges(Run& run) {
  const int n = run.n_threads;
  const int64_t n_chunks = static_cast<int64_t>(run.chunk_src.size());
  for (int p = 0; p < 2; ++p) run.cursors[p].reset(new ChunkCursor[n]);
  const int64_t n_src = std::max<int64_t>(run.n_src, 1);
  int64_t c = 0;
  for (int t = 0; t < n; ++t) {
    const int64_t begin = c;
    while (c < n_chunks && (t == n - 1 || run.chunk_at[c] * run.n < run.cut[t + 1] * n_src)) {
      ++c;
    }
    for (int p = 0; p < 2; ++p) {
      run.cursors[p][t].begin = begin;
      run.cursors[p][t].end = c;
    }
  }
  ResetChunks(run, 0);
  ResetChunks(run, 1);
}

// A trace of neurons [0, m) (offsets into it) after this step: tr_new[j] = tr_old[j] * decay
// plus the spike (1 at the listed spikes, 0 elsewhere: the per-step path adds the 0/1 spike
// vector, and d + 0 is kept, not folded), or with `nearest` 1 at the spikes and d elsewhere.
// `spikes` are the step's spikes of this range, ascending, as offsets. tr_new may be tr_old.
void AdvanceTrace(float* tr_new, const float* tr_old, int64_t m, float decay, bool nearest,
                  const int32_t* spikes, int64_t n_spikes) {
  int64_t j = 0;
  for (int64_t q = 0; q <= n_spikes; ++q) {
    const int64_t stop = q < n_spikes ? spikes[q] : m;
    if (nearest) {
      for (; j < stop; ++j) tr_new[j] = tr_old[j] * decay;
    } else {
      for (; j < stop; ++j) tr_new[j] = tr_old[j] * decay + 0.0f;
    }
    if (q < n_spikes) {
      const float d = tr_old[j] * decay;
      tr_new[j] = nearest ? 1.0f : d + 1.0f;
      ++j;
    }
  }
}

// The offsets (i - off) of the spikes i in [lo, hi) of an ascending list.
void SpikesIn(const SpikeList& ids, int64_t lo, int64_t hi, int64_t off,
              std::vector<int32_t>& out) {
  out.clear();
  const int32_t* it = std::lower_bound(ids.begin(), ids.end(), static_cast<int32_t>(lo));
  for (; it != ids.end() && *it < hi; ++it) out.push_back(static_cast<int32_t>(*it - off));
}

// The run [kb, ke) of row r of p that thread t delivers (all of it, unsorted rows or one
// thread); false for a row outside its arrays.
inline bool RunOf(const EventProj& p, int64_t r, int t, int64_t& kb, int64_t& ke) {
  const int64_t begin = p.indptr[r], end = p.indptr[r + 1];
  if (begin < 0 || end < begin || end > p.nnz) return false;
  kb = begin;
  ke = end;
  if (!p.split.empty()) {
    if (t > 0) kb = std::clamp<int64_t>(p.split[t - 1][r], begin, end);
    if (t < static_cast<int>(p.split.size())) ke = std::clamp<int64_t>(p.split[t][r], kb, end);
  }
  return true;
}

// Phase A's part of plasticity: the presynaptic trace of thread t's own neurons for step k.
void AdvancePre(Run& run, const Plastic& pl, int t, int64_t k, std::vector<int32_t>& scratch) {
  const EventProj& p = run.events[pl.e];
  const int64_t a = std::max(run.cut[t], p.pre_off);
  const int64_t b = std::min(run.cut[t + 1], p.pre_off + p.n_pre);
  if (a >= b) return;
  const int par = static_cast<int>(k & 1);
  SpikesIn(run.spikes[par][t], a, b, a, scratch);
  const int64_t o = a - p.pre_off;
  AdvanceTrace(pl.xb[par] + o, pl.xb[par ^ 1] + o, b - a, pl.decay_x, pl.nearest,
               scratch.data(), static_cast<int64_t>(scratch.size()));
}

// Whether the plastic projection p's rows are walked once for depression and delivery
// together (FusedRow): a thread's run of a row then holds only its own targets (rows sorted
// by target, or one thread).
inline bool FusedWalk(const Run& run, const EventProj& p) {
  return p.plastic >= 0 && (p.sorted || run.n_threads == 1);
}

// Phase B's part: depression of thread t's runs of the spiking rows (unless the delivery
// walks them, FusedWalk), its neurons' postsynaptic trace, potentiation of its spiking
// neurons' columns (nj_stdp_update's operations; the rows and columns were checked before
// the run). After a fused walk the column entries of spiking sources are skipped: the walk
// potentiated them, right after their depression, as the serial order does.
template <bool kMultiplicative>
void PlasticB(Run& run, const Plastic& pl, int t, int64_t k, std::vector<int32_t>& scratch) {
  const EventProj& p = run.events[pl.e];
  const int par = static_cast<int>(k & 1);
  const int64_t lo = std::clamp<int64_t>(run.cut[t] - p.post_off, 0, p.n_post);
  const int64_t hi = std::clamp<int64_t>(run.cut[t + 1] - p.post_off, 0, p.n_post);
  if (lo >= hi) return;
  float* __restrict w = pl.w;
  float* __restrict y = pl.y;
  const float a_minus = pl.a_minus, a_plus = pl.a_plus, wlo = pl.lo, whi = pl.hi;
  const float decay_y = pl.decay_y, s = 1.0f;
  const bool fused = FusedWalk(run, p);
  for (int u = 0; u < run.n_threads && !fused; ++u) {
    for (const int32_t i : run.spikes[par][u]) {
      const int64_t r = i - p.pre_off;
      if (r < 0 || r >= p.n_pre) continue;
      int64_t kb, ke;
      if (!RunOf(p, r, t, kb, ke)) continue;
      for (int64_t q = kb; q < ke; ++q) {  // an unsorted row: this thread's synapses of it
        if (p.post[q] >= lo && p.post[q] < hi) {
          nj_events::DepressRow<float, kMultiplicative>(w, y, p.post, q, q + 1, a_minus,
                                                        decay_y, s, wlo, whi);
        }
      }
    }
  }
  SpikesIn(run.spikes[par][t], p.post_off + lo, p.post_off + hi, p.post_off + lo, scratch);
  AdvanceTrace(y + lo, y + lo, hi - lo, decay_y, pl.nearest, scratch.data(),
               static_cast<int64_t>(scratch.size()));
  const float* __restrict x = pl.xb[par];
  const int32_t* __restrict col_syn = pl.col_syn;
  const int32_t* __restrict col_pre = pl.col_pre;
  const uint8_t* __restrict source_spiked = run.spiked[par] + p.pre_off;
  for (const int32_t jo : scratch) {
    const int64_t j = lo + jo;
    if (!fused) {
      nj_events::PotentiateColumn<float, kMultiplicative>(w, x, col_syn, col_pre,
                                                          pl.col_ptr[j], pl.col_ptr[j + 1],
                                                          a_plus, s, wlo, whi);
      continue;
    }
    const int64_t end = pl.col_ptr[j + 1];
    for (int64_t m = pl.col_ptr[j]; m < end; ++m) {  // PotentiateColumn's operations
      if (m + 8 < end) __builtin_prefetch(w + col_syn[m + 8], 1);
      const int32_t r = col_pre[m];
      if (source_spiked[r]) continue;
      const int32_t q = col_syn[m];
      w[q] = nj_events::Potentiated<float, kMultiplicative>(w[q], x[r], a_plus, s, wlo, whi);
    }
  }
}

// Why the plastic projection's arrays cannot be run (nullptr: they can): a row pointer or
// target outside its arrays, a sorted row out of order, a column that is not the transpose
// of the rows.
const char* PlasticProblem(const EventProj& p, const Plastic& pl) {
  if (p.indptr[0] != 0 || p.indptr[p.n_pre] != p.nnz) return "row pointers";
  for (int64_t r = 0; r < p.n_pre; ++r) {
    if (p.indptr[r + 1] < p.indptr[r]) return "row pointers";
    for (int64_t q = p.indptr[r]; q < p.indptr[r + 1]; ++q) {
      if (p.post[q] < 0 || p.post[q] >= p.n_post) return "targets";
      if (p.sorted && q > p.indptr[r] && p.post[q] < p.post[q - 1]) return "row order";
    }
  }
  if (pl.col_ptr[0] != 0 || pl.col_ptr[p.n_post] != p.nnz) return "column pointers";
  for (int64_t j = 0; j < p.n_post; ++j) {
    if (pl.col_ptr[j + 1] < pl.col_ptr[j]) return "column pointers";
    for (int64_t m = pl.col_ptr[j]; m < pl.col_ptr[j + 1]; ++m) {
      const int64_t q = pl.col_syn[m], r = pl.col_pre[m];
      if (q < 0 || q >= p.nnz || r < 0 || r >= p.n_pre || p.post[q] != j ||
          q < p.indptr[r] || q >= p.indptr[r + 1]) {
        return "columns (col_syn, col_pre)";
      }
    }
  }
  return nullptr;
}

// Phase A of step k for thread t: arrivals, the neurons' update, the sources' counts.
void PhaseA(Run& run, int t, int64_t k, int64_t rec_row, bool first, const uint32_t* sub) {
  const int64_t a = run.cut[t], b = run.cut[t + 1];
  const int parity = static_cast<int>(k & 1);
  // 1. arrivals
  for (const Syn& s : run.syns) {
    const Ring& ring = run.rings[s.ring];
    const float* row = ring.data + Mod(k, ring.slots) * ring.width + s.col0;
    const int64_t lo = std::max<int64_t>(a - s.post_off, 0);
    const int64_t hi = std::min<int64_t>(b - s.post_off, s.n);
    float* __restrict g = run.g + s.off;
    const float* __restrict d = run.decay + s.off;
    for (int64_t j = lo; j < hi; ++j) g[j] = MulAdd(g[j], d[j], row[j]);
  }
  // 2. neurons, in blocks of at most kBlock of one population: the current (the states'
  // g summed in the projection order), then the update, branch-free so that the compiler
  // vectorises it, then the spike list and the record from the block's flags
  int32_t* const list = run.spikes[parity][t].buf + 1;
  uint8_t* const spiked = run.spiked[parity];
  if (spiked) {  // step k - 2's flags of its neurons off (its list is still in this buffer)
    for (int32_t q = 0; q < list[-1]; ++q) spiked[list[q]] = 0;
  }
  int32_t listed = 0;
  const float dt = run.dt, half_dt = run.half_dt;
  float current[kBlock];
  int32_t flags[kBlock];
  for (size_t pi = 0; pi < run.pops.size(); ++pi) {
    const Pop& pop = run.pops[pi];
    const int64_t lo = std::max(a, pop.off), hi = std::min(b, pop.off + pop.n);
    if (lo >= hi) continue;
    const int64_t n_terms = static_cast<int64_t>(pop.terms.size());
    for (int64_t i0 = lo; i0 < hi; i0 += kBlock) {
      const int64_t m = std::min(kBlock, hi - i0);
      Current(run, pop, i0, m, current);
      if (run.euler) {
        UpdateBlock<true>(run.v + i0, run.r + i0, run.v_rest + i0, run.r_m + i0, run.c + i0,
                            run.v_reset + i0, run.v_th + i0, run.t_ref + i0, current, flags,
                            m, dt, half_dt);
      } else {
        UpdateBlock<false>(run.v + i0, run.r + i0, run.v_rest + i0, run.r_m + i0, run.c + i0,
                            run.v_reset + i0, run.v_th + i0, run.t_ref + i0, current, flags,
                            m, dt, half_dt);
      }
      // the spike list: groups of 16 flags without a spike (most) cost one vector test
      for (int64_t j0 = 0; j0 < m; j0 += 16) {
        const int64_t je = std::min<int64_t>(j0 + 16, m);
        int32_t any = 0;
        for (int64_t j = j0; j < je; ++j) any |= flags[j];
        if (!any) continue;
        for (int64_t j = j0; j < je; ++j) {
          if (flags[j]) list[listed++] = static_cast<int32_t>(i0 + j);
        }
      }
      run.rasters[pi].AddBlock(rec_row, i0 - pop.off, flags, m, first);
    }
  }
  list[-1] = listed;
  if (spiked) {
    for (int32_t q = 0; q < listed; ++q) spiked[list[q]] = 1;
  }
  // plasticity: the presynaptic traces of its own neurons
  if (!run.plastics.empty()) {
    thread_local std::vector<int32_t> scratch;
    for (const Plastic& pl : run.plastics) AdvancePre(run, pl, t, k, scratch);
  }
  // sources: this step's chunks that no thread has claimed yet
  while (DrawNext(run, t, k, rec_row, first, sub)) {
  }
}

// The offset of the ring row (slot (k + 1 + d) mod D, with next = (k + 1) mod D) that a
// synapse of delay d >= 0 adds to: without a division for the delays below D (all of them
// in a network whose ring is as long as its longest delay).
inline int64_t DelayRow(const Ring& ring, int64_t next, int64_t d) {
  int64_t slot = next + d;
  slot = slot < ring.slots
             ? slot
             : (slot - ring.slots < ring.slots ? slot - ring.slots : Mod(slot, ring.slots));
  return slot * ring.width;
}

// The run of row r of event projection p whose targets lie in [lo, hi), added at its slots.
template <typename D>
int64_t RowRange(const EventProj& p, const Ring& ring, int64_t r, int64_t k, int t, int64_t lo,
                 int64_t hi, int64_t& bad) {
  int64_t kb, ke;  // thread t's run of the row
  if (!RunOf(p, r, t, kb, ke)) {
    if (lo == 0) ++bad;
    return 0;
  }
  const int32_t* post = p.post;
  const D* d = static_cast<const D*>(p.delay);
  float* data = ring.data + p.col0;
  const int64_t fixed = Mod(k + 1 + p.delay_steps, ring.slots) * ring.width;
  const int64_t next = Mod(k + 1, ring.slots);  // slot of delay 0
  int64_t previous = lo, added = 0;
  for (int64_t q = kb; q < ke; ++q) {
    const int64_t j = post[q];
    if (j < 0 || j >= p.n_post) {
      if (lo == 0 || !p.sorted) ++bad;  // counted by one thread
      continue;
    }
    if (j < lo || j >= hi) {  // another thread's target (unsorted rows only)
      if (p.sorted) ++bad;
      continue;
    }
    if (p.sorted) {
      if (j < previous) {
        ++bad;
        continue;
      }
      previous = j;
    }
    int64_t row = fixed;
    if (p.per_synapse) {
      if (d[q] < 0) {
        ++bad;
        continue;
      }
      row = DelayRow(ring, next, static_cast<int64_t>(d[q]));
    }
    data[row + j] += p.w[q];
    ++added;
  }
  return added;
}

// Row r of the plastic projection p (FusedWalk) in one walk of thread t's run: each
// synapse depressed (DepressRow's operations, with the postsynaptic trace before this
// step's spikes), potentiated if its target spiked in this step (PotentiateColumn's, with
// the presynaptic trace after them: the serial order depresses every spiking row, then
// potentiates every spiking target's column), then its new weight added at its slot. The
// rows' targets and order were checked before the run.
template <typename D, bool kMultiplicative>
void FusedRow(const Run& run, const EventProj& p, const Plastic& pl, const Ring& ring,
              int64_t r, int64_t k, int t, int64_t& bad) {
  int64_t kb, ke;
  if (!RunOf(p, r, t, kb, ke)) return;
  const int par = static_cast<int>(k & 1);
  const int32_t* __restrict post = p.post;
  const D* __restrict d = static_cast<const D*>(p.delay);
  float* __restrict w = pl.w;
  const float* __restrict y = pl.y;
  const uint8_t* __restrict target_spiked = run.spiked[par] + p.post_off;
  const float xr = pl.xb[par][r];
  const float a_minus = pl.a_minus, a_plus = pl.a_plus, wlo = pl.lo, whi = pl.hi;
  const float decay_y = pl.decay_y, s = 1.0f;
  float* __restrict data = ring.data + p.col0;
  const int64_t fixed = Mod(k + 1 + p.delay_steps, ring.slots) * ring.width;
  const int64_t next = Mod(k + 1, ring.slots);  // slot of delay 0
  for (int64_t q = kb; q < ke; ++q) {
    const int64_t j = post[q];
    float v = nj_events::Depressed<float, kMultiplicative>(w[q], y[j], a_minus, decay_y, s,
                                                          wlo, whi);
    if (target_spiked[j]) {
      v = nj_events::Potentiated<float, kMultiplicative>(v, xr, a_plus, s, wlo, whi);
    }
    w[q] = v;
    int64_t row = fixed;
    if (p.per_synapse) {
      if (d[q] < 0) {
        ++bad;
        continue;
      }
      row = DelayRow(ring, next, static_cast<int64_t>(d[q]));
    }
    data[row + j] += v;
  }
}

// Phase B of step k for thread t: zero the slot read, deliver into its own columns.
void PhaseB(Run& run, int t, int64_t k) {
  const int64_t a = run.cut[t], b = run.cut[t + 1];
  const int parity = static_cast<int>(k & 1);
  int64_t bad = 0;
  // Zero slot k mod D of every ring in this thread's columns (thread 0 zeroes the columns
  // that no projection reaches, in Body).
  for (const Ring& ring : run.rings) {
    float* slot = ring.data + Mod(k, ring.slots) * ring.width;
    for (const Target& z : ring.targets) {
      const int64_t lo = std::max<int64_t>(a - z.post_off, 0);
      const int64_t hi = std::min<int64_t>(b - z.post_off, z.n_post);
      if (lo < hi) std::memset(slot + z.col0 + lo, 0, sizeof(float) * (hi - lo));
    }
  }
  // plasticity of the synapses onto its own neurons, before they deliver (a fused walk's
  // depression is part of its delivery, and its trace and columns follow it)
  thread_local std::vector<int32_t> scratch;
  auto plastic_b = [&](bool fused) {
    for (const Plastic& pl : run.plastics) {
      if (FusedWalk(run, run.events[pl.e]) != fused) continue;
      if (pl.multiplicative) {
        PlasticB<true>(run, pl, t, k, scratch);
      } else {
        PlasticB<false>(run, pl, t, k, scratch);
      }
    }
  };
  plastic_b(false);
  for (const Ring& ring : run.rings) {
    if (ring.from_source) {
      const float* counts = run.counts[Mod(k, 3)].data();
      for (int64_t e : ring.input) {
        const InputProj& p = run.inputs[e];
        const Source& src = run.sources[p.source];
        const int64_t lo = std::max<int64_t>(a - p.post_off, 0);
        const int64_t hi = std::min<int64_t>(b - p.post_off, p.n_post);
        float* dst = ring.data + Mod(k + 1 + p.delay_steps, ring.slots) * ring.width + p.col0;
        for (int64_t j = lo; j < hi; ++j) {
          const int64_t i = p.pre[j];
          if (i < 0 || i >= src.n) {
            ++bad;
            continue;
          }
          dst[j] += counts[src.off + i] * p.w[j];
        }
      }
      continue;
    }
    for (int u = 0; u < run.n_threads; ++u) {
      for (const int32_t i : run.spikes[parity][u]) {
        for (int64_t e : ring.event) {
          const EventProj& p = run.events[e];
          const int64_t row = i - p.pre_off;
          if (row < 0 || row >= p.n_pre) continue;
          const int64_t lo = std::max<int64_t>(a - p.post_off, 0);
          const int64_t hi = std::min<int64_t>(b - p.post_off, p.n_post);
          if (lo >= hi) continue;
          if (FusedWalk(run, p)) {
            const Plastic& pl = run.plastics[p.plastic];
            const bool mul = pl.multiplicative;
            switch (p.per_synapse ? p.delay_type : ffi::DataType::S32) {
              case ffi::DataType::S8:
                mul ? FusedRow<int8_t, true>(run, p, pl, ring, row, k, t, bad)
                    : FusedRow<int8_t, false>(run, p, pl, ring, row, k, t, bad);
                break;
              case ffi::DataType::S16:
                mul ? FusedRow<int16_t, true>(run, p, pl, ring, row, k, t, bad)
                    : FusedRow<int16_t, false>(run, p, pl, ring, row, k, t, bad);
                break;
              default:
                mul ? FusedRow<int32_t, true>(run, p, pl, ring, row, k, t, bad)
                    : FusedRow<int32_t, false>(run, p, pl, ring, row, k, t, bad);
            }
            continue;
          }
          int64_t added;
          switch (p.per_synapse ? p.delay_type : ffi::DataType::S32) {
            case ffi::DataType::S8:
              added = RowRange<int8_t>(p, ring, row, k, t, lo, hi, bad);
              break;
            case ffi::DataType::S16:
              added = RowRange<int16_t>(p, ring, row, k, t, lo, hi, bad);
              break;
            default:
              added = RowRange<int32_t>(p, ring, row, k, t, lo, hi, bad);
          }
          (void)added;
        }
      }
    }
  }
  if (!run.plastics.empty()) plastic_b(true);
  if (bad) run.faults.fetch_add(bad, std::memory_order_relaxed);
}

// Interior cut points moved to the nearest multiple of 64 neurons where each range holds
// at least 1 024 (of 16 from 256, of 4 from 64): with the arrays on cache-line boundaries
// (XLA's buffers are), two threads then never write one line of v, r, g, a ring slot or a
// bool raster row that starts on a line (measured on COBA with STDP, two threads: about 2 %
// of a step).
void AlignCut(const Run& run, std::vector<int64_t>& cut) {
  const int n = static_cast<int>(cut.size()) - 1;
  if (n <= 1) return;
  int64_t a = 64;
  while (a > 1 && run.n / n < 16 * a) a /= 4;
  if (a <= 1) return;
  for (int t = 1; t < n; ++t) {
    const int64_t c = (cut[t] + a / 2) / a * a;
    cut[t] = std::clamp<int64_t>(c, cut[t - 1], run.n);
  }
}

// The neuron cut that splits `weight` (per population, per neuron) evenly over n threads.
void Cut(const Run& run, const std::vector<double>& per_neuron, int n, std::vector<int64_t>& cut) {
  double total = 0.0;
  for (size_t p = 0; p < run.pops.size(); ++p) total += per_neuron[p] * run.pops[p].n;
  cut.assign(n + 1, run.n);
  cut[0] = 0;
  double before = 0.0;
  size_t p = 0;
  for (int t = 1; t < n; ++t) {
    const double want = total * t / n;
    while (p < run.pops.size() && before + per_neuron[p] * run.pops[p].n < want) {
      before += per_neuron[p] * run.pops[p].n;
      ++p;
    }
    int64_t c = run.n;
    if (p < run.pops.size()) {
      const double w = per_neuron[p];
      c = run.pops[p].off + (w > 0.0 ? static_cast<int64_t>((want - before) / w) : 0);
      c = std::min(std::max(c, run.pops[p].off), run.pops[p].off + run.pops[p].n);
    }
    cut[t] = std::max(c, cut[t - 1]);
  }
  AlignCut(run, cut);
}

// The splits of every sorted event projection for the run's cut (see EventProj::split):
// made by a search per row when the threads change, else moved from the last ones by the
// few targets the boundary moved. A row outside its arrays is left to RowRange to report.
bool Splits(Run& run) {
  const int nb = run.n_threads - 1;
  bool any = false;
  for (EventProj& p : run.events) {
    if (!p.sorted || nb <= 0) {
      p.split.clear();
      p.split_at.clear();
      continue;
    }
    const bool fresh = static_cast<int>(p.split.size()) != nb;
    if (fresh) {
      p.split.assign(nb, std::vector<int32_t>(p.n_pre, 0));
      p.split_at.assign(nb, -1);
    }
    for (int b = 1; b <= nb; ++b) {
      const int64_t at = std::clamp<int64_t>(run.cut[b] - p.post_off, 0, p.n_post);
      if (!fresh && p.split_at[b - 1] == at) continue;
      any = true;
      int32_t* sp = p.split[b - 1].data();
      const bool edge = at == 0 || at == p.n_post;
      for (int64_t r = 0; r < p.n_pre; ++r) {
        const int64_t begin = p.indptr[r], end = p.indptr[r + 1];
        if (begin < 0 || end < begin || end > p.nnz) {
          sp[r] = 0;
          continue;
        }
        if (edge) {
          // the boundary at one end of the projection's targets: every synapse of the row
          // on one side (the targets are in [0, n_post); the rows are not read)
          sp[r] = static_cast<int32_t>(at == 0 ? begin : end);
          continue;
        }
        // From the last split, or (fresh) from where the row would cross `at` if its
        // targets were spread evenly: galloping to bracket the first target >= at, then a
        // binary search in the bracket (a few cache lines per row, not log2 of its length).
        int64_t q = fresh ? begin + (end - begin) * at / p.n_post
                          : std::clamp<int64_t>(sp[r], begin, end);
        int64_t lo, hi;  // the first target >= at lies in [lo, hi]
        if (q < end && p.post[q] < at) {
          lo = q + 1;
          int64_t step = 1;
          hi = end;
          for (int64_t x = lo; x < end; x += step, step *= 2) {
            if (p.post[x] >= at) {
              hi = x;
              break;
            }
            lo = x + 1;
          }
        } else {
          hi = q;
          int64_t step = 1;
          lo = begin;
          for (int64_t x = q - 1; x >= begin; x -= step, step *= 2) {
            if (p.post[x] < at) {
              lo = x + 1;
              break;
            }
            hi = x;
          }
        }
        sp[r] = static_cast<int32_t>(std::lower_bound(p.post + lo, p.post + hi, at) - p.post);
      }
      p.split_at[b - 1] = at;
    }
  }
  return any;
}

// A new neuron cut from the last segment's busy times: the work of thread t's neurons is
// taken as spread evenly over them (busy[t] / their number), and the cut moved so that each
// thread gets the same share of the sum. Ranges keep at least one neuron where they can.
void Rebalance(Run& run, int64_t next_steps) {
  const int n = run.n_threads;
  if (n <= 1) return;
  std::vector<double> density(n);
  double total = 0.0, most = 0.0;
  for (int t = 0; t < n; ++t) {
    const int64_t size = run.cut[t + 1] - run.cut[t];
    density[t] = size > 0 ? static_cast<double>(run.busy[t]) / size : 0.0;
    total += static_cast<double>(run.busy[t]);
    most = std::max(most, static_cast<double>(run.busy[t]));
  }
  if (total <= 0.0) return;
  // A new cut makes new splits of the sorted rows it crosses (Splits: about a cache miss per
  // row); it is kept only where the wait it would save over the next segment, the busiest
  // thread's excess over the mean at the last segment's rate, exceeds what the last splits
  // cost. (Before any split was timed, and for a run's final cut kept for later calls,
  // next_steps <= 0: always.)
  if (next_steps > 0 && run.busy_steps > 0 && run.split_ns > 0) {
    const double excess = (most - total / n) * static_cast<double>(next_steps) /
                          static_cast<double>(run.busy_steps);
    if (excess < static_cast<double>(run.split_ns)) return;
  }
  std::vector<int64_t> cut(n + 1, run.n);
  cut[0] = 0;
  int u = 0;
  double before = 0.0;  // work before run.cut[u]
  for (int t = 1; t < n; ++t) {
    const double want = total * t / n;
    while (u < n && before + static_cast<double>(run.busy[u]) < want) {
      before += static_cast<double>(run.busy[u]);
      ++u;
    }
    int64_t c = run.n;
    if (u < n) {
      c = run.cut[u] + (density[u] > 0.0 ? static_cast<int64_t>((want - before) / density[u]) : 0);
      c = std::min(std::max(c, run.cut[u]), run.cut[u + 1]);
    }
    cut[t] = std::max(c, cut[t - 1]);
  }
  AlignCut(run, cut);
  run.cut = cut;
}

// A network's shape, the key of what its runs measured.
struct Shape {
  int64_t n, n_src, n_syn, n_events, n_rings, threads;
  bool operator==(const Shape& o) const {
    return n == o.n && n_src == o.n_src && n_syn == o.n_syn && n_events == o.n_events &&
           n_rings == o.n_rings && threads == o.threads;
  }
};

struct Memory {
  int threads = 1;
  std::vector<int64_t> cut;
  int64_t calls = 0;  // calls of this shape so far
};

std::mutex g_memory_mu;
std::vector<std::pair<Shape, Memory>> g_memory;  // the last few shapes, newest last

// What the last run of this shape chose; counts the call. False for a shape not seen.
bool Recall(const Shape& shape, Memory& out) {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  for (auto& [sh, mem] : g_memory) {
    if (sh == shape) {
      ++mem.calls;
      out = mem;
      return true;
    }
  }
  return false;
}

void Remember(const Shape& shape, int threads, const std::vector<int64_t>& cut) {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  for (auto& [sh, mem] : g_memory) {
    if (sh == shape) {
      mem.threads = threads;
      mem.cut = cut;
      return;
    }
  }
  if (g_memory.size() >= 16) g_memory.erase(g_memory.begin());
  g_memory.push_back({shape, Memory{threads, cut, 1}});
}

// The threads the last run chose (NjNetworkRunThreads, for the benchmarks' reports).
std::atomic<int> g_last_threads{0};
// The tests' switch (NjSetSharePenalty): nanoseconds that thread 0 spins in every shared
// step, standing in for cores whose round trip is slow, so that a test can check that the
// probe then keeps a network on one thread.
std::atomic<int64_t> g_share_penalty_ns{0};

// The rasters' pages that have no memory behind them yet (a record XLA has just allocated:
// the first calls of a jitted run) are given it before the run, each of `threads` threads
// taking a contiguous share of the pages. Left to the steps, each of the run's threads
// would fault in pieces of every page (a page holds rows that all threads write), one
// fault at a time per thread under the same page-table locks: measured on COBA's 40 MB
// record (10 000 steps), 9 450 faults cost 13 ms of a 70 ms call on one thread. The pages
// are populated without writing (MADV_POPULATE_WRITE) or, before Linux 5.14, by adding
// zero to one byte of each page inside the record. A record whose pages are already there
// (the later calls) costs one mincore call. Only with more than one thread: one thread
// gains nothing, as the kernel then zeroes each page long before the step that writes it,
// whose lines come back from memory instead of from the cache.
void Populate(const Run& run, int threads) {
#if defined(__linux__)
  const int64_t page = sysconf(_SC_PAGESIZE);
  if (page <= 0) return;
  struct Span {
    char *lo, *hi;     // the page-aligned span
    char *first, *end;  // the record inside it
  };
  std::vector<Span> spans;
  int64_t missing = 0;
  std::vector<unsigned char> resident;
  for (const std::vector<Raster>* list : {&run.rasters, &run.src_rasters}) {
    for (const Raster& r : *list) {
      if (r.bytes < 256 * page) continue;  // a fault or two hundred: left to the steps
      char* first = static_cast<char*>(r.data);
      char* end = first + r.bytes;
      const uintptr_t p = static_cast<uintptr_t>(page);
      char* lo = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(first) / p * p);
      char* hi = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(end) + p - 1) / p * p);
      resident.resize((hi - lo) / page);
      if (mincore(lo, hi - lo, resident.data()) != 0) continue;
      int64_t absent = 0;
      for (unsigned char c : resident) absent += (c & 1) ? 0 : 1;
      if (absent * 8 < static_cast<int64_t>(resident.size())) continue;  // mostly there
      missing += absent;
      spans.push_back({lo, hi, first, end});
    }
  }
  if (spans.empty()) return;
  int64_t pages = 0;
  for (const Span& sp : spans) pages += (sp.hi - sp.lo) / page;
  const int n = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, missing / 256)));
  auto part = [&](int t) {
    // thread t's pages: [pages * t / n, pages * (t + 1) / n) of the spans, in order
    const int64_t from = pages * t / n, to = pages * (t + 1) / n;
    int64_t at = 0;
    for (const Span& sp : spans) {
      const int64_t count = (sp.hi - sp.lo) / page;
      const int64_t a = std::max(from, at), b = std::min(to, at + count);
      if (a < b) {
        char* lo = sp.lo + (a - at) * page;
        char* hi = sp.lo + (b - at) * page;
        if (madvise(lo, hi - lo, MADV_POPULATE_WRITE) != 0) {  // before Linux 5.14
          for (char* q = lo; q < hi; q += page) {
            char* byte = std::max(q, sp.first);
            if (byte < sp.end) __atomic_fetch_add(byte, 0, __ATOMIC_RELAXED);
          }
        }
      }
      at += count;
    }
  };
  nj_pool::RunParts(n, part);
#else
  (void)run;
  (void)threads;
#endif
}

// Steps [s0, s1) of the run on the run's threads (thread t runs part t).
void Body(Run& run, int t, const std::vector<std::pair<int64_t, int64_t>>* gaps, int64_t s0,
          int64_t s1) {
  const size_t n_src_keys = run.sources.size();
  std::vector<uint32_t> sub(2 * n_src_keys), sub_next(2 * n_src_keys);
  std::vector<uint32_t> key(run.keys, run.keys + 2 * n_src_keys);
  // key -> (next key, subkey), as jax.random.split splits it: new key = words (0, 1) of
  // Threefry(key, counter 0), subkey = those of counter 1 (each thread computes the same).
  auto split = [&](std::vector<uint32_t>& kk, uint32_t* out) {
    for (size_t si = 0; si < n_src_keys; ++si) {
      uint32_t w[4];
      nj_threefry::Pair(kk[2 * si], kk[2 * si + 1], 0, w);
      nj_threefry::Pair(kk[2 * si], kk[2 * si + 1], 1, w + 2);
      kk[2 * si] = w[0];
      kk[2 * si + 1] = w[1];
      out[2 * si] = w[2];
      out[2 * si + 1] = w[3];
    }
  };
  std::vector<uint32_t> final_key = key;  // the key after the last step run
  split(key, sub.data());  // the subkey of step s0; key is then the one step s0 + 1 splits
  int64_t busy = 0;  // ns spent outside the barrier
  // (a network without sources has no chunks: nothing to draw at the barrier, no cursor
  // to reset after it)
  const bool chunks = !run.chunk_src.empty();
  const bool fill = run.prefetch && chunks;
  const int64_t penalty = run.n_threads > 1 && t == 0 ? g_share_penalty_ns.load() : 0;
  for (int64_t step = s0; step < s1; ++step) {
    const int64_t k = run.step0 + step;
    std::vector<uint32_t> key_after = key;
    split(key_after, sub_next.data());  // the subkey of step k + 1 (for the barrier's fill)
    const int64_t a0 = nj_pool::NowNs();
    PhaseA(run, t, k, step / run.every, step % run.every == 0, sub.data());
    const int64_t a1 = nj_pool::NowNs();
    if (penalty > 0) {  // (outside the busy time: it moves no cut)
      while (nj_pool::NowNs() < a1 + penalty) {
      }
    }
    const bool more = fill && step + 1 < s1;
    run.barrier.Wait(
        t, [&] { return more && DrawNext(run, t, k + 1, step + 1, true, sub_next.data()); });
    // Every chunk of step k is claimed (each thread claimed until none was left before the
    // barrier): its own cursor serves step k + 2. A thread that reaches the next barrier
    // first and claims step k + 2's chunks there may find this cursor not yet reset and
    // leave its chunks to a later claim.
    if (chunks) ResetChunk(run, static_cast<int>(k & 1), t);
    const int64_t b0 = nj_pool::NowNs();
    busy += a1 - a0;
    if (t == 0) {
      for (size_t ri = 0; ri < run.rings.size(); ++ri) {
        const Ring& ring = run.rings[ri];
        float* slot = ring.data + Mod(k, ring.slots) * ring.width;
        for (const auto& [c0, c1] : gaps[ri]) std::memset(slot + c0, 0, sizeof(float) * (c1 - c0));
      }
    }
    PhaseB(run, t, k);
    busy += nj_pool::NowNs() - b0;
    final_key = key;
    key = key_after;
    std::swap(sub, sub_next);
  }
  run.busy[t] = busy;
  if (t == 0) std::memcpy(run.keys, final_key.data(), sizeof(uint32_t) * final_key.size());
  run.barrier.Wait(t);
}

ffi::Error NetworkRunImpl(
    ffi::AnyBuffer v_in, ffi::AnyBuffer r_in, ffi::AnyBuffer params, ffi::AnyBuffer dts,
    ffi::AnyBuffer g_in, ffi::AnyBuffer decay, ffi::AnyBuffer e_rev, ffi::AnyBuffer rings_in,
    ffi::AnyBuffer step,
    ffi::AnyBuffer key_in, ffi::AnyBuffer level, ffi::AnyBuffer table, ffi::AnyBuffer counts_in,
    ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> v_out, ffi::Result<ffi::AnyBuffer> r_out,
    ffi::Result<ffi::AnyBuffer> g_out, ffi::Result<ffi::AnyBuffer> rings_out,
    ffi::Result<ffi::AnyBuffer> key_out, ffi::Result<ffi::AnyBuffer> counts_out,
    ffi::RemainingRets raster_outs,
    int64_t n_steps, int64_t every, int64_t euler,
    ffi::Span<const int64_t> pop_meta,    // per population: off, n, first term, n_terms, input
    ffi::Span<const int64_t> terms,       // synaptic state indices
    ffi::Span<const int64_t> syn_meta,    // per state: off, ring, col0, n, post_off, conductance
    ffi::Span<const int64_t> ring_meta,   // per ring: slots, width
    ffi::Span<const int64_t> event_meta,  // per event projection: pre_off, n_pre, ring, col0,
                                          // n_post, post_off, delay_steps, per_synapse, sorted
    ffi::Span<const int64_t> input_meta,  // per input projection: source, ring, col0, n_post,
                                          // post_off, delay_steps
    ffi::Span<const int64_t> source_meta,  // per source: off, n, table_off, n_terms
    ffi::Span<const int64_t> plastic_meta  // per plastic projection: event projection,
                                           // multiplicative, nearest
) {
  const auto F32 = ffi::DataType::F32;
  for (const ffi::AnyBuffer* x : {&v_in, &r_in, &params, &dts, &g_in, &decay, &e_rev,
                                  &rings_in, &table, &counts_in}) {
    if (x->element_type() != F32) {
      return ffi::Error::InvalidArgument("nj_network_run: float32 arrays only");
    }
  }
  if (step.element_type() != ffi::DataType::S32 || key_in.element_type() != ffi::DataType::U32 ||
      level.element_type() != ffi::DataType::S32) {
    return ffi::Error::InvalidArgument("nj_network_run: step int32, key uint32, level int32");
  }
  if (n_steps < 0 || every < 1 || n_steps % every != 0) {
    return ffi::Error::InvalidArgument("nj_network_run: n_steps must be a multiple of every");
  }
  Run run;
  run.n = static_cast<int64_t>(v_in.element_count());
  if (static_cast<int64_t>(r_in.element_count()) != run.n ||
      static_cast<int64_t>(params.element_count()) != 7 * run.n || dts.element_count() != 2 ||
      g_in.element_count() != decay.element_count() ||
      g_in.element_count() != e_rev.element_count() ||
      counts_in.element_count() != level.element_count()) {
    return ffi::Error::InvalidArgument("nj_network_run: state and parameter sizes disagree");
  }
  // outputs start as copies of the inputs; the run updates them in place
  std::memcpy(v_out->untyped_data(), v_in.untyped_data(), v_in.size_bytes());
  std::memcpy(r_out->untyped_data(), r_in.untyped_data(), r_in.size_bytes());
  std::memcpy(g_out->untyped_data(), g_in.untyped_data(), g_in.size_bytes());
  if (rings_out->untyped_data() != rings_in.untyped_data()) {
    std::memcpy(rings_out->untyped_data(), rings_in.untyped_data(), rings_in.size_bytes());
  }
  std::memcpy(key_out->untyped_data(), key_in.untyped_data(), key_in.size_bytes());
  run.v = static_cast<float*>(v_out->untyped_data());
  run.r = static_cast<float*>(r_out->untyped_data());
  const float* pr = static_cast<const float*>(params.untyped_data());
  run.v_rest = pr;
  run.r_m = pr + run.n;
  run.c = pr + 2 * run.n;
  run.v_reset = pr + 3 * run.n;
  run.v_th = pr + 4 * run.n;
  run.t_ref = pr + 5 * run.n;
  run.bias = pr + 6 * run.n;
  run.dt = static_cast<const float*>(dts.untyped_data())[0];
  run.half_dt = static_cast<const float*>(dts.untyped_data())[1];
  run.euler = euler != 0;
  run.g = static_cast<float*>(g_out->untyped_data());
  run.decay = static_cast<const float*>(decay.untyped_data());
  run.e_rev = static_cast<const float*>(e_rev.untyped_data());
  const int64_t n_g = static_cast<int64_t>(g_in.element_count());
  // populations and their current terms
  if (pop_meta.size() % 5 != 0 || syn_meta.size() % 6 != 0 || ring_meta.size() % 2 != 0 ||
      event_meta.size() % 9 != 0 || input_meta.size() % 6 != 0 || source_meta.size() % 4 != 0) {
    return ffi::Error::InvalidArgument("nj_network_run: malformed metadata");
  }
  const int64_t n_syn = syn_meta.size() / 6;
  for (size_t q = 0; q < syn_meta.size(); q += 6) {
    run.syns.push_back(Syn{syn_meta[q], syn_meta[q + 1], syn_meta[q + 2], syn_meta[q + 3],
                           syn_meta[q + 4], syn_meta[q + 5] != 0});
  }
  for (size_t q = 0; q < pop_meta.size(); q += 5) {
    Pop pop{pop_meta[q], pop_meta[q + 1], {}, pop_meta[q + 4] != 0};
    const int64_t first = pop_meta[q + 2], count = pop_meta[q + 3];
    if (pop.off < 0 || pop.n < 0 || pop.off + pop.n > run.n || first < 0 || count < 0 ||
        first + count > static_cast<int64_t>(terms.size())) {
      return ffi::Error::InvalidArgument("nj_network_run: a population is out of range");
    }
    for (int64_t j = first; j < first + count; ++j) {
      const int64_t s = terms[j];
      if (s < 0 || s >= n_syn || run.syns[s].post_off > pop.off ||
          run.syns[s].post_off + run.syns[s].n < pop.off + pop.n) {
        return ffi::Error::InvalidArgument("nj_network_run: a current term misses its population");
      }
      pop.terms.push_back(s);
    }
    run.pops.push_back(std::move(pop));
  }
  // rings
  const int64_t ring_total = static_cast<int64_t>(rings_in.element_count());
  int64_t ring_off = 0;
  float* ring_base = static_cast<float*>(rings_out->untyped_data());
  for (size_t q = 0; q < ring_meta.size(); q += 2) {
    Ring ring{ring_base + ring_off, ring_meta[q], ring_meta[q + 1], false, {}, {}, {}};
    if (ring.slots < 1 || ring.width < 0 || ring_off + ring.slots * ring.width > ring_total) {
      return ffi::Error::InvalidArgument("nj_network_run: rings out of range");
    }
    ring_off += ring.slots * ring.width;
    run.rings.push_back(std::move(ring));
  }
  if (ring_off != ring_total) {
    return ffi::Error::InvalidArgument("nj_network_run: rings out of range");
  }
  for (const Syn& s : run.syns) {
    if (s.ring < 0 || s.ring >= static_cast<int64_t>(run.rings.size()) || s.off < 0 ||
        s.n < 0 || s.off + s.n > n_g || s.col0 < 0 || s.col0 + s.n > run.rings[s.ring].width ||
        s.post_off < 0 || s.post_off + s.n > run.n) {
      return ffi::Error::InvalidArgument("nj_network_run: a synaptic state is out of range");
    }
  }
  // sources
  run.n_src = static_cast<int64_t>(level.element_count());
  const int64_t n_table = static_cast<int64_t>(table.element_count());
  for (size_t q = 0; q < source_meta.size(); q += 4) {
    Source src{source_meta[q], source_meta[q + 1], source_meta[q + 2], source_meta[q + 3]};
    if (src.off < 0 || src.n < 0 || src.off + src.n > run.n_src || src.table_off < 0 ||
        src.n_terms < 0) {
      return ffi::Error::InvalidArgument("nj_network_run: a source is out of range");
    }
    run.sources.push_back(src);
  }
  const int64_t n_sources = static_cast<int64_t>(run.sources.size());
  if (static_cast<int64_t>(key_in.element_count()) != 2 * n_sources) {
    return ffi::Error::InvalidArgument("nj_network_run: one key per source");
  }
  run.keys = static_cast<uint32_t*>(key_out->untyped_data());
  run.level = static_cast<const int32_t*>(level.untyped_data());
  run.table = static_cast<const float*>(table.untyped_data());
  for (const Source& src : run.sources) {
    for (int64_t i = src.off; i < src.off + src.n; ++i) {
      const int64_t row = src.table_off + static_cast<int64_t>(run.level[i]) * src.n_terms;
      if (run.level[i] < 0 || row + src.n_terms > n_table) {
        return ffi::Error::InvalidArgument("nj_network_run: a source's rate row is out of range");
      }
    }
  }
  // the sources' draws in chunks of 256 sources of one source group
  for (size_t si = 0; si < run.sources.size(); ++si) {
    const Source& src = run.sources[si];
    for (int64_t q = src.off; q < src.off + src.n; q += 256) {
      run.chunk_at.push_back(q);
      run.chunk_end.push_back(std::min(q + 256, src.off + src.n));
      run.chunk_src.push_back(static_cast<int64_t>(si));
    }
  }
  // projections
  const int64_t n_event = event_meta.size() / 9, n_input = input_meta.size() / 6;
  const int64_t n_plastic = plastic_meta.size() / 3;
  if (plastic_meta.size() % 3 != 0 ||
      static_cast<int64_t>(rest.size()) != 4 * n_event + 2 * n_input + 7 * n_plastic) {
    return ffi::Error::InvalidArgument("nj_network_run: projection arrays do not match");
  }
  for (int64_t e = 0; e < n_event; ++e) {
    const int64_t* m = event_meta.begin() + 9 * e;
    auto indptr = rest.get<ffi::AnyBuffer>(4 * e);
    auto post = rest.get<ffi::AnyBuffer>(4 * e + 1);
    auto w = rest.get<ffi::AnyBuffer>(4 * e + 2);
    auto d = rest.get<ffi::AnyBuffer>(4 * e + 3);
    if (!indptr.has_value() || !post.has_value() || !w.has_value() || !d.has_value() ||
        indptr->element_type() != ffi::DataType::S32 ||
        post->element_type() != ffi::DataType::S32 || w->element_type() != F32) {
      return ffi::Error::InvalidArgument("nj_network_run: event projection arrays' types");
    }
    EventProj p{static_cast<const int32_t*>(indptr->untyped_data()),
                static_cast<const int32_t*>(post->untyped_data()),
                static_cast<const float*>(w->untyped_data()),
                d->untyped_data(),
                d->element_type(),
                m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7] != 0, m[8] != 0,
                static_cast<int64_t>(post->element_count())};
    const auto dt_type = d->element_type();
    if (p.pre_off < 0 || p.n_pre < 0 || p.pre_off + p.n_pre > run.n || p.ring < 0 ||
        p.ring >= static_cast<int64_t>(run.rings.size()) || p.col0 < 0 || p.n_post < 0 ||
        p.col0 + p.n_post > run.rings[p.ring].width || p.post_off < 0 ||
        p.post_off + p.n_post > run.n ||
        static_cast<int64_t>(indptr->element_count()) != p.n_pre + 1 ||
        static_cast<int64_t>(w->element_count()) != p.nnz || p.delay_steps < 0 ||
        (p.per_synapse &&
         ((dt_type != ffi::DataType::S8 && dt_type != ffi::DataType::S16 &&
           dt_type != ffi::DataType::S32) ||
          static_cast<int64_t>(d->element_count()) < p.nnz))) {
      return ffi::Error::InvalidArgument("nj_network_run: event projection " +
                                         std::to_string(e) + " does not match its sizes");
    }
    run.rings[p.ring].event.push_back(e);
    run.events.push_back(p);
  }
  for (int64_t e = 0; e < n_input; ++e) {
    const int64_t* m = input_meta.begin() + 6 * e;
    auto pre = rest.get<ffi::AnyBuffer>(4 * n_event + 2 * e);
    auto w = rest.get<ffi::AnyBuffer>(4 * n_event + 2 * e + 1);
    if (!pre.has_value() || !w.has_value() || pre->element_type() != ffi::DataType::S32 ||
        w->element_type() != F32) {
      return ffi::Error::InvalidArgument("nj_network_run: input projection arrays' types");
    }
    InputProj p{static_cast<const int32_t*>(pre->untyped_data()),
                static_cast<const float*>(w->untyped_data()),
                m[0], m[1], m[2], m[3], m[4], m[5]};
    if (p.source < 0 || p.source >= static_cast<int64_t>(run.sources.size()) || p.ring < 0 ||
        p.ring >= static_cast<int64_t>(run.rings.size()) || p.col0 < 0 || p.n_post < 0 ||
        p.col0 + p.n_post > run.rings[p.ring].width || p.post_off < 0 ||
        p.post_off + p.n_post > run.n || p.delay_steps < 0 ||
        static_cast<int64_t>(pre->element_count()) != p.n_post ||
        static_cast<int64_t>(w->element_count()) != p.n_post) {
      return ffi::Error::InvalidArgument("nj_network_run: input projection " +
                                         std::to_string(e) + " does not match its sizes");
    }
    run.rings[p.ring].input.push_back(e);
    run.inputs.push_back(p);
  }
  // Every ring column has at most one owner: a column reached by two projections maps to
  // the same neuron in both. The columns no projection reaches (gaps) go to thread 0.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> gaps(run.rings.size());
  for (size_t ri = 0; ri < run.rings.size(); ++ri) {
    Ring& ring = run.rings[ri];
    if (!ring.event.empty() && !ring.input.empty()) {
      return ffi::Error::InvalidArgument("nj_network_run: a ring fed by two kinds of layout");
    }
    ring.from_source = !ring.input.empty();
    std::vector<int64_t> neuron(ring.width, -1);
    auto claim = [&](int64_t col0, int64_t n_post, int64_t post_off) {
      const Target z{col0, n_post, post_off};
      if (std::none_of(ring.targets.begin(), ring.targets.end(), [&](const Target& y) {
            return y.col0 == z.col0 && y.n_post == z.n_post && y.post_off == z.post_off;
          })) {
        ring.targets.push_back(z);
      }
      for (int64_t j = 0; j < n_post; ++j) {
        int64_t& x = neuron[col0 + j];
        if (x >= 0 && x != post_off + j) return false;
        x = post_off + j;
      }
      return true;
    };
    for (int64_t e : ring.event) {
      if (!claim(run.events[e].col0, run.events[e].n_post, run.events[e].post_off)) {
        return ffi::Error::InvalidArgument("nj_network_run: a ring column with two targets");
      }
    }
    for (int64_t e : ring.input) {
      if (!claim(run.inputs[e].col0, run.inputs[e].n_post, run.inputs[e].post_off)) {
        return ffi::Error::InvalidArgument("nj_network_run: a ring column with two targets");
      }
    }
    for (const Syn& s : run.syns) {
      if (s.ring == static_cast<int64_t>(ri)) {
        for (int64_t j = 0; j < s.n; ++j) {
          if (neuron[s.col0 + j] >= 0 && neuron[s.col0 + j] != s.post_off + j) {
            return ffi::Error::InvalidArgument(
                "nj_network_run: a synaptic state reads another neuron's column");
          }
        }
      }
    }
    for (int64_t c = 0; c < ring.width;) {
      if (neuron[c] >= 0) {
        ++c;
        continue;
      }
      int64_t c1 = c;
      while (c1 < ring.width && neuron[c1] < 0) ++c1;
      gaps[ri].emplace_back(c, c1);
      c = c1;
    }
  }
  // recording
  const int64_t n_rec = n_steps / every;
  run.step0 = *static_cast<const int32_t*>(step.untyped_data());
  run.n_steps = n_steps;
  run.every = every;
  const size_t first_raster = 3 * static_cast<size_t>(n_plastic);
  if (raster_outs.size() != first_raster + run.pops.size() + run.sources.size()) {
    return ffi::Error::InvalidArgument("nj_network_run: one raster per population and source");
  }
  for (size_t q = 0; q + first_raster < raster_outs.size(); ++q) {
    auto out = raster_outs.get<ffi::AnyBuffer>(first_raster + q);
    if (!out.has_value()) return ffi::Error::InvalidArgument("nj_network_run: raster outputs");
    const ffi::DataType type = (*out)->element_type();
    const bool is_pop = q < run.pops.size();
    const int64_t width = is_pop ? run.pops[q].n : run.sources[q - run.pops.size()].n;
    if (type != ffi::DataType::PRED && type != ffi::DataType::U8 &&
        type != ffi::DataType::U16 && type != ffi::DataType::S32) {
      return ffi::Error::InvalidArgument("nj_network_run: raster dtype");
    }
    if (static_cast<int64_t>((*out)->element_count()) != n_rec * width) {
      return ffi::Error::InvalidArgument("nj_network_run: raster sizes");
    }
    (is_pop ? run.rasters : run.src_rasters)
        .push_back(Raster{(*out)->untyped_data(), type, width,
                          static_cast<int64_t>((*out)->size_bytes())});
  }

  // plastic projections: the results start as copies of the state, the columns are checked
  // against the rows (nothing has run yet)
  const int64_t last_parity = (run.step0 + n_steps - 1) & 1;
  run.plastics.reserve(n_plastic);
  for (int64_t q = 0; q < n_plastic; ++q) {
    const int64_t e = plastic_meta[3 * q];
    if (e < 0 || e >= n_event || run.events[e].plastic >= 0) {
      return ffi::Error::InvalidArgument("nj_network_run: a plastic projection is out of range");
    }
    EventProj& p = run.events[e];
    const size_t base = 4 * n_event + 2 * n_input + 7 * q;
    ffi::AnyBuffer in[7] = {
        *rest.get<ffi::AnyBuffer>(base), *rest.get<ffi::AnyBuffer>(base + 1),
        *rest.get<ffi::AnyBuffer>(base + 2), *rest.get<ffi::AnyBuffer>(base + 3),
        *rest.get<ffi::AnyBuffer>(base + 4), *rest.get<ffi::AnyBuffer>(base + 5),
        *rest.get<ffi::AnyBuffer>(base + 6)};
    const int64_t want[7] = {p.nnz, p.n_pre, p.n_post, p.n_post + 1, p.nnz, p.nnz, 6};
    for (int a = 0; a < 7; ++a) {
      const bool index = a >= 3 && a <= 5;
      if (in[a].element_type() != (index ? ffi::DataType::S32 : F32) ||
          static_cast<int64_t>(in[a].element_count()) != want[a]) {
        return ffi::Error::InvalidArgument("nj_network_run: plastic projection " +
                                           std::to_string(q) + " does not match its sizes");
      }
    }
    float* out[3];
    for (int a = 0; a < 3; ++a) {
      auto o = raster_outs.get<ffi::AnyBuffer>(3 * q + a);
      if (!o.has_value() || (*o)->element_type() != F32 ||
          (*o)->element_count() != in[a].element_count()) {
        return ffi::Error::InvalidArgument("nj_network_run: plastic results");
      }
      out[a] = static_cast<float*>((*o)->untyped_data());
    }
    Plastic pl;
    pl.e = e;
    pl.w = out[0];
    pl.y = out[2];
    pl.col_ptr = static_cast<const int32_t*>(in[3].untyped_data());
    pl.col_syn = static_cast<const int32_t*>(in[4].untyped_data());
    pl.col_pre = static_cast<const int32_t*>(in[5].untyped_data());
    const float* par = static_cast<const float*>(in[6].untyped_data());
    pl.a_plus = par[0];
    pl.a_minus = par[1];
    pl.lo = par[2];
    pl.hi = par[3];
    pl.decay_x = par[4];
    pl.decay_y = par[5];
    pl.multiplicative = plastic_meta[3 * q + 1] != 0;
    pl.nearest = plastic_meta[3 * q + 2] != 0;
    if (const char* why = PlasticProblem(p, pl)) {
      return ffi::Error::InvalidArgument(std::string("nj_network_run: plastic projection ") +
                                         std::to_string(q) + ": corrupted " + why);
    }
    // x after step k lives in xb[k & 1]; the last step's in the result
    pl.x_other.assign(p.n_pre, 0.0f);
    pl.xb[last_parity] = out[1];
    pl.xb[last_parity ^ 1] = pl.x_other.data();
    std::memcpy(pl.xb[(run.step0 + 1) & 1], in[1].untyped_data(), in[1].size_bytes());
    std::memcpy(pl.w, in[0].untyped_data(), in[0].size_bytes());
    std::memcpy(pl.y, in[2].untyped_data(), in[2].size_bytes());
    p.w = pl.w;
    p.plastic = q;
    run.plastics.push_back(std::move(pl));
  }

  // neuron cut: each population's expected work per neuron (its update and its synapses)
  std::vector<double> per_neuron(run.pops.size(), 1.0);
  for (const EventProj& p : run.events) {
    for (size_t q = 0; q < run.pops.size(); ++q) {
      if (p.post_off >= run.pops[q].off && p.post_off < run.pops[q].off + run.pops[q].n) {
        per_neuron[q] += 1e-3 * static_cast<double>(p.nnz) / std::max<int64_t>(p.n_post, 1);
      }
    }
  }
  auto setup = [&](int threads) {
    const bool keep = run.n_threads == threads && static_cast<int>(run.cut.size()) == threads + 1;
    run.n_threads = threads;
    if (run.barrier.n != threads || !run.barrier.signals) run.barrier.Reset(threads);
    run.busy.assign(threads, 0);
    if (!keep) Cut(run, per_neuron, threads, run.cut);
    run.prefetch = threads > 1 && every == 1;
    for (int p = 0; p < 2; ++p) {
      run.spikes[p].resize(threads);
      for (int t = 0; t < threads; ++t) run.spikes[p][t].Reserve(run.cut[t + 1] - run.cut[t]);
    }
    for (int p = 0; p < 3; ++p) run.counts[p].assign(run.n_src, 0.0f);
    if (!run.plastics.empty()) {  // no spike flagged (the lists start empty)
      for (int p = 0; p < 2; ++p) {
        run.spiked_store[p].assign(static_cast<size_t>(run.n) + 64, 0);
        const uintptr_t at = reinterpret_cast<uintptr_t>(run.spiked_store[p].data());
        run.spiked[p] = reinterpret_cast<uint8_t*>((at + 63) & ~static_cast<uintptr_t>(63));
      }
    }
  };
  // Steps [s0, s1) on `threads` threads; false (nothing run) when the pool is held by
  // another call.
  auto segment = [&](int threads, int64_t s0, int64_t s1) {
    if (s0 >= s1) return true;
    setup(threads);
    const int64_t q0 = nj_pool::NowNs();
    if (Splits(run)) run.split_ns = nj_pool::NowNs() - q0;
    run.busy_steps = s1 - s0;
    ChunkRanges(run);
    if (threads <= 1) {
      Body(run, 0, gaps.data(), s0, s1);
      return true;
    }
    auto part = [&](int t) { Body(run, t, gaps.data(), s0, s1); };
    return nj_pool::ParallelFor(threads, part);
  };
  // How many threads: the pool's size, unless the run measures that a step on one thread is
  // faster than a step shared out (its barrier included): `warm` steps on one thread, then
  // `probe` on one thread, timed; `warm` on all, then `probe` on all, timed; the rest of the
  // run on the faster. (The first steps of a call touch its output buffers for the first
  // time: timed, they made one thread look up to four times slower than it is, and sharing
  // won where it lost, on COBA, when the two cores' round trip was 550 ns instead of 110.)
  // A run shorter than three full probes (kProbeSteps) probes an eighth of its steps each
  // way (a 200-step run of a network of 10^6 neurons is long in time, short in steps); one
  // of fewer than kMinProbe steps each way stays on one thread. The tests' switches
  // (NjSetSharing, NjSetSharePenalty) force either way or slow the shared steps. Results
  // do not depend on it.
  const int most = nj_pool::Threads();
  const bool forced_on = most > 1 && nj_pool::Sharing() == 1;
  const bool allowed = most > 1 && nj_pool::Sharing() != 2;
  if (allowed) Populate(run, most);
  constexpr int64_t kProbe = 64, kWarm = 32, kProbeSteps = 2 * (kProbe + kWarm), kMinProbe = 4;
  const int64_t probe = n_steps >= 3 * kProbeSteps ? kProbe : n_steps / 8;
  const int64_t warm = probe == kProbe ? kWarm : probe / 2;
  const int64_t probe_steps = 2 * (probe + warm);
  // A decision from a probe this long (or from the full probe) is remembered for the next
  // calls; a shorter sample decides this call only.
  constexpr int64_t kTrustNs = 1000000, kWakeNs = 100000;
  bool trusted = false;
  int64_t done = 0;
  int chosen = 1;
  // What earlier calls of a network of the same shape measured (the threads and the last
  // rebalanced cut) is kept per process and reused, the probe run again every kReprobe-th
  // call, so that a run of many short calls pays for it once in a while.
  constexpr int64_t kReprobe = 16;
  int64_t n_syn_total = 0;
  for (const EventProj& p : run.events) n_syn_total += p.nnz;
  const Shape shape{run.n, run.n_src, n_syn_total, static_cast<int64_t>(run.events.size()),
                    static_cast<int64_t>(run.rings.size()), most};
  Memory memory;
  const bool known =
      !forced_on && allowed && Recall(shape, memory) && memory.calls % kReprobe != 0;
  if (forced_on) {
    chosen = most;
  } else if (known) {
    chosen = memory.threads;
    if (chosen > 1 && static_cast<int>(memory.cut.size()) == chosen + 1) {
      run.cut = memory.cut;
      run.n_threads = chosen;
    }
  } else if (allowed && probe >= kMinProbe) {
    // `warm` steps on one thread (the first touch of the call's buffers), `probe` on one
    // thread, timed; `warm` on all (waking the workers, then the cut rebalanced from
    // them); `probe` on all, timed.
    segment(1, 0, warm);
    int64_t t0 = nj_pool::NowNs();
    segment(1, warm, warm + probe);
    int64_t t1 = nj_pool::NowNs();
    int64_t at = warm + probe;
    // a short call whose one-thread sample is shorter than waking the workers costs
    // (tens of microseconds) stays on one thread without timing the others
    bool shared = (probe == kProbe || t1 - t0 >= kWakeNs) && segment(most, at, at + warm);
    if (!shared) segment(1, at, at + warm);
    Rebalance(run, 0);
    at += warm;
    int64_t t2 = nj_pool::NowNs();
    shared = shared && segment(most, at, at + probe);
    int64_t t3 = nj_pool::NowNs();
    if (!shared) segment(1, at, at + probe);
    done = probe_steps;
    trusted = probe == kProbe || t1 - t0 >= kTrustNs;
    // The slower sample is taken again once (the faster of its two counts): a worker that
    // the scheduler has just placed on a busy core can lose tens of milliseconds once (seen
    // in one first call in five at the scale-0.1 microcircuit with load from elsewhere), and
    // a one-thread sample can lose as much, either of which would keep the network on the
    // slower way for kReprobe calls.
    if (shared && n_steps - done >= 3 * probe) {
      const bool again_shared = t3 - t2 >= t1 - t0;
      if (!again_shared && (t1 - t0) * 4 > (t3 - t2) * 5) {
        // sharing won by more than a quarter: no second look
      } else {
        const int64_t t4 = nj_pool::NowNs();
        bool ok = true;
        if (again_shared) {
          ok = segment(most, done, done + probe);
          if (!ok) segment(1, done, done + probe);
        } else {
          segment(1, done, done + probe);
        }
        const int64_t t5 = nj_pool::NowNs();
        done += probe;
        if (again_shared) {
          shared = ok;
          if (ok && t5 - t4 < t3 - t2) t2 = t4, t3 = t5;
        } else if (t5 - t4 < t1 - t0) {
          t0 = t4, t1 = t5;
        }
      }
    }
    chosen = shared && (t3 - t2) < (t1 - t0) ? most : 1;
  }
  // The rest in segments of kSegment steps, the neuron cut rebalanced after each from the
  // busy times the threads measured (activity moves between populations during a run).
  constexpr int64_t kSegment = 512;
  bool rebalance = !known;  // a remembered cut is used as it is for the first segment
  while (done < n_steps) {
    const int64_t end = chosen > 1 ? std::min(n_steps, done + kSegment) : n_steps;
    if (chosen > 1 && rebalance) Rebalance(run, end - done);
    rebalance = true;
    if (!segment(chosen, done, end)) {
      chosen = 1;
      segment(1, done, end);
    }
    done = end;
  }
  // (A run forced onto one thread, NjSetSharing(2), measured nothing: it is not kept.)
  if (!forced_on && allowed && (known || trusted)) {
    if (chosen > 1) Rebalance(run, 0);
    Remember(shape, chosen, chosen > 1 ? run.cut : std::vector<int64_t>{});
  }
  g_last_threads.store(chosen, std::memory_order_relaxed);
  if (run.faults.load()) {
    return ffi::Error::InvalidArgument(
        "nj_network_run: corrupted connectivity (indptr, indices, delays or pre outside "
        "their ranges): " + std::to_string(run.faults.load()) + " entries");
  }
  const int64_t last = n_steps > 0 ? Mod(run.step0 + n_steps - 1, 3) : -1;
  if (last >= 0) {
    std::memcpy(counts_out->untyped_data(), run.counts[last].data(), sizeof(float) * run.n_src);
  } else {
    std::memcpy(counts_out->untyped_data(), counts_in.untyped_data(), counts_in.size_bytes());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjNetworkRun, nj_ffi::Ordered<NetworkRunImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // r
                                  .Arg<ffi::AnyBuffer>()  // params (7, N)
                                  .Arg<ffi::AnyBuffer>()  // dts
                                  .Arg<ffi::AnyBuffer>()  // g
                                  .Arg<ffi::AnyBuffer>()  // decay
                                  .Arg<ffi::AnyBuffer>()  // e_rev
                                  .Arg<ffi::AnyBuffer>()  // rings
                                  .Arg<ffi::AnyBuffer>()  // step
                                  .Arg<ffi::AnyBuffer>()  // keys
                                  .Arg<ffi::AnyBuffer>()  // level
                                  .Arg<ffi::AnyBuffer>()  // table
                                  .Arg<ffi::AnyBuffer>()  // counts
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()  // v
                                  .Ret<ffi::AnyBuffer>()  // r
                                  .Ret<ffi::AnyBuffer>()  // g
                                  .Ret<ffi::AnyBuffer>()  // rings
                                  .Ret<ffi::AnyBuffer>()  // keys
                                  .Ret<ffi::AnyBuffer>()  // counts
                                  .RemainingRets()        // plastic states, rasters
                                  .Attr<int64_t>("n_steps")
                                  .Attr<int64_t>("every")
                                  .Attr<int64_t>("euler")
                                  .Attr<ffi::Span<const int64_t>>("pop_meta")
                                  .Attr<ffi::Span<const int64_t>>("terms")
                                  .Attr<ffi::Span<const int64_t>>("syn_meta")
                                  .Attr<ffi::Span<const int64_t>>("ring_meta")
                                  .Attr<ffi::Span<const int64_t>>("event_meta")
                                  .Attr<ffi::Span<const int64_t>>("input_meta")
                                  .Attr<ffi::Span<const int64_t>>("source_meta")
                                  .Attr<ffi::Span<const int64_t>>("plastic_meta"));

// The number of threads the last nj_network_run call ran its steps on (after its probe).
extern "C" int NjNetworkRunThreads() { return g_last_threads.load(); }

// The tests' switch: every shared step of nj_network_run takes `ns` nanoseconds longer
// (thread 0 spins; 0, the default, for none). Returns the previous value.
extern "C" int64_t NjSetSharePenalty(int64_t ns) {
  return g_share_penalty_ns.exchange(ns < 0 ? 0 : ns);
}
