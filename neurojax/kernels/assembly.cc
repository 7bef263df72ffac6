// The heavy parts of an assembly projection step on CPU, called through XLA's FFI: the input
// sum and the synapse update on a dense weight matrix (neurojax.assembly._synapses), Floyd's
// choice of the first-time winners' inputs, the k-cap, the sparse target's bookkeeping around
// it and the step's random words (neurojax.assembly._brain). Other platforms run the same
// operations in pure JAX. Besides the work itself, each kernel replaces dozens of small XLA
// operations, each of which the CPU runtime dispatches on its own.
//
// nj_asm_rowsum: x[b, c] = sum of W[b, r, c] over the rows r of rows[b, :] (entries outside
// [0, R) count as rows of zeros), for c < limit[b]; x[b, c] = 0 for c >= limit[b]. The rows
// are added as a balanced binary tree over their positions in the list: the sum of positions
// [lo, hi) is the sum of [lo, lo + h) plus the sum of [lo + h, hi), h the largest power of two
// below hi - lo (PairwiseSum). The pure-JAX path adds neighbouring pairs level by level, which
// is the same tree, and float addition is commutative, so both paths give the same sums bit
// for bit and the k-cap sees identical inputs (a list-order sum here against XLA's own
// reduction order used to flip near-ties). Only the first `limit` columns are read: in sparse
// mode the columns beyond an area's support belong to neurons that have not fired yet, and the
// caller masks them.
//
// nj_asm_update: in place on W (*batch, R, C), first the synapses of first-time winners, then
// the Hebbian factor:
//   1. for every row i with 0 <= cols[b, i] < C (a first-time winner, column c): W[src, c] = 0
//      for every valid source row src in src_rows[b, :], then W[r_s, c] = 1 for each item t of
//      chosen[b, i, :] with 0 <= s = t - start[b] < count[b], r_s being the s-th entry >= 0 of
//      src_rows[b, :] (the winners of this source that the new neuron's input was drawn from);
//   2. with `plastic`, W[r, c] *= factor[b] for every valid r in heb_rows[b, :] and every valid c
//      in heb_cols[b, :] (synapses from the previous winners onto the new ones).
// Each entry is set or multiplied once (winner lists hold distinct neurons), so the result
// equals the pure-JAX scatters exactly. Work is proportional to the winners times the support
// (the rows of the previous winners up to the last new winner's column), never to the whole
// matrix.
//
// nj_asm_update_sum: nj_asm_update, then x = nj_asm_rowsum of the updated W with rows
// sum_rows and limit sum_limit (a second result), in one pass: a row that is both scaled and
// summed (in a converged projection the winners that the next step sums are the rows this
// step scales) is read once. The sum uses nj_asm_rowsum's tree, so both results equal those
// of the two separate calls bit for bit.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "common.h"
#include "threefry.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

namespace ffi = xla::ffi;

namespace {

// The first cache lines (up to 1 KiB) of the next row to be read or scaled: rows start at
// scattered places of a matrix larger than the caches, and the hardware prefetcher only picks
// up a row's stream after its first misses. (Rows summed or scaled in a converged n = 10^5
// projection: 5-7 % less kernel time, measured in runs alternating in one process.)
template <typename F>
inline void PrefetchRowStart(const F* row, int64_t n, bool for_write) {
  nj_run::PrefetchRange(row, std::min<int64_t>(n * static_cast<int64_t>(sizeof(F)), 1024),
                        for_write);
}

template <typename F>
__attribute__((noinline)) void AddRow(F* __restrict x, const F* __restrict row, int64_t n) {
  for (int64_t c = 0; c < n; ++c) x[c] += row[c];
}

// A batch entry's limit, clamped to [0, n_cols].
inline int64_t ClampLimit(int64_t lim, int64_t n_cols) {
  return lim < 0 ? 0 : (lim > n_cols ? n_cols : lim);
}

// The pairwise (balanced binary tree) sum of `k` rows of `lim` entries: the node over positions
// [lo, hi) adds the nodes over [lo, lo + h) and [lo + h, hi), h the largest power of two below
// hi - lo. `rows[i]` points to the row at position i (a row of zeros, `ZeroRow`, for an invalid
// entry: x + 0 == x, so that equals leaving it out). Nodes of 2, 4 and 8 rows (always whole
// subtrees) are added column by column in registers, reading their rows side by side and
// writing the node once; only the nodes above them pass through the per-depth scratch rows.
// `leaves(lo, hi, out)` computes those small nodes (hi - lo in {1, 2, 4, 8}), in increasing
// order of position: `SumLeaves`, or the fused update's version that scales rows on the way.
template <typename F>
__attribute__((noinline)) void SumPairs(F* __restrict out, const F* __restrict a,
                                        const F* __restrict b, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] = a[c] + b[c];
}

template <typename F>
__attribute__((noinline)) void SumQuads(F* __restrict out, const F* const* r, int64_t n) {
  const F* __restrict r0 = r[0];
  const F* __restrict r1 = r[1];
  const F* __restrict r2 = r[2];
  const F* __restrict r3 = r[3];
  for (int64_t c = 0; c < n; ++c) out[c] = (r0[c] + r1[c]) + (r2[c] + r3[c]);
}

template <typename F>
__attribute__((noinline)) void SumOctets(F* __restrict out, const F* const* r, int64_t n) {
  const F* __restrict r0 = r[0];
  const F* __restrict r1 = r[1];
  const F* __restrict r2 = r[2];
  const F* __restrict r3 = r[3];
  const F* __restrict r4 = r[4];
  const F* __restrict r5 = r[5];
  const F* __restrict r6 = r[6];
  const F* __restrict r7 = r[7];
  for (int64_t c = 0; c < n; ++c) {
    out[c] = ((r0[c] + r1[c]) + (r2[c] + r3[c])) + ((r4[c] + r5[c]) + (r6[c] + r7[c]));
  }
}

// Scales the rows r0..r7 by m in place and writes their tree sum to out, on [0, n): each row is
// read once. (Every pointer a parameter: GCC honours `restrict` on parameters, and without it
// the stores into the rows would keep the loop from being vectorised.)
template <typename F>
__attribute__((noinline)) void ScaleSumOctet(F* __restrict out, F* __restrict r0,
                                             F* __restrict r1, F* __restrict r2,
                                             F* __restrict r3, F* __restrict r4,
                                             F* __restrict r5, F* __restrict r6,
                                             F* __restrict r7, const F* __restrict m, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const F v0 = r0[c] * m[c], v1 = r1[c] * m[c], v2 = r2[c] * m[c], v3 = r3[c] * m[c];
    const F v4 = r4[c] * m[c], v5 = r5[c] * m[c], v6 = r6[c] * m[c], v7 = r7[c] * m[c];
    r0[c] = v0;
    r1[c] = v1;
    r2[c] = v2;
    r3[c] = v3;
    r4[c] = v4;
    r5[c] = v5;
    r6[c] = v6;
    r7[c] = v7;
    out[c] = ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7));
  }
}

