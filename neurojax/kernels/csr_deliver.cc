// Event-driven spike delivery over compressed-row (CSR) layouts: the CPU kernel of
// neurojax.network._propagation, called through XLA's FFI.
//
// One call delivers the spikes of one sending group (populations stepped together, `n_source`
// neurons per trial) through all K projections leaving it. For every neuron i of trial b with
// s[b, i] != 0 and every projection p whose presynaptic population holds i, each synapse k of
// row r = i - pre_offset[p] adds s[b, i] * w_p[k] to the group's ring buffer at
//   ring[(b * n_slots + slot) * n_targets + target_offset[p] + post_p[k]],
//   slot = (step + 1 + delay) mod n_slots (0 when n_slots == 1),
// the same sums, in the same order (neurons, then projections, then synapses, ascending), as
// the pure-JAX path. The spike vector is scanned two 32-byte vectors at a time (16 float32 or
// 8 float64 neurons), skipping blocks with no spike, then the work is proportional to
// spikes x fan-out.
//
// Arguments: spikes (*batch, n_source), step () int32, ring (*batch, n_slots, n_targets), then
// per projection: indptr (n_pre + 1,) int32, indices (nnz,) int32, weights (nnz,) or, with
// `weights_batched`, one row of nnz weights per trial (plastic weights), delays
// (nnz,) int8/int16/int32 (or a dummy when the delay is homogeneous). Result: the ring,
// aliased to the input ring; with `overwrite` the input ring is ignored and the result starts
// from zeros (a fresh one-slot buffer); with `clear` the slot `step mod n_slots` of every
// trial (the one the network read at the start of this step) is zeroed first, in place, so
// that no separate update of the ring (which XLA would run on a copy) is needed.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "pool.h"
#include "spike_events.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

namespace ffi = xla::ffi;
using nj_events::AnyBits;
using nj_events::Clip;
using nj_events::ColumnOk;
using nj_events::DepressRow;
using nj_events::kLanes;
using nj_events::RowOk;

namespace {


// Calls fn(i, s[i]) for every nonzero s[i], ascending, skipping silent blocks.
template <typename F, typename Bits, typename Fn>
inline void ForEachNonzero(const F* s, int64_t n, Fn fn) {
  constexpr int64_t kBlock = 2 * kLanes<F>;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    if (!AnyBits<F, Bits>(s + i)) continue;
    for (int64_t j = i; j < i + kBlock; ++j) {
      if (s[j] != F(0)) fn(j, s[j]);
    }
  }
  for (; i < n; ++i) {
    if (s[i] != F(0)) fn(i, s[i]);
  }
}

struct Proj {
  const int32_t* indptr;
  const int32_t* post;
  const void* w;
  const void* delay;
  ffi::DataType delay_type;
  int64_t pre_offset, n_pre, delay_steps, target_offset;
  int64_t nnz;    // synapses (entries of indices)
  int64_t width;  // ring columns from target_offset to the end: a bound on indices
  bool per_synapse;
  int64_t w_stride;  // weights of trial b start at b * w_stride (0: shared by all trials)
  int64_t n_post;    // the projection's own ring columns: [target_offset, + n_post)
  bool sorted;       // the layout says every row lists its targets in ascending order
};

// A slot of the ring: (step + 1 + delay) mod n_slots, never negative whatever the counter
// holds (C++'s % keeps the sign of a negative operand).
inline int64_t Slot(int64_t step, int64_t delay, int64_t n_slots) {
  const int64_t r = (step + 1 + delay) % n_slots;
  return r < 0 ? r + n_slots : r;
}

// What a call found outside its arrays (entries skipped, then reported as an error).
struct Faults {
  int64_t rows = 0;      // rows whose indptr range is not inside [0, nnz] or decreases
  int64_t targets = 0;   // synapses whose postsynaptic index is outside the projection's ring
  int64_t delays = 0;    // synapses with a negative per-synapse delay
  int64_t order = 0;     // rows said to be sorted by target that are not
};

// The synapses of row r: every index is checked against the arrays before it is used, so
// no content of indptr, indices or delays can make the kernel touch memory outside them.
// An invalid entry is skipped and counted; the call then fails with the counts. Each valid
// synapse is handed to sink(column, cell, value): its ring column (target_offset + post),
// its cell in the trial's ring (slot * n_targets + column) and the value v * w[k].
template <typename F, typename D, typename Sink>
inline void Row(const Proj& p, int64_t b, int64_t r, F v, int64_t step, int64_t n_slots,
                int64_t n_targets, Faults& bad, Sink& sink) {
  const F* w = static_cast<const F*>(p.w) + b * p.w_stride;
  const int64_t begin = p.indptr[r], end = p.indptr[r + 1];
  if (begin < 0 || end < begin || end > p.nnz) {
    ++bad.rows;
    return;
  }
  const uint32_t width = static_cast<uint32_t>(p.width);
  const int64_t base = p.target_offset;
  if (n_slots == 1) {
    for (int64_t k = begin; k < end; ++k) {
      const uint32_t j = static_cast<uint32_t>(p.post[k]);
      if (j >= width) {
        ++bad.targets;
        continue;
      }
      sink(base + j, base + j, v * w[k]);
    }
  } else if (!p.per_synapse) {
    const int64_t row = Slot(step, p.delay_steps, n_slots) * n_targets;
    for (int64_t k = begin; k < end; ++k) {
      const uint32_t j = static_cast<uint32_t>(p.post[k]);
      if (j >= width) {
        ++bad.targets;
        continue;
      }
      sink(base + j, row + base + j, v * w[k]);
    }
  } else {
    const D* d = static_cast<const D*>(p.delay);
    for (int64_t k = begin; k < end; ++k) {
      const uint32_t j = static_cast<uint32_t>(p.post[k]);
      if (j >= width) {
        ++bad.targets;
        continue;
      }
      if (d[k] < 0) {
        ++bad.delays;
        continue;
      }
      sink(base + j, Slot(step, static_cast<int64_t>(d[k]), n_slots) * n_targets + base + j,
           v * w[k]);
    }
  }
}

template <typename F, typename Sink>
inline void Neuron(const std::vector<Proj>& projs, int64_t b, int64_t i, F v, int64_t step,
                   int64_t n_slots, int64_t n_targets, Faults& bad, Sink& sink) {
  for (const Proj& p : projs) {
    const int64_t r = i - p.pre_offset;
    if (r < 0 || r >= p.n_pre) continue;
    switch (p.per_synapse ? p.delay_type : ffi::DataType::S32) {
      case ffi::DataType::S8:
        Row<F, int8_t>(p, b, r, v, step, n_slots, n_targets, bad, sink);
        break;
      case ffi::DataType::S16:
        Row<F, int16_t>(p, b, r, v, step, n_slots, n_targets, bad, sink);
        break;
      default:
        Row<F, int32_t>(p, b, r, v, step, n_slots, n_targets, bad, sink);
    }
  }
}