// The node of the rows [lo, hi) (1, 2, 4 or 8 of them) into out[0, n).
template <typename F>
void SumLeaves(const F* const* rows, int64_t lo, int64_t hi, F* out, int64_t n) {
  switch (hi - lo) {
    case 1:
      std::memcpy(out, rows[lo], n * sizeof(F));
      break;
    case 2:
      SumPairs(out, rows[lo], rows[lo + 1], n);
      break;
    case 4:
      SumQuads(out, rows + lo, n);
      break;
    default:
      SumOctets(out, rows + lo, n);
  }
}

template <typename F>
class PairwiseSum {
 public:
  // Sums positions [0, k) (k >= 1) into out[0, lim).
  template <typename Leaves>
  void Run(int64_t k, int64_t lim, F* out, const Leaves& leaves) {
    lim_ = lim;
    int depth = 1;
    for (int64_t span = 1; span < k; span *= 2) ++depth;
    if (static_cast<int64_t>(scratch_.size()) < depth * lim) scratch_.resize(depth * lim);
    Node(0, k, out, 0, leaves);
  }

 private:
  template <typename Leaves>
  void Node(int64_t lo, int64_t hi, F* out, int depth, const Leaves& leaves) {
    const int64_t n = hi - lo;
    if (n == 1 || n == 2 || n == 4 || n == 8) {
      leaves(lo, hi, out);
      return;
    }
    int64_t half = 1;
    while (half * 2 < n) half *= 2;
    Node(lo, lo + half, out, depth + 1, leaves);
    F* right = scratch_.data() + depth * lim_;
    Node(lo + half, hi, right, depth + 1, leaves);
    AddRow(out, right, lim_);
  }

  std::vector<F> scratch_;  // one row of partial sums per tree depth
  int64_t lim_ = 0;
};

// Per-thread buffers of the input sums: the tree's scratch, the row pointers and a row of zeros.
template <typename F>
struct SumScratch {
  PairwiseSum<F> tree;
  std::vector<F*> rows;
  std::vector<F> zeros;
  F* Zeros(int64_t n) {
    if (static_cast<int64_t>(zeros.size()) < n) zeros.assign(n, F(0));
    return zeros.data();
  }
};

template <typename F>
SumScratch<F>& SumBuffers() {
  // (A local reference: each use of a thread_local of a shared library is a call.)
  thread_local SumScratch<F> buffers;
  return buffers;
}

// The pairwise sum of the first `lim` entries of the rows `rows[0..k)` of wb (entries outside
// [0, n_rows) are zero rows) into xb[0, lim). `leaves(ptrs, lo, hi, out)` computes the small
// nodes from the row pointers `ptrs` (default: SumLeaves, after prefetching the next rows).
template <typename F, typename Leaves>
void AddRows(F* wb, const int32_t* rows, int64_t k, int64_t n_rows, int64_t n_cols, int64_t lim,
             F* xb, const Leaves& leaves) {
  if (k <= 0) {
    std::fill(xb, xb + lim, F(0));
    return;
  }
  SumScratch<F>& s = SumBuffers<F>();
  F* zeros = s.Zeros(lim);
  s.rows.resize(k);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t r = rows[i];
    s.rows[i] = r >= 0 && r < n_rows ? wb + r * n_cols : zeros;
  }
  F* const* ptrs = s.rows.data();
  s.tree.Run(k, lim, xb, [&](int64_t lo, int64_t hi, F* out) { leaves(ptrs, lo, hi, out); });
}

// Prefetches the starts of the rows after [lo, hi) (as many as it holds).
template <typename F>
inline void PrefetchAfter(const F* const* ptrs, int64_t lo, int64_t hi, int64_t k, int64_t n,
                          bool for_write) {
  for (int64_t i = hi; i < std::min(k, hi + (hi - lo)); ++i) {
    PrefetchRowStart(ptrs[i], n, for_write);
  }
}

template <typename F>
void RowSum(const F* w, const int32_t* rows, const int32_t* limit, F* x, int64_t n_batch,
            int64_t n_rows, int64_t n_cols, int64_t k) {
  for (int64_t b = 0; b < n_batch; ++b) {
    F* xb = x + b * n_cols;
    const int64_t lim = ClampLimit(limit[b], n_cols);
    // (The rows are only read; AddRows takes writable pointers for the fused update.)
    F* wb = const_cast<F*>(w) + b * n_rows * n_cols;
    AddRows(wb, rows + b * k, k, n_rows, n_cols, lim, xb,
            [k, lim](F* const* ptrs, int64_t lo, int64_t hi, F* out) {
              PrefetchAfter(ptrs, lo, hi, k, lim, false);
              SumLeaves(ptrs, lo, hi, out, lim);
            });
    for (int64_t c = lim; c < n_cols; ++c) xb[c] = F(0);
  }
}

ffi::Error RowSumImpl(ffi::AnyBuffer w, ffi::AnyBuffer rows, ffi::AnyBuffer limit,
                      ffi::Result<ffi::AnyBuffer> x) {
  const auto type = w.element_type();
  if (type != ffi::DataType::F32 && type != ffi::DataType::F64) {
    return ffi::Error::InvalidArgument("nj_asm_rowsum: weights must be float32 or float64");
  }
  if (x->element_type() != type || rows.element_type() != ffi::DataType::S32 ||
      limit.element_type() != ffi::DataType::S32) {
    return ffi::Error::InvalidArgument("nj_asm_rowsum: rows and limit must be int32");
  }
  const auto dims = w.dimensions();
  if (dims.size() < 2) {
    return ffi::Error::InvalidArgument("nj_asm_rowsum: weights must be (*batch, R, C)");
  }
  const int64_t n_rows = dims[dims.size() - 2];
  const int64_t n_cols = dims[dims.size() - 1];
  const int64_t n_batch = n_rows * n_cols > 0 ? w.element_count() / (n_rows * n_cols) : 0;
  if (n_batch == 0) {
    if (x->size_bytes()) std::memset(x->untyped_data(), 0, x->size_bytes());
    return ffi::Error::Success();
  }
  if (static_cast<int64_t>(limit.element_count()) != n_batch ||
      static_cast<int64_t>(rows.element_count()) % n_batch != 0 ||
      static_cast<int64_t>(x->element_count()) != n_batch * n_cols) {
    return ffi::Error::InvalidArgument("nj_asm_rowsum: batch sizes of the arguments differ");
  }
  const int64_t k = rows.element_count() / n_batch;
  const auto* r = static_cast<const int32_t*>(rows.untyped_data());
  const auto* l = static_cast<const int32_t*>(limit.untyped_data());
  if (type == ffi::DataType::F32) {
    RowSum<float>(static_cast<const float*>(w.untyped_data()), r, l,
                  static_cast<float*>(x->untyped_data()), n_batch, n_rows, n_cols, k);
  } else {
    RowSum<double>(static_cast<const double*>(w.untyped_data()), r, l,
                   static_cast<double*>(x->untyped_data()), n_batch, n_rows, n_cols, k);
  }
  return ffi::Error::Success();
}

struct UpdateArgs {
  const int32_t* src_rows;  // (*batch, ks)
  const int32_t* cols;      // (*batch, kc)
  const int32_t* chosen;    // (*batch, kc, width)
  const int32_t* start;     // (*batch,)
  const int32_t* count;     // (*batch,)
  const int32_t* heb_rows;  // (*batch, kr)
  const int32_t* heb_cols;  // (*batch, kt)
  int64_t ks, kc, width, kr, kt;
};