template <typename F>
struct Spike {
  int64_t b, i;
  F v;
};

// One synapse's contribution, binned for the thread that owns its ring column.
template <typename F>
struct Entry {
  int64_t cell;  // in the whole ring (all trials)
  F v;
};

// The delivery on one thread: trials, then neurons, then projections, then synapses, each
// ascending; every value added to its cell at once.
template <typename F, typename Bits>
void Deliver(const F* s, const std::vector<Proj>& projs, int64_t step, F* ring,
             int64_t n_source, int64_t n_slots, int64_t n_targets, int64_t n_trials,
             Faults& bad) {
  for (int64_t b = 0; b < n_trials; ++b) {
    F* rb = ring + b * n_slots * n_targets;
    auto add = [rb](int64_t, int64_t cell, F value) { rb[cell] += value; };
    ForEachNonzero<F, Bits>(s + b * n_source, n_source, [&](int64_t i, F v) {
      Neuron(projs, b, i, v, step, n_slots, n_targets, bad, add);
    });
  }
}

// The synapses of row r whose targets lie in the projection's columns [lo, hi) (0 <= lo <
// hi <= n_post), in a row that lists its targets in ascending order: the run [kb, ke) found
// by binary search (kb is the row's start when lo == 0, ke its end when hi == n_post, so the
// runs of the threads that share a row tile it exactly). Every synapse of the run is checked
// to lie in [lo, hi) and not below the one before it: a row that is not sorted after all is
// counted (bad.order) and the call fails, no synapse is added twice or by two threads.
template <typename F, typename D>
inline void RowRange(const Proj& p, F* rb, int64_t b, int64_t r, F v, int64_t step,
                     int64_t n_slots, int64_t n_targets, int64_t lo, int64_t hi, Faults& bad) {
  const F* w = static_cast<const F*>(p.w) + b * p.w_stride;
  const int64_t begin = p.indptr[r], end = p.indptr[r + 1];
  if (begin < 0 || end < begin || end > p.nnz) {
    if (lo == 0) ++bad.rows;  // counted once, by the thread that holds the row's start
    return;
  }
  const int32_t* post = p.post;
  const int64_t kb =
      lo == 0 ? begin : std::lower_bound(post + begin, post + end, lo) - post;
  const int64_t ke =
      hi == p.n_post ? end : std::lower_bound(post + begin, post + end, hi) - post;
  const int64_t base = p.target_offset;
  const D* d = static_cast<const D*>(p.delay);
  const int64_t fixed_row =
      n_slots == 1 ? 0 : Slot(step, p.per_synapse ? 0 : p.delay_steps, n_slots) * n_targets;
  int64_t previous = lo;
  for (int64_t k = kb; k < ke; ++k) {
    const int64_t j = post[k];
    if (j < 0 || j >= p.n_post) {
      ++bad.targets;
      continue;
    }
    if (j < previous || j >= hi) {
      ++bad.order;
      continue;
    }
    previous = j;
    int64_t row = fixed_row;
    if (p.per_synapse && n_slots > 1) {
      if (d[k] < 0) {
        ++bad.delays;
        continue;
      }
      row = Slot(step, static_cast<int64_t>(d[k]), n_slots) * n_targets;
    }
    rb[row + base + j] += v * w[k];
  }
}