template <typename F>
__attribute__((noinline)) void ScaleRow(F* __restrict row, const F* __restrict m, int64_t n) {
  for (int64_t c = 0; c < n; ++c) row[c] *= m[c];
}

// The input sum of nj_asm_update_sum (x == nullptr: none).
struct SumArgs {
  const int32_t* rows;   // (*batch, kq)
  const int32_t* limit;  // (*batch,)
  int64_t kq;
};

template <typename F>
void Update(F* w, const F* factor, const UpdateArgs& a, int64_t n_batch, int64_t n_rows,
            int64_t n_cols, bool plastic, const SumArgs& sum, F* x) {
  // Kept between calls (allocating them cost as much as a small step): `mult` is all ones
  // and `pending` all zeros between uses.
  // (Local references: each use of a thread_local of a shared library is a call.)
  thread_local std::vector<F> mult_buf;
  thread_local std::vector<int64_t> new_cols_buf;
  thread_local std::vector<uint8_t> pending_buf;
  thread_local std::vector<int64_t> valid_src_buf;
  std::vector<F>& mult = mult_buf;
  std::vector<int64_t>& new_cols = new_cols_buf;
  std::vector<int64_t>& valid_src = valid_src_buf;
  // Rows still to be scaled, when the sum scales some of them on the way: 1 = pending.
  std::vector<uint8_t>& pending = pending_buf;
  if (plastic && static_cast<int64_t>(mult.size()) < n_cols) mult.resize(n_cols, F(1));
  if (x != nullptr && plastic && static_cast<int64_t>(pending.size()) < n_rows) {
    pending.resize(n_rows, 0);
  }
  new_cols.reserve(a.kc);
  valid_src.reserve(a.ks);
  for (int64_t b = 0; b < n_batch; ++b) {
    F* wb = w + b * n_rows * n_cols;
    const int32_t* src = a.src_rows + b * a.ks;
    const int32_t* cols = a.cols + b * a.kc;
    const int64_t start = a.start[b];
    const int64_t count = a.count[b];
    // The new winners' columns are cleared row by row (their labels are consecutive, so each
    // row is one short contiguous run), then the chosen synapses are set to 1.
    new_cols.clear();
    for (int64_t i = 0; i < a.kc; ++i) {
      if (cols[i] >= 0 && cols[i] < n_cols) new_cols.push_back(cols[i]);
    }
    valid_src.clear();
    if (!new_cols.empty()) {
      for (int64_t s = 0; s < a.ks; ++s) {
        const int64_t r = src[s];
        if (r < 0) continue;
        valid_src.push_back(r);
        if (r >= n_rows) continue;
        F* row = wb + r * n_cols;
        for (const int64_t c : new_cols) row[c] = F(0);
      }
    }
    const int64_t n_valid = static_cast<int64_t>(valid_src.size());
    for (int64_t i = 0; i < a.kc; ++i) {
      const int64_t c = cols[i];
      if (c < 0 || c >= n_cols) continue;
      const int32_t* items = a.chosen + (b * a.kc + i) * a.width;
      for (int64_t j = 0; j < a.width; ++j) {
        const int64_t s = static_cast<int64_t>(items[j]) - start;
        if (s < 0 || s >= count || s >= n_valid) continue;
        const int64_t r = valid_src[s];
        if (r < n_rows) wb[r * n_cols + c] = F(1);
      }
    }
    int64_t lim = 0;
    const int32_t* sum_rows = nullptr;
    F* xb = nullptr;
    if (x != nullptr) {
      xb = x + b * n_cols;
      sum_rows = sum.rows + b * sum.kq;
      lim = ClampLimit(sum.limit[b], n_cols);
      for (int64_t c = lim; c < n_cols; ++c) xb[c] = F(0);
    }
    const auto valid = [n_rows](int64_t r) { return r >= 0 && r < n_rows; };
    if (!plastic) {
      if (xb != nullptr) {
        AddRows(wb, sum_rows, sum.kq, n_rows, n_cols, lim, xb,
                [&sum, lim](F* const* ptrs, int64_t lo, int64_t hi, F* out) {
                  PrefetchAfter(ptrs, lo, hi, sum.kq, lim, false);
                  SumLeaves(ptrs, lo, hi, out, lim);
                });
      }
      continue;
    }
    // Each row of a previous winner is multiplied by a vector that holds `factor` at the new
    // winners' columns and 1 elsewhere, up to the last such column: a contiguous, vectorised
    // pass over the row instead of scattered read-modify-writes (the rows of a large matrix
    // are not in cache, and scattered accesses into them are bound by memory latency).
    // x * 1 == x exactly, so every other synapse keeps its value bit for bit.
    const F f = factor[b];
    int64_t width = 0;
    for (int64_t j = 0; j < a.kt; ++j) {
      const int64_t c = a.heb_cols[b * a.kt + j];
      if (c >= 0 && c < n_cols) {
        mult[c] = f;
        width = c + 1 > width ? c + 1 : width;
      }
    }
    const F* m = mult.data();
    const int32_t* heb_rows = a.heb_rows + b * a.kr;
    if (xb != nullptr) {
      // The summed rows in nj_asm_rowsum's tree, each scaled first where it is a previous
      // winner's row; then the previous winners' rows that are not summed.
      for (int64_t i = 0; i < a.kr; ++i) {
        if (valid(heb_rows[i])) pending[heb_rows[i]] = 1;
      }
      // A pending row is scaled as the tree reads it: an octet of pending rows in one pass
      // (the common case: a converged projection sums the rows it has just scaled), other
      // nodes after scaling their pending rows (then in cache). Row pointers that are not
      // rows of wb (the zero row) are never pending.
      const int32_t* sr = sum_rows;
      const auto is_pending = [&](int64_t i) { return valid(sr[i]) && pending[sr[i]]; };
      const auto leaves = [&](F* const* ptrs, int64_t lo, int64_t hi, F* out) {
        PrefetchAfter(ptrs, lo, hi, sum.kq, std::max(width, lim), true);
        bool all = hi - lo == 8;
        for (int64_t i = lo; i < hi && all; ++i) all = is_pending(i);
        if (all) {
          const int64_t both = std::min(width, lim);
          F* const* r = ptrs + lo;
          ScaleSumOctet(out, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], m, both);
          if (both < lim) {
            const F* shifted[8];
            for (int j = 0; j < 8; ++j) shifted[j] = ptrs[lo + j] + both;
            SumOctets(out + both, shifted, lim - both);
          }
          for (int64_t i = lo; i < hi; ++i) {
            if (both < width) ScaleRow(ptrs[i] + both, m + both, width - both);
            pending[sr[i]] = 0;
          }
          return;
        }
        for (int64_t i = lo; i < hi; ++i) {
          if (is_pending(i)) {
            ScaleRow(ptrs[i], m, width);
            pending[sr[i]] = 0;
          }
        }
        SumLeaves(ptrs, lo, hi, out, lim);
      };
      AddRows(wb, sum_rows, sum.kq, n_rows, n_cols, lim, xb, leaves);
    }
    for (int64_t i = 0; i < a.kr; ++i) {
      const int64_t r = heb_rows[i];
      if (!valid(r) || (xb != nullptr && !pending[r])) continue;
      if (i + 1 < a.kr && valid(heb_rows[i + 1])) {
        PrefetchRowStart(wb + heb_rows[i + 1] * n_cols, width, true);
      }
      ScaleRow(wb + r * n_cols, m, width);
      if (xb != nullptr) pending[r] = 0;
    }
    for (int64_t c = 0; c < width; ++c) mult[c] = F(1);
  }
}