// The delivery on the kernels' threads when every row of every projection of the call is
// sorted by target (the layouts say so: `EventLayout.sorted_rows`): thread t owns the ring
// columns [cut[t], cut[t + 1]) (in every slot and trial) and walks every spike's rows, but
// only the run of each row that falls in its columns, adding straight into the ring. A cell
// receives the additions of one thread, in the serial order (spikes, projections, synapses
// ascending), so the ring is bit for bit the serial one for any number of threads, with no
// bins and no second pass. The columns are cut where the step's work is expected to be
// split evenly: each projection's synapses of this step's spikes spread evenly over its
// columns.
template <typename F>
void DeliverColumns(const std::vector<Spike<F>>& spikes, const std::vector<Proj>& projs,
                    const std::vector<int64_t>& proj_work, int64_t step, F* ring,
                    int64_t n_slots, int64_t n_targets, int n, Faults& bad_out) {
  // Expected work per column: piecewise constant between the projections' column bounds.
  std::vector<int64_t> bounds{0, n_targets};
  for (const Proj& p : projs) {
    bounds.push_back(std::min(p.target_offset, n_targets));
    bounds.push_back(std::min(p.target_offset + p.n_post, n_targets));
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  std::vector<double> density(bounds.size(), 0.0);  // per column, from bounds[s] on
  double total = 0.0;
  for (size_t q = 0; q < projs.size(); ++q) {
    const Proj& p = projs[q];
    if (proj_work[q] <= 0 || p.n_post <= 0) continue;
    const double per = static_cast<double>(proj_work[q]) / static_cast<double>(p.n_post);
    for (size_t g = 0; g + 1 < bounds.size(); ++g) {
      if (bounds[g] >= p.target_offset && bounds[g + 1] <= p.target_offset + p.n_post) {
        density[g] += per;
        total += per * static_cast<double>(bounds[g + 1] - bounds[g]);
      }
    }
  }
  std::vector<int64_t> cut(n + 1, n_targets);
  cut[0] = 0;
  {
    size_t g = 0;
    double before = 0.0;  // work of the columns before bounds[g]
    for (int t = 1; t < n; ++t) {
      const double want = total * t / n;
      while (g + 1 < bounds.size() &&
             before + density[g] * static_cast<double>(bounds[g + 1] - bounds[g]) < want) {
        before += density[g] * static_cast<double>(bounds[g + 1] - bounds[g]);
        ++g;
      }
      int64_t c = n_targets;
      if (g + 1 < bounds.size()) {
        c = bounds[g] + (density[g] > 0.0
                             ? static_cast<int64_t>((want - before) / density[g])
                             : 0);
        c = std::min(std::max(c, bounds[g]), bounds[g + 1]);
      }
      cut[t] = std::max(c, cut[t - 1]);
    }
  }
  std::vector<Faults> faults(n);
  const int64_t trial_size = n_slots * n_targets;
  auto part = [&](int t) {
    const int64_t c0 = cut[t], c1 = cut[t + 1];
    if (c0 >= c1) return;
    Faults& bad = faults[t];
    for (const Spike<F>& sp : spikes) {
      F* rb = ring + sp.b * trial_size;
      for (const Proj& p : projs) {
        const int64_t r = sp.i - p.pre_offset;
        if (r < 0 || r >= p.n_pre) continue;
        const int64_t lo = std::max<int64_t>(c0 - p.target_offset, 0);
        const int64_t hi = std::min<int64_t>(c1 - p.target_offset, p.n_post);
        if (lo >= hi) continue;
        switch (p.per_synapse ? p.delay_type : ffi::DataType::S32) {
          case ffi::DataType::S8:
            RowRange<F, int8_t>(p, rb, sp.b, r, sp.v, step, n_slots, n_targets, lo, hi, bad);
            break;
          case ffi::DataType::S16:
            RowRange<F, int16_t>(p, rb, sp.b, r, sp.v, step, n_slots, n_targets, lo, hi, bad);
            break;
          default:
            RowRange<F, int32_t>(p, rb, sp.b, r, sp.v, step, n_slots, n_targets, lo, hi, bad);
        }
      }
    }
  };
  nj_pool::RunParts(n, part);
  for (const Faults& f : faults) {
    bad_out.rows += f.rows;
    bad_out.targets += f.targets;
    bad_out.delays += f.delays;
    bad_out.order += f.order;
  }
}

// The delivery on the kernels' threads (pool.h), when the step's spikes touch enough
// synapses for it to pay. The spikes are listed once, in the serial order, and shared
// read-only. Phase 1: thread t takes a contiguous run of the list (runs of about equal
// synapse counts) and writes each contribution, in the serial order, to the bin of the thread
// that owns its ring column (columns split evenly). Phase 2: thread u adds the bins meant for
// it, from thread 0's to the last's, each in its order; a cell thus receives exactly the
// serial sequence of additions, so the ring is bit for bit the serial one whatever the
// number of threads, with no two threads writing one cell.
template <typename F, typename Bits>
void DeliverShared(const F* s, const std::vector<Proj>& projs, int64_t step, F* ring,
                   int64_t n_source, int64_t n_slots, int64_t n_targets, int64_t n_trials,
                   Faults& bad) {
  const int most = nj_pool::Threads();
  if (most <= 1 || n_targets == 0) {
    Deliver<F, Bits>(s, projs, step, ring, n_source, n_slots, n_targets, n_trials, bad);
    return;
  }
  // The calling thread's buffers, kept between calls. The workers reach them through these
  // references (a thread_local named in a lambda would be the worker's own).
  thread_local std::vector<Spike<F>> spikes_tl;
  thread_local std::vector<int64_t> cum_tl;
  thread_local std::vector<std::vector<Entry<F>>> bins_tl;
  std::vector<Spike<F>>& spikes = spikes_tl;
  std::vector<int64_t>& cum = cum_tl;  // synapses of the spikes before each one
  std::vector<std::vector<Entry<F>>>& bins = bins_tl;
  spikes.clear();
  cum.clear();
  const bool columns = std::all_of(projs.begin(), projs.end(), [](const Proj& p) {
    return p.sorted;
  });
  // The synapses of this step's spikes, per projection (the column split's estimate of
  // where the work lies) and in all.
  thread_local std::vector<int64_t> proj_work_tl;
  std::vector<int64_t>& proj_work = proj_work_tl;
  proj_work.assign(projs.size(), 0);
  int64_t work = 0;
  for (int64_t b = 0; b < n_trials; ++b) {
    ForEachNonzero<F, Bits>(s + b * n_source, n_source, [&](int64_t i, F v) {
      spikes.push_back(Spike<F>{b, i, v});
      cum.push_back(work);
      for (size_t q = 0; q < projs.size(); ++q) {
        const Proj& p = projs[q];
        const int64_t r = i - p.pre_offset;
        if (r < 0 || r >= p.n_pre) continue;
        const int64_t len = static_cast<int64_t>(p.indptr[r + 1]) - p.indptr[r];
        proj_work[q] += len > 0 ? len : 0;
        work += len > 0 ? len : 0;
      }
    });
  }
  // One hand-over to the pool with sorted rows (each thread adds into its own columns), two
  // with bins.
  const int n = nj_pool::Worth(work, columns ? 1 : 2);
  if (n <= 1) {
    const int64_t t0 = nj_pool::NowNs();
    for (const Spike<F>& sp : spikes) {
      F* rb = ring + sp.b * n_slots * n_targets;
      auto add = [rb](int64_t, int64_t cell, F value) { rb[cell] += value; };
      Neuron(projs, sp.b, sp.i, sp.v, step, n_slots, n_targets, bad, add);
    }
    nj_pool::RecordSerial(work, nj_pool::NowNs() - t0);
    return;
  }
  if (columns) {
    const int64_t t0 = nj_pool::NowNs();
    DeliverColumns<F>(spikes, projs, proj_work, step, ring, n_slots, n_targets, n, bad);
    nj_pool::RecordShared(work, n, nj_pool::NowNs() - t0);
    return;
  }
  // The first spike of each thread's run: the first whose preceding synapses reach t / n
  // of the step's synapses.
  std::vector<int64_t> first(n + 1);
  for (int t = 0; t <= n; ++t) {
    const int64_t target = work * t / n;
    first[t] = std::lower_bound(cum.begin(), cum.end(), target) - cum.begin();
  }
  first[n] = static_cast<int64_t>(spikes.size());
  if (bins.size() < static_cast<size_t>(n * n)) bins.resize(n * n);
  std::vector<Faults> faults(n);
  // Column c belongs to thread (c * n) / n_targets, computed with a multiply and a shift.
  const uint64_t scale = (static_cast<uint64_t>(n) << 32) / static_cast<uint64_t>(n_targets);
  const int64_t trial_size = n_slots * n_targets;
  auto gather = [&](int t) {
    std::vector<Entry<F>>* mine = bins.data() + t * n;
    for (int u = 0; u < n; ++u) mine[u].clear();
    for (int64_t q = first[t]; q < first[t + 1]; ++q) {
      const Spike<F>& sp = spikes[q];
      const int64_t offset = sp.b * trial_size;
      auto bin = [&](int64_t column, int64_t cell, F value) {
        const uint64_t owner = (static_cast<uint64_t>(column) * scale) >> 32;
        mine[owner < static_cast<uint64_t>(n) ? owner : n - 1].push_back(
            Entry<F>{offset + cell, value});
      };
      Neuron(projs, sp.b, sp.i, sp.v, step, n_slots, n_targets, faults[t], bin);
    }
  };
  auto scatter = [&](int u) {
    for (int t = 0; t < n; ++t) {
      for (const Entry<F>& e : bins[t * n + u]) ring[e.cell] += e.v;
    }
  };
  const int64_t t0 = nj_pool::NowNs();
  if (!nj_pool::ParallelFor(n, gather)) {
    for (int t = 0; t < n; ++t) gather(t);
  }
  if (!nj_pool::ParallelFor(n, scatter)) {
    for (int u = 0; u < n; ++u) scatter(u);
  }
  nj_pool::RecordShared(work, n, nj_pool::NowNs() - t0);
  for (const Faults& f : faults) {
    bad.rows += f.rows;
    bad.targets += f.targets;
    bad.delays += f.delays;
  }
}

ffi::Error CsrDeliverImpl(ffi::AnyBuffer s, ffi::AnyBuffer step, ffi::AnyBuffer ring_in,
                          ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> ring_out,
                          int64_t n_source, int64_t n_slots, int64_t n_targets,
                          int64_t overwrite, int64_t clear,
                          ffi::Span<const int64_t> pre_offset,
                          ffi::Span<const int64_t> n_pre, ffi::Span<const int64_t> delay_steps,
                          ffi::Span<const int64_t> target_offset,
                          ffi::Span<const int64_t> per_synapse,
                          ffi::Span<const int64_t> weights_batched,
                          ffi::Span<const int64_t> n_post,
                          ffi::Span<const int64_t> sorted_rows) {
  const auto type = ring_in.element_type();
  if (s.element_type() != type || ring_out->element_type() != type ||
      (type != ffi::DataType::F32 && type != ffi::DataType::F64)) {
    return ffi::Error::InvalidArgument(
        "nj_csr_deliver: spikes and ring buffer must share one float32/float64 dtype");
  }
  if (step.element_type() != ffi::DataType::S32) {
    return ffi::Error::InvalidArgument("nj_csr_deliver: step must be int32");
  }
  const size_t k = pre_offset.size();
  if (rest.size() != 4 * k || n_pre.size() != k || delay_steps.size() != k ||
      target_offset.size() != k || per_synapse.size() != k || weights_batched.size() != k ||
      n_post.size() != k || sorted_rows.size() != k) {
    return ffi::Error::InvalidArgument("nj_csr_deliver: inconsistent projection arguments");
  }
  // Sizes first, once per call (O(projections)): nothing below reads past a buffer whose
  // size is checked here, and the per-row checks in Row cover the contents.
  if (n_source < 0 || n_slots < 1 || n_targets < 0) {
    return ffi::Error::InvalidArgument("nj_csr_deliver: negative sizes or no ring slot");
  }
  const int64_t n_trials = n_source > 0 ? s.element_count() / n_source : 0;
  if (n_source > 0 && (static_cast<int64_t>(s.element_count()) != n_trials * n_source ||
                       static_cast<int64_t>(ring_in.element_count()) !=
                           n_trials * n_slots * n_targets ||
                       ring_out->element_count() != ring_in.element_count())) {
    return ffi::Error::InvalidArgument(
        "nj_csr_deliver: the spikes and the ring buffer do not match the trials and sizes");
  }
  std::vector<Proj> projs(k);
  for (size_t p = 0; p < k; ++p) {
    auto indptr = rest.get<ffi::AnyBuffer>(4 * p);
    auto post = rest.get<ffi::AnyBuffer>(4 * p + 1);
    auto w = rest.get<ffi::AnyBuffer>(4 * p + 2);
    auto d = rest.get<ffi::AnyBuffer>(4 * p + 3);
    if (!indptr.has_value() || !post.has_value() || !w.has_value() || !d.has_value()) {
      return ffi::Error::InvalidArgument("nj_csr_deliver: missing projection buffer");
    }
    if (indptr->element_type() != ffi::DataType::S32 ||
        post->element_type() != ffi::DataType::S32 || w->element_type() != type) {
      return ffi::Error::InvalidArgument(
          "nj_csr_deliver: indptr/indices must be int32 and weights the ring's dtype");
    }
    const auto dt = d->element_type();
    if (per_synapse[p] && dt != ffi::DataType::S8 && dt != ffi::DataType::S16 &&
        dt != ffi::DataType::S32) {
      return ffi::Error::InvalidArgument("nj_csr_deliver: delays must be int8, int16 or int32");
    }
    const int64_t nnz = static_cast<int64_t>(post->element_count());
    const int64_t n_w = static_cast<int64_t>(w->element_count());
    if (n_pre[p] < 0 || pre_offset[p] < 0 || pre_offset[p] + n_pre[p] > n_source ||
        target_offset[p] < 0 || target_offset[p] > n_targets || delay_steps[p] < 0 ||
        n_post[p] < 0 || target_offset[p] + n_post[p] > n_targets ||
        static_cast<int64_t>(indptr->element_count()) != n_pre[p] + 1 ||
        n_w != (weights_batched[p] ? n_trials * nnz : nnz) ||
        (per_synapse[p] && static_cast<int64_t>(d->element_count()) < nnz)) {
      return ffi::Error::InvalidArgument(
          "nj_csr_deliver: projection " + std::to_string(p) +
          ": indptr, indices, weights or delays do not match its sizes and offsets");
    }
    projs[p] = Proj{static_cast<const int32_t*>(indptr->untyped_data()),
                    static_cast<const int32_t*>(post->untyped_data()),
                    w->untyped_data(),
                    d->untyped_data(),
                    dt,
                    pre_offset[p],
                    n_pre[p],
                    delay_steps[p],
                    target_offset[p],
                    nnz,
                    n_targets - target_offset[p],
                    per_synapse[p] != 0,
                    weights_batched[p] ? static_cast<int64_t>(post->element_count()) : 0,
                    n_post[p],
                    sorted_rows[p] != 0};
  }
  if (overwrite) {
    std::memset(ring_out->untyped_data(), 0, ring_out->size_bytes());
  } else if (ring_out->untyped_data() != ring_in.untyped_data()) {
    std::memcpy(ring_out->untyped_data(), ring_in.untyped_data(), ring_in.size_bytes());
  }
  const int64_t t = *static_cast<const int32_t*>(step.untyped_data());
  if (clear && !overwrite && n_slots > 1) {
    const size_t row = static_cast<size_t>(n_targets) * (type == ffi::DataType::F32 ? 4 : 8);
    char* out = static_cast<char*>(ring_out->untyped_data());
    const int64_t slot = Slot(t, -1, n_slots);  // step mod n_slots
    // Trials from the ring itself (the same number as the spikes' when there are neurons).
    const int64_t per_trial = n_slots * n_targets;
    const int64_t trials = per_trial > 0 ? ring_out->element_count() / per_trial : 0;
    for (int64_t b = 0; b < trials; ++b) {
      std::memset(out + (b * n_slots + slot) * row, 0, row);
    }
  }
  Faults bad;
  if (type == ffi::DataType::F32) {
    DeliverShared<float, uint32_t>(static_cast<const float*>(s.untyped_data()), projs, t,
                                   static_cast<float*>(ring_out->untyped_data()), n_source,
                                   n_slots, n_targets, n_trials, bad);
  } else {
    DeliverShared<double, uint64_t>(static_cast<const double*>(s.untyped_data()), projs, t,
                                    static_cast<double*>(ring_out->untyped_data()), n_source,
                                    n_slots, n_targets, n_trials, bad);
  }
  if (bad.rows || bad.targets || bad.delays || bad.order) {
    return ffi::Error::InvalidArgument(
        "nj_csr_deliver: corrupted connectivity (not delivered): " + std::to_string(bad.rows) +
        " rows with indptr outside [0, nnz] or decreasing, " + std::to_string(bad.targets) +
        " synapses with a postsynaptic index outside the population, " +
        std::to_string(bad.delays) + " negative delays, " + std::to_string(bad.order) +
        " synapses out of order in rows the layout gives as sorted by target");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjCsrDeliver, nj_ffi::Ordered<CsrDeliverImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // spikes (*batch, n_source)
                                  .Arg<ffi::AnyBuffer>()  // step () int32
                                  .Arg<ffi::AnyBuffer>()  // ring in (*batch, D, T)
                                  .RemainingArgs()        // 4 buffers per projection
                                  .Ret<ffi::AnyBuffer>()  // ring out (aliased)
                                  .Attr<int64_t>("n_source")
                                  .Attr<int64_t>("n_slots")
                                  .Attr<int64_t>("n_targets")
                                  .Attr<int64_t>("overwrite")
                                  .Attr<int64_t>("clear")
                                  .Attr<ffi::Span<const int64_t>>("pre_offset")
                                  .Attr<ffi::Span<const int64_t>>("n_pre")
                                  .Attr<ffi::Span<const int64_t>>("delay_steps")
                                  .Attr<ffi::Span<const int64_t>>("target_offset")
                                  .Attr<ffi::Span<const int64_t>>("per_synapse")
                                  .Attr<ffi::Span<const int64_t>>("weights_batched")
                                  .Attr<ffi::Span<const int64_t>>("n_post")
                                  .Attr<ffi::Span<const int64_t>>("sorted_rows"));

// ---------------------------------------------------------------------------------------------
// STDP weight update of one plastic projection (neurojax.network._plastic), in place.
//
// For each trial b: every synapse k of a presynaptic neuron i that arrives this step
// (s_arr[b, i] != 0) is depressed, w <- clip(w - a_minus * f_-(w) * y[b, post[k]] * s);
// then every synapse of a postsynaptic neuron j that spikes (s_post[b, j] != 0), found through
// the CSC view (col_syn, col_pre), is potentiated, w <- clip(w + a_plus * f_+(w) *
// x[b, pre] * s), with x the presynaptic trace after this step's arrivals. The same
// operations, in the same order, as `STDP.dense_update` restricted to touched synapses.
//
// The traces are advanced here too, each in one pass that also lists this step's spikes:
// x <- x decay_x plus this step's arrivals before potentiation, y <- y decay_y plus this
// step's postsynaptic spikes after depression (+1, or reset to 1 with `nearest`).
//
// Arguments: weights (*batch, nnz), x (*batch, n_pre), y (*batch, n_post) of the previous
// step, s_arr (*batch, arr_stride), s_post (*batch, post_stride), params (6,) = (a_plus,
// a_minus, w_min, w_max, decay_x, decay_y), indptr, indices, col_ptr, col_syn, col_pre
// (int32). The arrivals of trial b are s_arr[b, arr_offset : arr_offset + n_pre] and its
// postsynaptic spikes s_post[b, post_offset : post_offset + n_post]: the spike vectors may be
// those of a whole group of populations stepped together, the same vector the delivery kernel
// reads, so that XLA does not evaluate a population's spikes a second time for this kernel.
// Results: weights, x, y, aliased to the inputs.

namespace {


// The potentiation of one column (nj_events::PotentiateColumn) with the bound rule chosen at
// run time.
template <typename F>
inline void Potentiate(bool multiplicative, F* w, const F* x, const int32_t* col_syn,
                       const int32_t* col_pre, int64_t begin, int64_t end, F a_plus, F s, F lo,
                       F hi) {
  if (multiplicative) {
    nj_events::PotentiateColumn<F, true>(w, x, col_syn, col_pre, begin, end, a_plus, s, lo, hi);
  } else {
    nj_events::PotentiateColumn<F, false>(w, x, col_syn, col_pre, begin, end, a_plus, s, lo, hi);
  }
}

// One pass over a trace and its spike vector: tr[i] <- tr[i] decay, then + s[i] (all-to-all)
// or 1 where s[i] > 0 (nearest), the operations of `STDP.trace`. With kList the positions of
// the nonzero s[i] are also written, ascending, to `list`; returns their number.
template <typename F, typename Bits, bool kList>
int64_t AdvanceTrace(F* __restrict tr, const F* __restrict s, int64_t n, F decay, bool nearest,
                     int32_t* __restrict list) {
  typedef F VF __attribute__((vector_size(32)));
  constexpr int64_t kL = kLanes<F>;
  const VF one = VF{} + F(1), zero = VF{};
  int64_t count = 0, i = 0;
  for (; i + 2 * kL <= n; i += 2 * kL) {
    VF s0, s1, t0, t1;
    std::memcpy(&s0, s + i, 32);
    std::memcpy(&s1, s + i + kL, 32);
    std::memcpy(&t0, tr + i, 32);
    std::memcpy(&t1, tr + i + kL, 32);
    const VF d0 = t0 * decay, d1 = t1 * decay;
    if (nearest) {
      t0 = s0 > zero ? one : d0;
      t1 = s1 > zero ? one : d1;
    } else {
      t0 = d0 + s0;
      t1 = d1 + s1;
    }
    std::memcpy(tr + i, &t0, 32);
    std::memcpy(tr + i + kL, &t1, 32);
    if (!kList || !AnyBits<F, Bits>(s + i)) continue;
    for (int64_t j = i; j < i + 2 * kL; ++j) {
      if (s[j] != F(0)) list[count++] = static_cast<int32_t>(j);
    }
  }
  for (; i < n; ++i) {
    const F d = tr[i] * decay;
    tr[i] = nearest ? (s[i] > F(0) ? F(1) : d) : d + s[i];
    if (kList && s[i] != F(0)) list[count++] = static_cast<int32_t>(i);
  }
  return count;
}


// One trial's pair-STDP update of the arrived rows and the fired columns on n threads
// (pool.h), each phase split into runs of the spike lists: the checks of every row and column
// (nothing is written if one fails), the depression of the rows, the postsynaptic trace's
// pass (one thread), the potentiation of the columns. Returns the corrupted count.
template <typename F, typename Bits>
int64_t SharedStdp(int n, F* wb, F* xb, F* yb, const F* pb, const F* ab, const int32_t* arrived,
                   int64_t n_arr, const int32_t* fired, int64_t n_fired, const int32_t* indptr,
                   const int32_t* post, const int32_t* col_ptr, const int32_t* col_syn,
                   const int32_t* col_pre, int64_t nnz, int64_t n_pre, int64_t n_post, F a_plus,
                   F a_minus, F lo, F hi, F decay_y, bool multiplicative, bool nearest) {
  std::vector<int64_t> bad(n, 0);
  auto check = [&](int t) {
    int64_t q0, q1;
    nj_pool::Split(n_arr, t, n, q0, q1);
    for (int64_t q = q0; q < q1; ++q) {
      if (!RowOk(indptr, post, arrived[q], nnz, n_post)) ++bad[t];
    }
    nj_pool::Split(n_fired, t, n, q0, q1);
    for (int64_t q = q0; q < q1; ++q) {
      if (!ColumnOk(col_ptr, col_syn, col_pre, fired[q], nnz, n_pre)) ++bad[t];
    }
  };
  auto depress = [&](int t) {
    int64_t q0, q1;
    nj_pool::Split(n_arr, t, n, q0, q1);
    for (int64_t q = q0; q < q1; ++q) {
      const int32_t i = arrived[q];
      if (multiplicative) {
        DepressRow<F, true>(wb, yb, post, indptr[i], indptr[i + 1], a_minus, decay_y, ab[i], lo,
                            hi);
      } else {
        DepressRow<F, false>(wb, yb, post, indptr[i], indptr[i + 1], a_minus, decay_y, ab[i],
                             lo, hi);
      }
    }
  };
  auto potentiate = [&](int t) {
    int64_t q0, q1;
    nj_pool::Split(n_fired, t, n, q0, q1);
    for (int64_t q = q0; q < q1; ++q) {
      const int32_t j = fired[q];
      Potentiate<F>(multiplicative, wb, xb, col_syn, col_pre, col_ptr[j], col_ptr[j + 1],
                    a_plus, pb[j], lo, hi);
    }
  };
  auto run = [n](auto& phase) {
    if (!nj_pool::ParallelFor(n, phase)) {
      for (int t = 0; t < n; ++t) phase(t);
    }
  };
  run(check);
  int64_t total = 0;
  for (int64_t c : bad) total += c;
  if (total) return total;
  run(depress);
  AdvanceTrace<F, Bits, false>(yb, pb, n_post, decay_y, nearest, nullptr);
  run(potentiate);
  return 0;
}

// Returns the number of rows and columns found corrupted (0: the update ran in full).
template <typename F, typename Bits>
int64_t Stdp(F* w, F* x, F* y, const F* s_arr, const F* s_post, const F* params,
          const int32_t* indptr, const int32_t* post, const int32_t* col_ptr,
          const int32_t* col_syn, const int32_t* col_pre, int64_t nnz, int64_t n_pre,
          int64_t n_post, int64_t n_trials, int64_t arr_stride, int64_t post_stride,
          bool multiplicative, bool nearest) {
  const F a_plus = params[0], a_minus = params[1], lo = params[2], hi = params[3];
  const F decay_x = params[4], decay_y = params[5];
  // The spike lists, kept per thread between calls: allocating and zeroing them every step
  // would cost as much as the scans.
  thread_local std::vector<int32_t> arrived, fired;
  if (arrived.size() < static_cast<size_t>(n_pre)) arrived.resize(n_pre);
  if (fired.size() < static_cast<size_t>(n_post)) fired.resize(n_post);
  for (int64_t b = 0; b < n_trials; ++b) {
    F* wb = w + b * nnz;
    F* xb = x + b * n_pre;
    F* yb = y + b * n_post;
    const F* ab = s_arr + b * arr_stride;
    const F* pb = s_post + b * post_stride;
    // The arithmetic is that of the pure-JAX update, operation for operation: depression
    // reads the postsynaptic trace decayed but not yet incremented (y * decay_y, the same
    // product the stored trace gets), so the pass over y follows it; potentiation reads the
    // presynaptic trace after this step's arrivals, so the pass over x precedes it.
    const int64_t n_arr =
        AdvanceTrace<F, Bits, true>(xb, ab, n_pre, decay_x, nearest, arrived.data());
    int64_t n_fired = 0;
    ForEachNonzero<F, Bits>(pb, n_post, [&](int64_t j, F) {
      fired[n_fired++] = static_cast<int32_t>(j);
    });
    // Every synapse lies in one row and one column: the rows of this step's arrivals, then
    // the columns of its spikes, can be shared between threads, each thread updating the
    // synapses of its own rows (columns) with the serial operations in the serial order;
    // the weights are bit for bit the same with any number of threads.
    int n = 1;
    if (nj_pool::Threads() > 1) {
      int64_t work = 0;
      for (int64_t q = 0; q < n_arr; ++q) {
        const int64_t len = static_cast<int64_t>(indptr[arrived[q] + 1]) - indptr[arrived[q]];
        work += len > 0 ? len : 0;
      }
      for (int64_t q = 0; q < n_fired; ++q) {
        const int64_t len = static_cast<int64_t>(col_ptr[fired[q] + 1]) - col_ptr[fired[q]];
        work += len > 0 ? len : 0;
      }
      n = nj_pool::Worth(work, 3);
      if (n > 1) {
        const int64_t t0 = nj_pool::NowNs();
        const int64_t bad = SharedStdp<F, Bits>(n, wb, xb, yb, pb, ab, arrived.data(), n_arr,
                                                fired.data(), n_fired, indptr, post, col_ptr,
                                                col_syn, col_pre, nnz, n_pre, n_post, a_plus,
                                                a_minus, lo, hi, decay_y, multiplicative,
                                                nearest);
        if (bad) return bad;
        nj_pool::RecordShared(work, n, nj_pool::NowNs() - t0);
        continue;
      }
    }
    // The rows and columns of this step's spikes start at scattered places, mostly outside
    // this core's caches; asking for all their lines first lets the misses overlap (about
    // 10 % less kernel time in the COBA benchmark than fetching them on use).
    int64_t bad = 0;
    for (int64_t q = 0; q < n_arr; ++q) {
      const int32_t i = arrived[q];
      if (!RowOk(indptr, post, i, nnz, n_post)) {
        ++bad;
        continue;
      }
      const int32_t len = indptr[i + 1] - indptr[i];
      nj_run::PrefetchRange(wb + indptr[i], len * static_cast<int64_t>(sizeof(F)), true);
      nj_run::PrefetchRange(post + indptr[i], len * 4, false);
    }
    for (int64_t q = 0; q < n_fired; ++q) {
      const int32_t j = fired[q];
      if (!ColumnOk(col_ptr, col_syn, col_pre, j, nnz, n_pre)) {
        ++bad;
        continue;
      }
      const int32_t len = col_ptr[j + 1] - col_ptr[j];
      nj_run::PrefetchRange(col_syn + col_ptr[j], len * 4, false);
      nj_run::PrefetchRange(col_pre + col_ptr[j], len * 4, false);
    }
    if (bad) return bad;  // nothing written but the traces; the call reports an error
    for (int64_t q = 0; q < n_arr; ++q) {
      const int32_t i = arrived[q];
      if (multiplicative) {
        DepressRow<F, true>(wb, yb, post, indptr[i], indptr[i + 1], a_minus, decay_y, ab[i], lo,
                            hi);
      } else {
        DepressRow<F, false>(wb, yb, post, indptr[i], indptr[i + 1], a_minus, decay_y, ab[i],
                             lo, hi);
      }
    }
    AdvanceTrace<F, Bits, false>(yb, pb, n_post, decay_y, nearest, nullptr);
    // Potentiation of the spiking columns with the new presynaptic trace.
    for (int64_t q = 0; q < n_fired; ++q) {
      const int32_t j = fired[q];
      Potentiate<F>(multiplicative, wb, xb, col_syn, col_pre, col_ptr[j], col_ptr[j + 1],
                    a_plus, pb[j], lo, hi);
    }
  }
  return 0;
}

ffi::Error StdpImpl(ffi::AnyBuffer w_in, ffi::AnyBuffer x_in, ffi::AnyBuffer y_in,
                    ffi::AnyBuffer s_arr, ffi::AnyBuffer s_post, ffi::AnyBuffer params,
                    ffi::AnyBuffer indptr, ffi::AnyBuffer post, ffi::AnyBuffer col_ptr,
                    ffi::AnyBuffer col_syn, ffi::AnyBuffer col_pre,
                    ffi::Result<ffi::AnyBuffer> w_out, ffi::Result<ffi::AnyBuffer> x_out,
                    ffi::Result<ffi::AnyBuffer> y_out, int64_t n_pre, int64_t n_post,
                    int64_t arr_stride, int64_t arr_offset, int64_t post_stride,
                    int64_t post_offset, int64_t multiplicative, int64_t nearest) {
  const auto type = w_in.element_type();
  for (const ffi::AnyBuffer* buf : {&x_in, &y_in, &s_arr, &s_post, &params}) {
    if (buf->element_type() != type) {
      return ffi::Error::InvalidArgument("nj_stdp_update: float buffers must share one dtype");
    }
  }
  for (const ffi::AnyBuffer* buf : {&indptr, &post, &col_ptr, &col_syn, &col_pre}) {
    if (buf->element_type() != ffi::DataType::S32) {
      return ffi::Error::InvalidArgument("nj_stdp_update: index buffers must be int32");
    }
  }
  const std::pair<ffi::AnyBuffer*, const ffi::AnyBuffer*> pairs[] = {
      {&*w_out, &w_in}, {&*x_out, &x_in}, {&*y_out, &y_in}};
  for (const auto& [out, in] : pairs) {
    if (out->untyped_data() != in->untyped_data()) {
      std::memcpy(out->untyped_data(), in->untyped_data(), in->size_bytes());
    }
  }
  const int64_t nnz = post.element_count();
  // Trials from the presynaptic trace (a projection may have no synapse at all; its traces
  // still advance).
  const int64_t n_trials = n_pre > 0 ? x_in.element_count() / n_pre : 0;
  const auto count = [](const ffi::AnyBuffer& b) { return static_cast<int64_t>(b.element_count()); };
  if (n_pre < 0 || n_post < 0 || count(params) < 6 || count(x_in) != n_trials * n_pre ||
      (n_trials > 0 && (count(y_in) != n_trials * n_post || count(w_in) != n_trials * nnz)) ||
      count(indptr) != n_pre + 1 || count(col_ptr) != n_post + 1 || count(col_syn) != nnz ||
      count(col_pre) != nnz) {
    return ffi::Error::InvalidArgument(
        "nj_stdp_update: weights, traces or index arrays do not match n_pre, n_post and nnz");
  }
  if (arr_offset < 0 || arr_offset + n_pre > arr_stride || post_offset < 0 ||
      post_offset + n_post > post_stride ||
      s_arr.element_count() != static_cast<size_t>(n_trials * arr_stride) ||
      s_post.element_count() != static_cast<size_t>(n_trials * post_stride)) {
    return ffi::Error::InvalidArgument(
        "nj_stdp_update: spike vectors do not match the trials, strides and offsets");
  }
  const auto i32 = [](const ffi::AnyBuffer& b) {
    return static_cast<const int32_t*>(b.untyped_data());
  };
  int64_t bad = 0;
  const auto run = [&](auto zero, auto bits) {
    using F = decltype(zero);
    bad = Stdp<F, decltype(bits)>(
        static_cast<F*>(w_out->untyped_data()), static_cast<F*>(x_out->untyped_data()),
        static_cast<F*>(y_out->untyped_data()),
        static_cast<const F*>(s_arr.untyped_data()) + arr_offset,
        static_cast<const F*>(s_post.untyped_data()) + post_offset,
        static_cast<const F*>(params.untyped_data()), i32(indptr), i32(post), i32(col_ptr),
        i32(col_syn), i32(col_pre), nnz, n_pre, n_post, n_trials, arr_stride, post_stride,
        multiplicative != 0, nearest != 0);
  };
  if (type == ffi::DataType::F32) {
    run(0.0f, uint32_t{0});
  } else if (type == ffi::DataType::F64) {
    run(0.0, uint64_t{0});
  } else {
    return ffi::Error::InvalidArgument("nj_stdp_update: float32 or float64 expected");
  }
  if (bad) {
    return ffi::Error::InvalidArgument(
        "nj_stdp_update: corrupted connectivity (weights not updated): " + std::to_string(bad) +
        " rows or columns with indices outside the projection");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjStdpUpdate, nj_ffi::Ordered<StdpImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // weights (*batch, nnz)
                                  .Arg<ffi::AnyBuffer>()  // x after arrivals (*batch, n_pre)
                                  .Arg<ffi::AnyBuffer>()  // y before post spikes
                                  .Arg<ffi::AnyBuffer>()  // s_arr (*batch, arr_stride)
                                  .Arg<ffi::AnyBuffer>()  // s_post (*batch, post_stride)
                                  .Arg<ffi::AnyBuffer>()  // params (4,)
                                  .Arg<ffi::AnyBuffer>()  // indptr
                                  .Arg<ffi::AnyBuffer>()  // indices (post per synapse)
                                  .Arg<ffi::AnyBuffer>()  // col_ptr
                                  .Arg<ffi::AnyBuffer>()  // col_syn
                                  .Arg<ffi::AnyBuffer>()  // col_pre
                                  .Ret<ffi::AnyBuffer>()  // weights (aliased)
                                  .Ret<ffi::AnyBuffer>()  // x after this step (aliased)
                                  .Ret<ffi::AnyBuffer>()  // y after this step (aliased)
                                  .Attr<int64_t>("n_pre")
                                  .Attr<int64_t>("n_post")
                                  .Attr<int64_t>("arr_stride")
                                  .Attr<int64_t>("arr_offset")
                                  .Attr<int64_t>("post_stride")
                                  .Attr<int64_t>("post_offset")
                                  .Attr<int64_t>("multiplicative")
                                  .Attr<int64_t>("nearest"));

// ---------------------------------------------------------------------------------------------
// Tsodyks-Markram short-term plasticity at one step's spikes (neurojax.synapses._short_term).
//
// The state of every presynaptic neuron is kept as it stood just after its last spike: u, R
// and the step `last` at whose end that spike happened. Only the neurons that spike now
// (s[b, i] != 0, found by the same block scan as the delivery's) are touched: their u and R
// relax in closed form over the elapsed time (now - last) dt, u jumps, the fraction u+ R- is
// released and R drops, with the operations of the pure-JAX reference
// (`_short_term._release_reference`) in its order; every other neuron costs the scan only.
//
// Arguments: spikes (*batch, n) of the population, step () int32 (the spikes are dated at
// the end of that step, now = step + 1), u, r (*batch, n), last (*batch, n) int32, then the
// parameters U, 1 / tau_rec and the facilitation rate (1 / tau_facil, +inf without
// facilitation), each (1,) or (n,), and dt (1,). Results: u, r, last (aliased to the inputs)
// and the releases s u+ R- (*batch, n), 0 where s is 0.

namespace {

template <typename F, typename Bits>
void StpRelease(const F* s, int64_t n, int64_t n_trials, int32_t now, F dt, const F* u_par,
                int64_t u_stride, const F* rate_rec, int64_t rec_stride, const F* rate_facil,
                int64_t facil_stride, F* u, F* r, int32_t* last, F* rel) {
  std::memset(rel, 0, static_cast<size_t>(n * n_trials) * sizeof(F));
  for (int64_t b = 0; b < n_trials; ++b) {
    const int64_t o = b * n;
    ForEachNonzero<F, Bits>(s + o, n, [&](int64_t i, F v) {
      const int64_t k = o + i;
      const F elapsed = static_cast<F>(now - last[k]) * dt;
      const F decay_f = std::exp(-elapsed * rate_facil[i * facil_stride]);
      const F decay_r = std::exp(-elapsed * rate_rec[i * rec_stride]);
      const F u_minus = u[k] * decay_f;
      const F r_minus = F(1) - (F(1) - r[k]) * decay_r;
      const F u_plus = u_minus + u_par[i * u_stride] * (F(1) - u_minus);
      const F release = u_plus * r_minus;
      // A spike enters the state as a blend s x_new + (1 - s) x_old, as in the reference
      // (its surrogate value reaches the state there; here s is the forward value).
      u[k] = u[k] + v * (u_plus - u[k]);
      r[k] = r[k] + v * (r_minus - release - r[k]);
      if (v > F(0)) last[k] = now;
      rel[k] = v * release;
    });
  }
}

ffi::Error StpReleaseImpl(ffi::AnyBuffer s, ffi::AnyBuffer step, ffi::AnyBuffer u_in,
                          ffi::AnyBuffer r_in, ffi::AnyBuffer last_in, ffi::AnyBuffer u_par,
                          ffi::AnyBuffer rate_rec, ffi::AnyBuffer rate_facil, ffi::AnyBuffer dt,
                          ffi::Result<ffi::AnyBuffer> u_out, ffi::Result<ffi::AnyBuffer> r_out,
                          ffi::Result<ffi::AnyBuffer> last_out,
                          ffi::Result<ffi::AnyBuffer> rel_out, int64_t n) {
  const auto type = s.element_type();
  if (type != ffi::DataType::F32 && type != ffi::DataType::F64) {
    return ffi::Error::InvalidArgument("nj_stp_release: float32 or float64 expected");
  }
  for (const ffi::AnyBuffer* buf : {&u_in, &r_in, &u_par, &rate_rec, &rate_facil, &dt}) {
    if (buf->element_type() != type) {
      return ffi::Error::InvalidArgument("nj_stp_release: float buffers must share one dtype");
    }
  }
  if (step.element_type() != ffi::DataType::S32 || last_in.element_type() != ffi::DataType::S32) {
    return ffi::Error::InvalidArgument("nj_stp_release: step and last must be int32");
  }
  const auto count = [](const ffi::AnyBuffer& b) { return static_cast<int64_t>(b.element_count()); };
  if (n < 0 || step.element_count() != 1 || count(dt) != 1) {
    return ffi::Error::InvalidArgument("nj_stp_release: negative size, or step/dt not scalars");
  }
  const int64_t n_trials = n > 0 ? count(s) / n : 0;
  if (count(s) != n_trials * n || count(u_in) != count(s) || count(r_in) != count(s) ||
      count(last_in) != count(s) || count(*u_out) != count(s) || count(*r_out) != count(s) ||
      count(*last_out) != count(s) || count(*rel_out) != count(s)) {
    return ffi::Error::InvalidArgument(
        "nj_stp_release: spikes, u, r, last and releases must all hold trials x n entries");
  }
  // A parameter holds one value for all neurons (stride 0) or one per neuron (stride 1).
  int64_t strides[3];
  const ffi::AnyBuffer* params[3] = {&u_par, &rate_rec, &rate_facil};
  for (int p = 0; p < 3; ++p) {
    const int64_t c = count(*params[p]);
    if (c != 1 && c != n) {
      return ffi::Error::InvalidArgument(
          "nj_stp_release: U, 1/tau_rec and the facilitation rate must hold 1 or n values");
    }
    strides[p] = c == 1 ? 0 : 1;
  }
  const std::pair<ffi::AnyBuffer*, const ffi::AnyBuffer*> pairs[] = {
      {&*u_out, &u_in}, {&*r_out, &r_in}, {&*last_out, &last_in}};
  for (const auto& [out, in] : pairs) {
    if (out->untyped_data() != in->untyped_data()) {
      std::memcpy(out->untyped_data(), in->untyped_data(), in->size_bytes());
    }
  }
  const int32_t now = *static_cast<const int32_t*>(step.untyped_data()) + 1;
  int32_t* last = static_cast<int32_t*>(last_out->untyped_data());
  const auto run = [&](auto zero, auto bits) {
    using F = decltype(zero);
    const auto in = [](const ffi::AnyBuffer& b) { return static_cast<const F*>(b.untyped_data()); };
    StpRelease<F, decltype(bits)>(in(s), n, n_trials, now, *in(dt), in(u_par), strides[0],
                                  in(rate_rec), strides[1], in(rate_facil), strides[2],
                                  static_cast<F*>(u_out->untyped_data()),
                                  static_cast<F*>(r_out->untyped_data()), last,
                                  static_cast<F*>(rel_out->untyped_data()));
  };
  if (type == ffi::DataType::F32) {
    run(0.0f, uint32_t{0});
  } else {
    run(0.0, uint64_t{0});
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjStpRelease, nj_ffi::Ordered<StpReleaseImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // spikes (*batch, n)
                                  .Arg<ffi::AnyBuffer>()  // step () int32
                                  .Arg<ffi::AnyBuffer>()  // u (*batch, n)
                                  .Arg<ffi::AnyBuffer>()  // r (*batch, n)
                                  .Arg<ffi::AnyBuffer>()  // last (*batch, n) int32
                                  .Arg<ffi::AnyBuffer>()  // U (1,) or (n,)
                                  .Arg<ffi::AnyBuffer>()  // 1 / tau_rec (1,) or (n,)
                                  .Arg<ffi::AnyBuffer>()  // facilitation rate (1,) or (n,)
                                  .Arg<ffi::AnyBuffer>()  // dt (1,)
                                  .Ret<ffi::AnyBuffer>()  // u (aliased)
                                  .Ret<ffi::AnyBuffer>()  // r (aliased)
                                  .Ret<ffi::AnyBuffer>()  // last (aliased)
                                  .Ret<ffi::AnyBuffer>()  // releases (*batch, n)
                                  .Attr<int64_t>("n"));