// The update of nj_asm_update, and with `sum_rows` (not null) the input sum of
// nj_asm_update_sum into `x`.
ffi::Error RunUpdate(const ffi::AnyBuffer& w_in, const ffi::AnyBuffer& src_rows,
                     const ffi::AnyBuffer& cols, const ffi::AnyBuffer& chosen,
                     const ffi::AnyBuffer& start, const ffi::AnyBuffer& count,
                     const ffi::AnyBuffer& heb_rows, const ffi::AnyBuffer& heb_cols,
                     const ffi::AnyBuffer& factor, ffi::AnyBuffer& w_out, int64_t plastic,
                     const ffi::AnyBuffer* sum_rows, const ffi::AnyBuffer* sum_limit,
                     ffi::AnyBuffer* x) {
  const auto type = w_in.element_type();
  if (type != ffi::DataType::F32 && type != ffi::DataType::F64) {
    return ffi::Error::InvalidArgument("nj_asm_update: weights must be float32 or float64");
  }
  if (factor.element_type() != type) {
    return ffi::Error::InvalidArgument("nj_asm_update: factor must have the weights' dtype");
  }
  for (const auto* buf : {&src_rows, &cols, &chosen, &start, &count, &heb_rows, &heb_cols}) {
    if (buf->element_type() != ffi::DataType::S32) {
      return ffi::Error::InvalidArgument("nj_asm_update: index arguments must be int32");
    }
  }
  const auto dims = w_in.dimensions();
  if (dims.size() < 2) {
    return ffi::Error::InvalidArgument("nj_asm_update: weights must be (*batch, R, C)");
  }
  if (w_out.untyped_data() != w_in.untyped_data()) {
    std::memcpy(w_out.untyped_data(), w_in.untyped_data(), w_in.size_bytes());
  }
  const int64_t n_rows = dims[dims.size() - 2];
  const int64_t n_cols = dims[dims.size() - 1];
  const int64_t n_batch = n_rows * n_cols > 0 ? w_in.element_count() / (n_rows * n_cols) : 0;
  if (n_batch == 0) return ffi::Error::Success();
  const auto per = [n_batch](const ffi::AnyBuffer& buf) -> int64_t {
    return static_cast<int64_t>(buf.element_count()) / n_batch;
  };
  const bool sizes_ok =
      static_cast<int64_t>(start.element_count()) == n_batch &&
      static_cast<int64_t>(count.element_count()) == n_batch &&
      static_cast<int64_t>(factor.element_count()) == n_batch &&
      per(src_rows) * n_batch == static_cast<int64_t>(src_rows.element_count()) &&
      per(cols) * n_batch == static_cast<int64_t>(cols.element_count()) &&
      per(heb_rows) * n_batch == static_cast<int64_t>(heb_rows.element_count()) &&
      per(heb_cols) * n_batch == static_cast<int64_t>(heb_cols.element_count()) &&
      (per(cols) == 0 || per(chosen) % per(cols) == 0);
  if (!sizes_ok) {
    return ffi::Error::InvalidArgument("nj_asm_update: batch sizes of the arguments differ");
  }
  SumArgs sum{nullptr, nullptr, 0};
  if (sum_rows != nullptr) {
    if (sum_rows->element_type() != ffi::DataType::S32 ||
        sum_limit->element_type() != ffi::DataType::S32 || x->element_type() != type) {
      return ffi::Error::InvalidArgument(
          "nj_asm_update_sum: sum_rows and sum_limit must be int32, x of the weights' dtype");
    }
    if (per(*sum_rows) * n_batch != static_cast<int64_t>(sum_rows->element_count()) ||
        static_cast<int64_t>(sum_limit->element_count()) != n_batch ||
        static_cast<int64_t>(x->element_count()) != n_batch * n_cols) {
      return ffi::Error::InvalidArgument("nj_asm_update_sum: batch sizes of the arguments differ");
    }
    sum = SumArgs{static_cast<const int32_t*>(sum_rows->untyped_data()),
                  static_cast<const int32_t*>(sum_limit->untyped_data()), per(*sum_rows)};
  }
  UpdateArgs a{static_cast<const int32_t*>(src_rows.untyped_data()),
               static_cast<const int32_t*>(cols.untyped_data()),
               static_cast<const int32_t*>(chosen.untyped_data()),
               static_cast<const int32_t*>(start.untyped_data()),
               static_cast<const int32_t*>(count.untyped_data()),
               static_cast<const int32_t*>(heb_rows.untyped_data()),
               static_cast<const int32_t*>(heb_cols.untyped_data()),
               per(src_rows),
               per(cols),
               per(cols) > 0 ? per(chosen) / per(cols) : 0,
               per(heb_rows),
               per(heb_cols)};
  if (type == ffi::DataType::F32) {
    Update<float>(static_cast<float*>(w_out.untyped_data()),
                  static_cast<const float*>(factor.untyped_data()), a, n_batch, n_rows, n_cols,
                  plastic != 0, sum, x ? static_cast<float*>(x->untyped_data()) : nullptr);
  } else {
    Update<double>(static_cast<double*>(w_out.untyped_data()),
                   static_cast<const double*>(factor.untyped_data()), a, n_batch, n_rows, n_cols,
                   plastic != 0, sum, x ? static_cast<double*>(x->untyped_data()) : nullptr);
  }
  return ffi::Error::Success();
}

ffi::Error UpdateImpl(ffi::AnyBuffer w_in, ffi::AnyBuffer src_rows, ffi::AnyBuffer cols,
                      ffi::AnyBuffer chosen, ffi::AnyBuffer start, ffi::AnyBuffer count,
                      ffi::AnyBuffer heb_rows, ffi::AnyBuffer heb_cols, ffi::AnyBuffer factor,
                      ffi::Result<ffi::AnyBuffer> w_out, int64_t plastic) {
  return RunUpdate(w_in, src_rows, cols, chosen, start, count, heb_rows, heb_cols, factor,
                   *w_out, plastic, nullptr, nullptr, nullptr);
}

ffi::Error UpdateSumImpl(ffi::AnyBuffer w_in, ffi::AnyBuffer src_rows, ffi::AnyBuffer cols,
                         ffi::AnyBuffer chosen, ffi::AnyBuffer start, ffi::AnyBuffer count,
                         ffi::AnyBuffer heb_rows, ffi::AnyBuffer heb_cols, ffi::AnyBuffer factor,
                         ffi::AnyBuffer sum_rows, ffi::AnyBuffer sum_limit,
                         ffi::Result<ffi::AnyBuffer> w_out, ffi::Result<ffi::AnyBuffer> x,
                         int64_t plastic) {
  return RunUpdate(w_in, src_rows, cols, chosen, start, count, heb_rows, heb_cols, factor,
                   *w_out, plastic, &sum_rows, &sum_limit, &(*x));
}


// nj_asm_choose: for each row r of each batch entry, m[b, r] distinct items of range(total[b])
// by Floyd's algorithm: for i = 0..m-1, j = total - m + i, draw t uniformly in [0, j] and keep
// t, or j if t is already kept. The draw of step i is the multiply-high
// floor(u * (j + 1) / 2**32) of the word u = words[b, slot[b, r], i], computed in 16-bit halves
// exactly as the pure-JAX path does (j + 1 < 2**16). chosen[b, r, i] holds the i-th kept item;
// entries from m onwards hold `total`.
// One row of nj_asm_choose: m distinct items of range(total) into kept[0..width), drawn with
// the words w[0..min(m, width)) (w == nullptr: no words, nothing drawn); `total` pads.
inline void FloydRow(const uint32_t* w, int32_t tot, int64_t m_r, int64_t width, int32_t* kept) {
  const int64_t n_draw = m_r < width ? m_r : width;
  for (int64_t i = 0; i < width; ++i) kept[i] = tot;
  if (n_draw <= 0 || w == nullptr) return;
  for (int64_t i = 0; i < n_draw; ++i) {
    int64_t j = static_cast<int64_t>(tot) - m_r + i;
    j = j < 0 ? 0 : j;
    const uint32_t span = static_cast<uint32_t>(j + 1);
    const uint32_t t = ((w[i] >> 16) * span + (((w[i] & 0xFFFFu) * span) >> 16)) >> 16;
    bool seen = false;
    for (int64_t q = 0; q < i; ++q) seen |= kept[q] == static_cast<int32_t>(t);
    kept[i] = seen ? static_cast<int32_t>(j) : static_cast<int32_t>(t);
  }
}

ffi::Error ChooseImpl(ffi::AnyBuffer words, ffi::AnyBuffer slot, ffi::AnyBuffer m,
                      ffi::AnyBuffer total, ffi::Result<ffi::AnyBuffer> chosen) {
  if (words.element_type() != ffi::DataType::U32 || slot.element_type() != ffi::DataType::S32 ||
      m.element_type() != ffi::DataType::S32 || total.element_type() != ffi::DataType::S32 ||
      chosen->element_type() != ffi::DataType::S32) {
    return ffi::Error::InvalidArgument(
        "nj_asm_choose: words must be uint32 and slot, m, total, chosen int32");
  }
  const int64_t n_batch = total.element_count();
  if (n_batch == 0) return ffi::Error::Success();
  const int64_t rows = m.element_count() / n_batch;
  const auto wdims = words.dimensions();
  const int64_t width = wdims.size() ? wdims[wdims.size() - 1] : 0;
  const int64_t n_words = width > 0 ? words.element_count() / (n_batch * width) : 0;
  if (rows * n_batch != static_cast<int64_t>(m.element_count()) ||
      static_cast<int64_t>(slot.element_count()) != n_batch * rows ||
      static_cast<int64_t>(words.element_count()) != n_batch * n_words * width ||
      static_cast<int64_t>(chosen->element_count()) != n_batch * rows * width) {
    return ffi::Error::InvalidArgument("nj_asm_choose: argument sizes do not match");
  }
  const auto* u = static_cast<const uint32_t*>(words.untyped_data());
  const auto* sl = static_cast<const int32_t*>(slot.untyped_data());
  const auto* mm = static_cast<const int32_t*>(m.untyped_data());
  const auto* tt = static_cast<const int32_t*>(total.untyped_data());
  auto* out = static_cast<int32_t*>(chosen->untyped_data());
  for (int64_t b = 0; b < n_batch; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t s = sl[b * rows + r];
      const bool has_words = s >= 0 && s < n_words;
      FloydRow(has_words ? u + (b * n_words + s) * width : nullptr, tt[b], mm[b * rows + r],
               width, out + (b * rows + r) * width);
    }
  }
  return ffi::Error::Success();
}

// nj_asm_topk: the k largest entries of each row of the concatenation [x1, x2] of x1
// (*batch, n1) and x2 (*batch, n2), and their indices in it, as jax.lax.top_k returns them:
// values in decreasing order, equal values by increasing index. The k-th largest value is
// found among the entries above -infinity only (in sparse mode the entries of neurons beyond
// the support are -infinity, often half the row or more), by a radix select in float32 and
// nth_element in float64 (KthLargest); if fewer than k entries are above -infinity, it is
// -infinity itself. The entries above the k-th value and then as
// many equal to it as fit are collected in index order, and only those k are sorted (float32:
// as 64-bit keys that hold the value's order in the high half and the index in the low
// half). Rows must not contain NaN (assembly inputs never do).

// An unsigned integer that orders as the float does (no NaN; -0 and +0 equal, as for `>`).
inline uint32_t OrderedBits(float v) {
  v = v == 0.0f ? 0.0f : v;
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename F, typename Value>
void SortPicks(const Value& value, std::vector<int32_t>& pick, std::vector<uint64_t>& keys) {
  if constexpr (std::is_same_v<F, float>) {
    // Ascending keys: decreasing value (inverted order bits), then increasing index.
    keys.resize(pick.size());
    for (size_t j = 0; j < pick.size(); ++j) {
      keys[j] = (static_cast<uint64_t>(~OrderedBits(value(pick[j]))) << 32) |
                static_cast<uint32_t>(pick[j]);
    }
    std::sort(keys.begin(), keys.end());
    for (size_t j = 0; j < pick.size(); ++j) {
      pick[j] = static_cast<int32_t>(keys[j] & 0xFFFFFFFFu);
    }
  } else {
    std::sort(pick.begin(), pick.end(), [&value](int32_t a, int32_t c) {
      const F va = value(a), vc = value(c);
      return va > vc || (va == vc && a < c);
    });
  }
}

// The k-th largest of the m values of buf (1 <= k <= m); buf is reordered.
inline double KthLargest(double* buf, int64_t m, int64_t k) {
  std::nth_element(buf, buf + (k - 1), buf + m, std::greater<double>());
  return buf[k - 1];
}

// float32: a radix select on the order bits, three digits of 11, 11 and 10 bits, each a
// histogram pass over the values still in play; no data-dependent branches in the passes
// (nth_element's comparisons mispredict about every other time).
inline float KthLargest(float* buf, int64_t m, int64_t k) {
  thread_local std::vector<uint32_t> keys_buf;
  std::vector<uint32_t>& keys = keys_buf;
  keys.resize(m);
  for (int64_t i = 0; i < m; ++i) keys[i] = OrderedBits(buf[i]);
  uint32_t prefix = 0;
  int64_t live = m;
  int64_t need = k;  // rank of the answer among the keys still in play
  int shift = 32;
  for (const int bits : {11, 11, 10}) {
    shift -= bits;
    const uint32_t mask = (1u << bits) - 1;
    uint32_t hist[2048] = {};
    for (int64_t i = 0; i < live; ++i) ++hist[(keys[i] >> shift) & mask];
    uint32_t digit = mask;
    for (;; --digit) {
      if (need <= hist[digit]) break;
      need -= hist[digit];
    }
    prefix |= digit << shift;
    // Keep the keys whose digits so far equal the answer's.
    int64_t kept = 0;
    for (int64_t i = 0; i < live; ++i) {
      keys[kept] = keys[i];
      kept += ((keys[i] >> shift) & mask) == digit;
    }
    live = kept;
  }
  // Back from order bits to the float (prefix is the answer's full key).
  const uint32_t u = (prefix & 0x80000000u) ? (prefix & 0x7FFFFFFFu) : ~prefix;
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// Scratch buffers of the k-cap, kept per thread between calls.
template <typename F>
struct TopKScratch {
  std::vector<F> buf;
  std::vector<int32_t> pick;
  std::vector<uint64_t> keys;
};

// The k-cap of one row [x1 (n1), x2 (n2)]: values and indices as nj_asm_topk defines them.
// The two parts are read where they are, without a concatenated copy.
template <typename F>
void TopKRow(const F* x1, int64_t n1, const F* x2, int64_t n2, int64_t k, F* values,
             int32_t* indices, TopKScratch<F>& s) {
  constexpr F kLow = -std::numeric_limits<F>::infinity();
  s.buf.resize(n1 + n2);
  int64_t m = 0;
  for (int64_t i = 0; i < n1; ++i) {
    s.buf[m] = x1[i];
    m += x1[i] > kLow;
  }
  for (int64_t i = 0; i < n2; ++i) {
    s.buf[m] = x2[i];
    m += x2[i] > kLow;
  }
  const F kth = m >= k ? KthLargest(s.buf.data(), m, k) : kLow;
  int64_t above = 0;
  for (int64_t i = 0; i < n1; ++i) above += x1[i] > kth;
  for (int64_t i = 0; i < n2; ++i) above += x2[i] > kth;
  // Everything above the k-th value, and the first k - above entries equal to it, collected
  // in index order until there are k.
  s.pick.resize(k);
  int32_t* pick = s.pick.data();
  int64_t out = 0, equal_left = k - above;
  const auto visit = [&](const F* x, int64_t len, int64_t base) {
    for (int64_t i = 0; i < len && out < k; ++i) {
      if (x[i] > kth) {
        pick[out++] = static_cast<int32_t>(base + i);
      } else if (x[i] == kth && equal_left > 0) {
        pick[out++] = static_cast<int32_t>(base + i);
        --equal_left;
      }
    }
  };
  visit(x1, n1, 0);
  visit(x2, n2, n1);
  // (Short only with NaN in the row, which is not allowed; then padded with index 0.)
  for (; out < k; ++out) pick[out] = 0;
  const auto value = [x1, x2, n1](int32_t i) { return i < n1 ? x1[i] : x2[i - n1]; };
  SortPicks<F>(value, s.pick, s.keys);
  for (int64_t j = 0; j < k; ++j) {
    indices[j] = s.pick[j];
    values[j] = value(s.pick[j]);
  }
}

template <typename F>
TopKScratch<F>& Scratch() {
  // (A local reference: each use of a thread_local of a shared library is a call.)
  thread_local TopKScratch<F> scratch;
  return scratch;
}

template <typename F>
void TopK(const F* x1, const F* x2, F* values, int32_t* indices, int64_t n_batch, int64_t n1,
          int64_t n2, int64_t k) {
  TopKScratch<F>& s = Scratch<F>();
  for (int64_t b = 0; b < n_batch; ++b) {
    TopKRow(x1 + b * n1, n1, x2 + b * n2, n2, k, values + b * k, indices + b * k, s);
  }
}

ffi::Error TopKImpl(ffi::AnyBuffer x1, ffi::AnyBuffer x2, ffi::Result<ffi::AnyBuffer> values,
                    ffi::Result<ffi::AnyBuffer> indices) {
  const auto type = x1.element_type();
  if ((type != ffi::DataType::F32 && type != ffi::DataType::F64) ||
      x2.element_type() != type || values->element_type() != type ||
      indices->element_type() != ffi::DataType::S32) {
    return ffi::Error::InvalidArgument("nj_asm_topk: x1, x2 must be float32 or float64");
  }
  const auto d1 = x1.dimensions();
  const auto d2 = x2.dimensions();
  const auto kdims = values->dimensions();
  if (d1.size() < 1 || d2.size() != d1.size() || kdims.size() != d1.size()) {
    return ffi::Error::InvalidArgument("nj_asm_topk: x1 and x2 must be (*batch, n)");
  }
  const int64_t n1 = d1[d1.size() - 1];
  const int64_t n2 = d2[d2.size() - 1];
  const int64_t k = kdims[kdims.size() - 1];
  const int64_t n_batch = static_cast<int64_t>(values->element_count()) / (k > 0 ? k : 1);
  if (k < 1 || k > n1 + n2 || static_cast<int64_t>(x1.element_count()) != n_batch * n1 ||
      static_cast<int64_t>(x2.element_count()) != n_batch * n2) {
    return ffi::Error::InvalidArgument("nj_asm_topk: needs 0 < k <= n1 + n2 and equal batches");
  }
  if (type == ffi::DataType::F32) {
    TopK<float>(static_cast<const float*>(x1.untyped_data()),
                static_cast<const float*>(x2.untyped_data()),
                static_cast<float*>(values->untyped_data()),
                static_cast<int32_t*>(indices->untyped_data()), n_batch, n1, n2, k);
  } else {
    TopK<double>(static_cast<const double*>(x1.untyped_data()),
                 static_cast<const double*>(x2.untyped_data()),
                 static_cast<double*>(values->untyped_data()),
                 static_cast<int32_t*>(indices->untyped_data()), n_batch, n1, n2, k);
  }
  return ffi::Error::Success();
}

// nj_asm_bits: words[b, i] = word i of JAX's Threefry sequence under the key key[b]
// (threefry.h). On CPU, JAX evaluates Threefry as a loop of five small XLA computations,
// which costs several microseconds per draw; here it is one call.
inline void ThreefryWords(uint32_t k0, uint32_t k1, uint32_t* out, int64_t n, int64_t first = 0) {
  nj_threefry::Words(k0, k1, out, n, first);
}

ffi::Error BitsImpl(ffi::AnyBuffer key, ffi::Result<ffi::AnyBuffer> words) {
  if (key.element_type() != ffi::DataType::U32 || words->element_type() != ffi::DataType::U32) {
    return ffi::Error::InvalidArgument("nj_asm_bits: key and words must be uint32");
  }
  const auto kd = key.dimensions();
  const auto wd = words->dimensions();
  if (kd.size() < 1 || kd[kd.size() - 1] != 2 || wd.size() != kd.size()) {
    return ffi::Error::InvalidArgument("nj_asm_bits: key must be (*batch, 2), words (*batch, n)");
  }
  const int64_t n_batch = static_cast<int64_t>(key.element_count()) / 2;
  const int64_t n = wd[wd.size() - 1];
  if (static_cast<int64_t>(words->element_count()) != n_batch * n || n >= (int64_t{1} << 32)) {
    return ffi::Error::InvalidArgument("nj_asm_bits: batch sizes differ or n >= 2**32");
  }
  const auto* k = static_cast<const uint32_t*>(key.untyped_data());
  auto* out = static_cast<uint32_t*>(words->untyped_data());
  for (int64_t b = 0; b < n_batch; ++b) ThreefryWords(k[2 * b], k[2 * b + 1], out + b * n, n);
  return ffi::Error::Success();
}

// nj_asm_choose_threefry: nj_asm_choose with the words of the threefry key key[b] (as
// nj_asm_bits draws them): row r's words are words (slot[b, r] * width) .. onwards of the
// sequence, which is the row slot[b, r] of jax.random.bits(key, (rows * width,)) reshaped to
// (rows, width). Only the words that Floyd's loop reads are computed (a converged step draws
// none), so the words of all `rows` rows are never materialised.
ffi::Error ChooseThreefryImpl(ffi::AnyBuffer key, ffi::AnyBuffer slot, ffi::AnyBuffer m,
                              ffi::AnyBuffer total, ffi::Result<ffi::AnyBuffer> chosen) {
  if (key.element_type() != ffi::DataType::U32 || slot.element_type() != ffi::DataType::S32 ||
      m.element_type() != ffi::DataType::S32 || total.element_type() != ffi::DataType::S32 ||
      chosen->element_type() != ffi::DataType::S32) {
    return ffi::Error::InvalidArgument(
        "nj_asm_choose_threefry: key must be uint32 and slot, m, total, chosen int32");
  }
  const int64_t n_batch = total.element_count();
  if (n_batch == 0) return ffi::Error::Success();
  const int64_t rows = m.element_count() / n_batch;
  const auto cdims = chosen->dimensions();
  const int64_t width = cdims.size() ? cdims[cdims.size() - 1] : 0;
  if (rows * n_batch != static_cast<int64_t>(m.element_count()) ||
      static_cast<int64_t>(slot.element_count()) != n_batch * rows ||
      static_cast<int64_t>(key.element_count()) != 2 * n_batch ||
      static_cast<int64_t>(chosen->element_count()) != n_batch * rows * width ||
      rows * width >= (int64_t{1} << 32)) {
    return ffi::Error::InvalidArgument("nj_asm_choose_threefry: argument sizes do not match");
  }
  const auto* kd = static_cast<const uint32_t*>(key.untyped_data());
  const auto* sl = static_cast<const int32_t*>(slot.untyped_data());
  const auto* mm = static_cast<const int32_t*>(m.untyped_data());
  const auto* tt = static_cast<const int32_t*>(total.untyped_data());
  auto* out = static_cast<int32_t*>(chosen->untyped_data());
  thread_local std::vector<uint32_t> words_buf;
  std::vector<uint32_t>& words = words_buf;
  words.resize(width);
  for (int64_t b = 0; b < n_batch; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t m_r = mm[b * rows + r];
      const int64_t s = sl[b * rows + r];
      const int64_t n_draw = std::min<int64_t>(std::max<int64_t>(m_r, 0), width);
      const bool has_words = n_draw > 0 && s >= 0 && s < rows;
      if (has_words) ThreefryWords(kd[2 * b], kd[2 * b + 1], words.data(), n_draw, s * width);
      FloydRow(has_words ? words.data() : nullptr, tt[b], m_r, width,
               out + (b * rows + r) * width);
    }
  }
  return ffi::Error::Success();
}

// nj_asm_cap: the k-cap of a sparse-mode target and what the step needs from it, in one call.
// Per batch entry, with x (cap) the inputs of the support (-inf beyond it), cand (k) the
// never-fired candidates' inputs, w the support, fixed whether the assembly is frozen and
// old (k) the winners before the step:
//   (values, idx) = the k-cap of [x, cand] (nj_asm_topk);
//   a winner j is new when idx[j] >= cap and the area is not fixed; the new ones are labelled
//   w, w + 1, ... in list order; win[j] = old[j] if fixed, else its label (idx[j] otherwise);
//   m[j] = int(values[j]) for a new winner, else 0 (its input, which Floyd's choice splits);
//   cols[j] = its label for a new winner, else cap (a column the update skips);
//   slot[j] = the number of j' < j with m[j'] > 0 where m[j] > 0, else 0 (its row of words);
//   info = (new winners, winners with m > 0, overlap of win with old, largest m).
// The overlap counts the entries of win (>= 0) also in old, as Brain._overlap does.
template <typename F>
void Cap(const F* x, const F* cand, const int32_t* support, const bool* fixed,
         const int32_t* old, int32_t* win, int32_t* m, int32_t* cols, int32_t* slot,
         int32_t* info, int64_t n_batch, int64_t cap, int64_t k) {
  TopKScratch<F>& s = Scratch<F>();
  thread_local std::vector<F> values_buf;
  thread_local std::vector<int32_t> idx_buf;
  thread_local std::vector<uint8_t> mark_buf;
  std::vector<F>& values = values_buf;
  std::vector<int32_t>& idx = idx_buf;
  std::vector<uint8_t>& mark = mark_buf;  // all zeros between uses
  values.resize(k);
  idx.resize(k);
  if (static_cast<int64_t>(mark.size()) < cap) mark.resize(cap, 0);
  for (int64_t b = 0; b < n_batch; ++b) {
    TopKRow(x + b * cap, cap, cand + b * k, k, k, values.data(), idx.data(), s);
    const int64_t w = support[b];
    const bool frozen = fixed[b];
    const int32_t* ob = old + b * k;
    int32_t* wb = win + b * k;
    int32_t* mb = m + b * k;
    int32_t* cb = cols + b * k;
    int32_t* sb = slot + b * k;
    int32_t n_new = 0, n_need = 0, largest = 0;
    for (int64_t j = 0; j < k; ++j) {
      const bool is_new = idx[j] >= cap && !frozen;
      const int64_t label = is_new ? w + n_new : idx[j];
      wb[j] = frozen ? ob[j] : static_cast<int32_t>(label);
      mb[j] = is_new ? static_cast<int32_t>(values[j]) : 0;
      cb[j] = is_new ? static_cast<int32_t>(label) : static_cast<int32_t>(cap);
      sb[j] = mb[j] > 0 ? n_need : 0;
      n_need += mb[j] > 0;
      n_new += is_new;
      largest = std::max(largest, mb[j]);
    }
    int32_t overlap = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (ob[j] >= 0 && ob[j] < cap) mark[ob[j]] = 1;
    }
    for (int64_t j = 0; j < k; ++j) overlap += wb[j] >= 0 && wb[j] < cap && mark[wb[j]];
    for (int64_t j = 0; j < k; ++j) {
      if (ob[j] >= 0 && ob[j] < cap) mark[ob[j]] = 0;
    }
    info[4 * b] = n_new;
    info[4 * b + 1] = n_need;
    info[4 * b + 2] = overlap;
    info[4 * b + 3] = largest;
  }
}

ffi::Error CapImpl(ffi::AnyBuffer x, ffi::AnyBuffer cand, ffi::AnyBuffer support,
                   ffi::AnyBuffer fixed, ffi::AnyBuffer old, ffi::Result<ffi::AnyBuffer> win,
                   ffi::Result<ffi::AnyBuffer> m, ffi::Result<ffi::AnyBuffer> cols,
                   ffi::Result<ffi::AnyBuffer> slot, ffi::Result<ffi::AnyBuffer> info) {
  const auto type = x.element_type();
  if ((type != ffi::DataType::F32 && type != ffi::DataType::F64) || cand.element_type() != type) {
    return ffi::Error::InvalidArgument("nj_asm_cap: x and cand must be float32 or float64");
  }
  if (support.element_type() != ffi::DataType::S32 ||
      fixed.element_type() != ffi::DataType::PRED || old.element_type() != ffi::DataType::S32) {
    return ffi::Error::InvalidArgument("nj_asm_cap: support and old must be int32, fixed bool");
  }
  for (auto* out : {&win, &m, &cols, &slot, &info}) {
    if ((*out)->element_type() != ffi::DataType::S32) {
      return ffi::Error::InvalidArgument("nj_asm_cap: results must be int32");
    }
  }
  const auto xd = x.dimensions();
  const auto cd = cand.dimensions();
  if (xd.size() < 1 || cd.size() != xd.size()) {
    return ffi::Error::InvalidArgument("nj_asm_cap: x and cand must be (*batch, n)");
  }
  const int64_t cap = xd[xd.size() - 1];
  const int64_t k = cd[cd.size() - 1];
  const int64_t n_batch = cap > 0 ? static_cast<int64_t>(x.element_count()) / cap : 0;
  const auto count = [](const ffi::AnyBuffer& a) {
    return static_cast<int64_t>(a.element_count());
  };
  if (k < 1 || cap < 1 || cap + k >= (int64_t{1} << 31) || count(cand) != n_batch * k ||
      count(support) != n_batch || count(fixed) != n_batch || count(old) != n_batch * k ||
      count(*win) != n_batch * k || count(*m) != n_batch * k || count(*cols) != n_batch * k ||
      count(*slot) != n_batch * k || count(*info) != n_batch * 4) {
    return ffi::Error::InvalidArgument("nj_asm_cap: sizes or batch sizes of the arguments differ");
  }
  const auto* sup = static_cast<const int32_t*>(support.untyped_data());
  const auto* fix = static_cast<const bool*>(fixed.untyped_data());
  const auto* o = static_cast<const int32_t*>(old.untyped_data());
  auto* wp = static_cast<int32_t*>(win->untyped_data());
  auto* mp = static_cast<int32_t*>(m->untyped_data());
  auto* cp = static_cast<int32_t*>(cols->untyped_data());
  auto* sp = static_cast<int32_t*>(slot->untyped_data());
  auto* ip = static_cast<int32_t*>(info->untyped_data());
  if (type == ffi::DataType::F32) {
    Cap<float>(static_cast<const float*>(x.untyped_data()),
               static_cast<const float*>(cand.untyped_data()), sup, fix, o, wp, mp, cp, sp, ip,
               n_batch, cap, k);
  } else {
    Cap<double>(static_cast<const double*>(x.untyped_data()),
                static_cast<const double*>(cand.untyped_data()), sup, fix, o, wp, mp, cp, sp, ip,
                n_batch, cap, k);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjAsmRowSum, nj_ffi::Ordered<RowSumImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // weights (*batch, R, C)
                                  .Arg<ffi::AnyBuffer>()  // rows (*batch, k) int32
                                  .Arg<ffi::AnyBuffer>()  // limit (*batch,) int32
                                  .Ret<ffi::AnyBuffer>());  // x (*batch, C)

namespace {

// The nine arguments that nj_asm_update and nj_asm_update_sum share.
auto UpdateBinding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::AnyBuffer>()   // weights (*batch, R, C)
      .Arg<ffi::AnyBuffer>()   // src_rows (*batch, ks)
      .Arg<ffi::AnyBuffer>()   // cols (*batch, kc)
      .Arg<ffi::AnyBuffer>()   // chosen (*batch, kc, width)
      .Arg<ffi::AnyBuffer>()   // start (*batch,)
      .Arg<ffi::AnyBuffer>()   // count (*batch,)
      .Arg<ffi::AnyBuffer>()   // heb_rows (*batch, kr)
      .Arg<ffi::AnyBuffer>()   // heb_cols (*batch, kt)
      .Arg<ffi::AnyBuffer>();  // factor (*batch,)
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjAsmUpdate, nj_ffi::Ordered<UpdateImpl>,
                              UpdateBinding()
                                  .Ret<ffi::AnyBuffer>()  // weights (aliased)
                                  .Attr<int64_t>("plastic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjAsmUpdateSum, nj_ffi::Ordered<UpdateSumImpl>,
                              UpdateBinding()
                                  .Arg<ffi::AnyBuffer>()  // sum_rows (*batch, kq)
                                  .Arg<ffi::AnyBuffer>()  // sum_limit (*batch,)
                                  .Ret<ffi::AnyBuffer>()  // weights (aliased)
                                  .Ret<ffi::AnyBuffer>()  // x (*batch, C)
                                  .Attr<int64_t>("plastic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjAsmChoose, nj_ffi::Ordered<ChooseImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // words (*batch, n_words, width) u32
                                  .Arg<ffi::AnyBuffer>()  // slot (*batch, rows) int32
                                  .Arg<ffi::AnyBuffer>()  // m (*batch, rows) int32
                                  .Arg<ffi::AnyBuffer>()  // total (*batch,) int32
                                  .Ret<ffi::AnyBuffer>());  // chosen (*batch, rows, width)

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjAsmChooseThreefry, nj_ffi::Ordered<ChooseThreefryImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // key (*batch, 2) u32
                                  .Arg<ffi::AnyBuffer>()  // slot (*batch, rows) int32
                                  .Arg<ffi::AnyBuffer>()  // m (*batch, rows) int32
                                  .Arg<ffi::AnyBuffer>()  // total (*batch,) int32
                                  .Ret<ffi::AnyBuffer>());  // chosen (*batch, rows, width)

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjAsmTopK, nj_ffi::Ordered<TopKImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // x1 (*batch, n1)
                                  .Arg<ffi::AnyBuffer>()   // x2 (*batch, n2)
                                  .Ret<ffi::AnyBuffer>()   // values (*batch, k)
                                  .Ret<ffi::AnyBuffer>());  // indices (*batch, k) int32

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjAsmBits, nj_ffi::Ordered<BitsImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()    // key (*batch, 2) uint32
                                  .Ret<ffi::AnyBuffer>());  // words (*batch, n) uint32

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjAsmCap, nj_ffi::Ordered<CapImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // x (*batch, cap)
                                  .Arg<ffi::AnyBuffer>()   // cand (*batch, k)
                                  .Arg<ffi::AnyBuffer>()   // support (*batch,) int32
                                  .Arg<ffi::AnyBuffer>()   // fixed (*batch,) bool
                                  .Arg<ffi::AnyBuffer>()   // old winners (*batch, k) int32
                                  .Ret<ffi::AnyBuffer>()   // win (*batch, k) int32
                                  .Ret<ffi::AnyBuffer>()   // m (*batch, k) int32
                                  .Ret<ffi::AnyBuffer>()   // cols (*batch, k) int32
                                  .Ret<ffi::AnyBuffer>()   // slot (*batch, k) int32
                                  .Ret<ffi::AnyBuffer>());  // info (*batch, 4) int32
