// Trace-rule plasticity of one plastic projection (neurojax.network._plastic), in place: the
// compiled CPU kernel of the rules whose `trace_kernel()` is not None (nj.TripletSTDP, both
// pairings, and nj.VogelsSTDP). Pair STDP has its own kernel (nj_stdp_update, csr_deliver.cc).
//
// A rule of this family keeps one or two traces per presynaptic neuron and per postsynaptic
// neuron, each decaying by a constant factor per step and taking each spike by +s
// (all-to-all) or by a reset to 1 (`nearest`), and changes a synapse's weight only at its
// events. One step of trial b, in the order of neurojax.plasticity._base (the pure-JAX event
// path computes the same operations in the same order):
//
//   1. each arriving presynaptic neuron i (s_arr[b, i] != 0): every synapse k of its CSR row
//      takes the rule's on_pre with the traces decayed to the step's end, the presynaptic
//      ones before this step's arrivals and the postsynaptic ones before this step's spikes;
//   2. the presynaptic traces take this step's arrivals;
//   3. each spiking postsynaptic neuron j (s_post[b, j] != 0): every synapse of its CSC column
//      (col_syn, col_pre) takes the rule's on_post with the presynaptic traces after this
//      step's arrivals and the postsynaptic traces decayed, before this step's spikes;
//   4. the postsynaptic traces take this step's spikes.
//
// The rule's events, by `kind` (each clipped to [w_min, w_max] afterwards, as jnp.clip):
//   kind 0, triplet (Pfister and Gerstner 2006), traces (r1, r2) and (o1, o2):
//     on_pre  w <- w - o1[j] * (a_pre + b_pre * r2[i]) * s
//     on_post w <- w + r1[i] * (a_post + b_post * o2[j]) * s
//   kind 1, Vogels et al. (2011), one trace x per side:
//     on_pre  w <- w + a_pre * (x[j] - b_pre) * s
//     on_post w <- w + a_post * x[i] * s
// where s is the event's spike value and the products associate left to right, as in the
// rules' Python (`TripletSTDP.on_pre` and so on). The per-row and per-column factors
// (a_pre + b_pre * r2[i], a_post + b_post * o2[j]) are the same values the pure-JAX path
// computes per synapse.
//
// Arguments: weights (*batch, nnz), pre traces p0, p1 (*batch, n_pre), post traces q0, q1
// (*batch, n_post) of the previous step (p1 and q1 empty, zero elements, for a rule with one
// trace per side), s_arr (*batch, arr_stride), s_post (*batch, post_stride), params (10,) =
// (a_pre, b_pre, a_post, b_post, w_min, w_max, decay_p0, decay_p1, decay_q0, decay_q1),
// indptr (n_pre + 1,), indices (nnz,), col_ptr (n_post + 1,), col_syn (nnz,), col_pre (nnz,)
// int32. The arrivals of trial b are s_arr[b, arr_offset : arr_offset + n_pre] and its
// postsynaptic spikes s_post[b, post_offset : post_offset + n_post] (the spike vectors of a
// whole group of populations, read in place). Results: weights, p0, p1, q0, q1, aliased to
// the inputs.
//
// Every row and column of this step's spikes is checked against the arrays before any weight
// is written (as nj_stdp_update does): a corrupted index array gives an FFI error naming the
// count, never a read or write outside the buffers.

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "common.h"
#include "pool.h"
#include "spike_events.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

namespace ffi = xla::ffi;
using nj_events::AnyBits;
using nj_events::Clip;
using nj_events::ColumnOk;
using nj_events::kLanes;
using nj_events::RowOk;

namespace {

enum Kind : int64_t { kTriplet = 0, kVogels = 1 };


#if defined(__AVX__)
// The lanes of the 32-byte vector at s that hold a spike, as the low bits of an int: s != 0
// (unordered compare, true for NaN as C++'s !=), or with kPositive s > 0 (ordered, false for
// NaN as C++'s >).
template <typename F, bool kPositive>
inline unsigned SpikeMask(const F* s) {
  constexpr int kCmp = kPositive ? _CMP_GT_OQ : _CMP_NEQ_UQ;
  if constexpr (sizeof(F) == 4) {
    const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(s));
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), kCmp)));
  } else {
    const __m256d v = _mm256_loadu_pd(reinterpret_cast<const double*>(s));
    return static_cast<unsigned>(
        _mm256_movemask_pd(_mm256_cmp_pd(v, _mm256_setzero_pd(), kCmp)));
  }
}
#endif

// Writes the positions i of this step's spikes, ascending, to `list` and returns their number:
// s[i] != 0 or, with kPositive, s[i] > 0 or t[i] > 0 (t may be null). A block whose bits are
// all zero holds no spike: blocks of eight 32-byte vectors are tested with one OR and skipped
// together (a step of a network at tens of Hz leaves most of them empty), then the pairs of
// vectors of the others (AnyBits), and the entries left one by one.
template <typename F, typename Bits, bool kPositive>
int64_t ListSpikes(const F* s, const F* t, int64_t n, int32_t* list) {
  typedef Bits VB __attribute__((vector_size(32)));
  constexpr int64_t kL = kLanes<F>;
  constexpr int64_t kBlock = 8 * kL;
  const auto spike = [s, t](int64_t j) {
    if constexpr (kPositive) {
      return s[j] > F(0) || (t != nullptr && t[j] > F(0));
    } else {
      return s[j] != F(0);
    }
  };
  int64_t count = 0, i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    VB o = VB{};
    for (int64_t v = 0; v < 8; ++v) {
      VB a;
      std::memcpy(&a, s + i + v * kL, 32);
      o |= a;
    }
    if (kPositive && t != nullptr) {
      for (int64_t v = 0; v < 8; ++v) {
        VB a;
        std::memcpy(&a, t + i + v * kL, 32);
        o |= a;
      }
    }
    uint64_t bits[4];
    std::memcpy(bits, &o, 32);
    if ((bits[0] | bits[1] | bits[2] | bits[3]) == 0) continue;
#if defined(__AVX__)
    // One compare and a bit mask per vector; the set bits, lowest first, are the spikes.
    for (int64_t h = i; h < i + kBlock; h += kL) {
      unsigned mask = SpikeMask<F, kPositive>(s + h);
      if (kPositive && t != nullptr) mask |= SpikeMask<F, kPositive>(t + h);
      while (mask) {
        list[count++] = static_cast<int32_t>(h + __builtin_ctz(mask));
        mask &= mask - 1;
      }
    }
#else
    for (int64_t h = i; h < i + kBlock; h += 2 * kL) {
      if (!AnyBits<F, Bits>(s + h) &&
          (!kPositive || t == nullptr || !AnyBits<F, Bits>(t + h))) {
        continue;
      }
      for (int64_t j = h; j < h + 2 * kL; ++j) {
        if (spike(j)) list[count++] = static_cast<int32_t>(j);
      }
    }
#endif
  }
  for (; i < n; ++i) {
    if (spike(i)) list[count++] = static_cast<int32_t>(i);
  }
  return count;
}

// One pass over a trace: tr[i] <- tr[i] * decay, then + s[i] (all-to-all) or 1 where
// s[i] > 0 (nearest), the operations of the rules' update_*_traces. Vectorised by hand on
// 32-byte vectors so that it costs a few cycles per 8 or 16 neurons.
template <typename F>
void AdvanceTrace(F* __restrict tr, const F* __restrict s, int64_t n, F decay, bool nearest) {
  typedef F VF __attribute__((vector_size(32)));
  constexpr int64_t kL = kLanes<F>;
  const VF one = VF{} + F(1), zero = VF{};
  int64_t i = 0;
  for (; i + kL <= n; i += kL) {
    VF sv, tv;
    std::memcpy(&sv, s + i, 32);
    std::memcpy(&tv, tr + i, 32);
    const VF d = tv * decay;
    tv = nearest ? (sv > zero ? one : d) : d + sv;
    std::memcpy(tr + i, &tv, 32);
  }
  for (; i < n; ++i) {
    const F d = tr[i] * decay;
    tr[i] = nearest ? (s[i] > F(0) ? F(1) : d) : d + s[i];
  }
}


struct Params {
  // The rule's amplitudes, bounds and trace decays (see the file's comment).
  double a_pre, b_pre, a_post, b_post, lo, hi, dp0, dp1, dq0, dq1;
};

// The on_pre events of the synapses [begin, end) of one arriving row: a function of its own
// with restrict pointers and the kind as a template parameter, so that the compiler
// vectorises it (gathering the postsynaptic traces).
template <typename F, Kind kKind>
void PreRow(F* __restrict w, const F* __restrict q0, const int32_t* __restrict post,
            int32_t begin, int32_t end, F row_factor, F a_pre, F b_pre, F dq0, F s, F lo, F hi) {
  for (int32_t k = begin; k < end; ++k) {
    const F v = w[k];
    const F q = q0[post[k]] * dq0;
    if constexpr (kKind == kTriplet) {
      w[k] = Clip<F>(v - q * row_factor * s, lo, hi);
    } else {
      w[k] = Clip<F>(v + a_pre * (q - b_pre) * s, lo, hi);
    }
  }
}

// The on_post events of the synapses of one spiking column j (spike value s), with the
// presynaptic traces after this step's arrivals and the postsynaptic trace q1 before this
// step's spikes.
template <typename F, Kind kKind>
inline void OnPostColumn(F* wb, const F* p0b, const F* q1b, const int32_t* col_ptr,
                         const int32_t* col_syn, const int32_t* col_pre, int32_t j, F s,
                         F a_post, F b_post, F dq1, F lo, F hi) {
  constexpr bool kTwo = kKind == kTriplet;
  F col_factor = a_post;
  if constexpr (kTwo) col_factor = a_post + b_post * (q1b[j] * dq1);
  const int32_t end = col_ptr[j + 1];
  for (int32_t m = col_ptr[j]; m < end; ++m) {
    if (m + 8 < end) __builtin_prefetch(wb + col_syn[m + 8], 1);
    const int32_t k = col_syn[m];
    const F v = wb[k];
    const F x = p0b[col_pre[m]];
    if constexpr (kTwo) {
      wb[k] = Clip<F>(v + x * col_factor * s, lo, hi);
    } else {
      wb[k] = Clip<F>(v + col_factor * x * s, lo, hi);
    }
  }
}

// Returns the number of rows and columns found corrupted (0: the update ran in full).
template <typename F, typename Bits, Kind kKind>
int64_t TraceRule(F* w, F* p0, F* p1, F* q0, F* q1, const F* s_arr, const F* s_post,
                  const Params& prm, const int32_t* indptr, const int32_t* post,
                  const int32_t* col_ptr, const int32_t* col_syn, const int32_t* col_pre,
                  int64_t nnz, int64_t n_pre, int64_t n_post, int64_t n_trials,
                  int64_t arr_stride, int64_t post_stride, bool nearest) {
  const F a_pre = static_cast<F>(prm.a_pre), b_pre = static_cast<F>(prm.b_pre);
  const F a_post = static_cast<F>(prm.a_post), b_post = static_cast<F>(prm.b_post);
  const F lo = static_cast<F>(prm.lo), hi = static_cast<F>(prm.hi);
  const F dp0 = static_cast<F>(prm.dp0), dp1 = static_cast<F>(prm.dp1);
  const F dq0 = static_cast<F>(prm.dq0), dq1 = static_cast<F>(prm.dq1);
  constexpr bool kTwo = kKind == kTriplet;  // two traces per side
  // The spike lists, kept per thread between calls (allocating them every step would cost
  // as much as the scans).
  thread_local std::vector<int32_t> arrived, fired;
  if (arrived.size() < static_cast<size_t>(n_pre)) arrived.resize(n_pre);
  if (fired.size() < static_cast<size_t>(n_post)) fired.resize(n_post);
  for (int64_t b = 0; b < n_trials; ++b) {
    F* wb = w + b * nnz;
    F* p0b = p0 + b * n_pre;
    F* q0b = q0 + b * n_post;
    F* p1b = kTwo ? p1 + b * n_pre : nullptr;
    F* q1b = kTwo ? q1 + b * n_post : nullptr;
    const F* ab = s_arr + b * arr_stride;
    const F* pb = s_post + b * post_stride;
    const int64_t n_arr = ListSpikes<F, Bits, false>(ab, nullptr, n_pre, arrived.data());
    const int64_t n_fired = ListSpikes<F, Bits, false>(pb, nullptr, n_post, fired.data());
    // Every synapse lies in one row and one column: the rows of this step's arrivals, then
    // the columns of its spikes, can be shared between threads (pool.h), each thread
    // updating the synapses of its own rows (columns) with the serial operations in the
    // serial order, so the weights are bit for bit the same with any number of threads.
    if (nj_pool::Threads() > 1) {
      const int32_t* arr_list = arrived.data();
      const int32_t* fired_list = fired.data();
      int64_t work = 0;
      for (int64_t q = 0; q < n_arr; ++q) {
        const int64_t len = static_cast<int64_t>(indptr[arr_list[q] + 1]) - indptr[arr_list[q]];
        work += len > 0 ? len : 0;
      }
      for (int64_t q = 0; q < n_fired; ++q) {
        const int64_t len =
            static_cast<int64_t>(col_ptr[fired_list[q] + 1]) - col_ptr[fired_list[q]];
        work += len > 0 ? len : 0;
      }
      const int n = nj_pool::Worth(work, 3);
      if (n > 1) {
        const int64_t t0 = nj_pool::NowNs();
        std::vector<int64_t> faults(n, 0);
        auto check = [&](int t) {
          int64_t q0, q1;
          nj_pool::Split(n_arr, t, n, q0, q1);
          for (int64_t q = q0; q < q1; ++q) {
            faults[t] += !RowOk(indptr, post, arr_list[q], nnz, n_post);
          }
          nj_pool::Split(n_fired, t, n, q0, q1);
          for (int64_t q = q0; q < q1; ++q) {
            faults[t] += !ColumnOk(col_ptr, col_syn, col_pre, fired_list[q], nnz, n_pre);
          }
        };
        nj_pool::RunParts(n, check);
        int64_t bad = 0;
        for (int64_t f : faults) bad += f;
        if (bad) return bad;
        auto on_pre = [&](int t) {
          int64_t q0, q1;
          nj_pool::Split(n_arr, t, n, q0, q1);
          for (int64_t q = q0; q < q1; ++q) {
            const int32_t i = arr_list[q];
            F row_factor = F(0);
            if constexpr (kTwo) row_factor = a_pre + b_pre * (p1b[i] * dp1);
            PreRow<F, kKind>(wb, q0b, post, indptr[i], indptr[i + 1], row_factor, a_pre, b_pre,
                             dq0, ab[i], lo, hi);
          }
        };
        nj_pool::RunParts(n, on_pre);
        AdvanceTrace<F>(p0b, ab, n_pre, dp0, nearest);
        if constexpr (kTwo) AdvanceTrace<F>(p1b, ab, n_pre, dp1, nearest);
        auto on_post = [&](int t) {
          int64_t q0, q1;
          nj_pool::Split(n_fired, t, n, q0, q1);
          for (int64_t q = q0; q < q1; ++q) {
            const int32_t j = fired_list[q];
            OnPostColumn<F, kKind>(wb, p0b, q1b, col_ptr, col_syn, col_pre, j, pb[j], a_post,
                                   b_post, dq1, lo, hi);
          }
        };
        nj_pool::RunParts(n, on_post);
        AdvanceTrace<F>(q0b, pb, n_post, dq0, nearest);
        if constexpr (kTwo) AdvanceTrace<F>(q1b, pb, n_post, dq1, nearest);
        nj_pool::RecordShared(work, n, nj_pool::NowNs() - t0);
        continue;
      }
    }
    // Every index of this step's rows and columns is checked before anything is written;
    // the rows' and columns' lines are asked for at the same time, so that their cache
    // misses overlap.
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
    if (bad) return bad;  // nothing written; the call reports an error
    // 1. on_pre with the presynaptic traces before this step's arrivals.
    for (int64_t q = 0; q < n_arr; ++q) {
      const int32_t i = arrived[q];
      const F s = ab[i];
      F row_factor = F(0);
      if constexpr (kTwo) row_factor = a_pre + b_pre * (p1b[i] * dp1);
      PreRow<F, kKind>(wb, q0b, post, indptr[i], indptr[i + 1], row_factor, a_pre, b_pre, dq0,
                       s, lo, hi);
    }
    // 2. the presynaptic traces take the arrivals.
    AdvanceTrace<F>(p0b, ab, n_pre, dp0, nearest);
    if constexpr (kTwo) AdvanceTrace<F>(p1b, ab, n_pre, dp1, nearest);
    // 3. on_post with the new presynaptic traces and the postsynaptic traces before this
    // step's spikes.
    for (int64_t q = 0; q < n_fired; ++q) {
      const int32_t j = fired[q];
      OnPostColumn<F, kKind>(wb, p0b, q1b, col_ptr, col_syn, col_pre, j, pb[j], a_post, b_post,
                             dq1, lo, hi);
    }
    // 4. the postsynaptic traces take the spikes.
    AdvanceTrace<F>(q0b, pb, n_post, dq0, nearest);
    if constexpr (kTwo) AdvanceTrace<F>(q1b, pb, n_post, dq1, nearest);
  }
  return 0;
}

ffi::Error TraceImpl(ffi::AnyBuffer w_in, ffi::AnyBuffer p0_in, ffi::AnyBuffer p1_in,
                     ffi::AnyBuffer q0_in, ffi::AnyBuffer q1_in, ffi::AnyBuffer s_arr,
                     ffi::AnyBuffer s_post, ffi::AnyBuffer params, ffi::AnyBuffer indptr,
                     ffi::AnyBuffer post, ffi::AnyBuffer col_ptr, ffi::AnyBuffer col_syn,
                     ffi::AnyBuffer col_pre, ffi::Result<ffi::AnyBuffer> w_out,
                     ffi::Result<ffi::AnyBuffer> p0_out, ffi::Result<ffi::AnyBuffer> p1_out,
                     ffi::Result<ffi::AnyBuffer> q0_out, ffi::Result<ffi::AnyBuffer> q1_out,
                     int64_t kind, int64_t n_pre, int64_t n_post, int64_t arr_stride,
                     int64_t arr_offset, int64_t post_stride, int64_t post_offset,
                     int64_t nearest) {
  const auto type = w_in.element_type();
  if (type != ffi::DataType::F32 && type != ffi::DataType::F64) {
    return ffi::Error::InvalidArgument("nj_trace_update: float32 or float64 expected");
  }
  for (const ffi::AnyBuffer* buf : {&p0_in, &p1_in, &q0_in, &q1_in, &s_arr, &s_post, &params}) {
    if (buf->element_type() != type) {
      return ffi::Error::InvalidArgument("nj_trace_update: float buffers must share one dtype");
    }
  }
  for (const ffi::AnyBuffer* buf : {&indptr, &post, &col_ptr, &col_syn, &col_pre}) {
    if (buf->element_type() != ffi::DataType::S32) {
      return ffi::Error::InvalidArgument("nj_trace_update: index buffers must be int32");
    }
  }
  if (kind != kTriplet && kind != kVogels) {
    return ffi::Error::InvalidArgument("nj_trace_update: kind must be 0 (triplet) or 1 (vogels), "
                                       "got " + std::to_string(kind));
  }
  const auto count = [](const ffi::AnyBuffer& b) {
    return static_cast<int64_t>(b.element_count());
  };
  const int64_t nnz = count(post);
  // Trials from the first presynaptic trace (a projection may have no synapse at all; its
  // traces still advance).
  const int64_t n_trials = n_pre > 0 ? count(p0_in) / n_pre : 0;
  const int64_t second_pre = kind == kTriplet ? n_trials * n_pre : 0;
  const int64_t second_post = kind == kTriplet ? n_trials * n_post : 0;
  if (n_pre < 0 || n_post < 0 || count(params) != 10 || count(p0_in) != n_trials * n_pre ||
      count(p1_in) != second_pre ||
      (n_trials > 0 && (count(q0_in) != n_trials * n_post || count(q1_in) != second_post ||
                        count(w_in) != n_trials * nnz)) ||
      count(indptr) != n_pre + 1 || count(col_ptr) != n_post + 1 || count(col_syn) != nnz ||
      count(col_pre) != nnz) {
    return ffi::Error::InvalidArgument(
        "nj_trace_update: weights, traces, parameters or index arrays do not match n_pre, "
        "n_post, nnz and the rule's kind");
  }
  if (arr_offset < 0 || arr_offset + n_pre > arr_stride || post_offset < 0 ||
      post_offset + n_post > post_stride || count(s_arr) != n_trials * arr_stride ||
      count(s_post) != n_trials * post_stride) {
    return ffi::Error::InvalidArgument(
        "nj_trace_update: spike vectors do not match the trials, strides and offsets");
  }
  const std::pair<ffi::AnyBuffer*, const ffi::AnyBuffer*> pairs[] = {
      {&*w_out, &w_in}, {&*p0_out, &p0_in}, {&*p1_out, &p1_in}, {&*q0_out, &q0_in},
      {&*q1_out, &q1_in}};
  for (const auto& [out, in] : pairs) {
    if (out->untyped_data() != in->untyped_data() && in->size_bytes() > 0) {
      std::memcpy(out->untyped_data(), in->untyped_data(), in->size_bytes());
    }
  }
  const auto i32 = [](const ffi::AnyBuffer& b) {
    return static_cast<const int32_t*>(b.untyped_data());
  };
  int64_t bad = 0;
  const auto run = [&](auto zero, auto bits) {
    using F = decltype(zero);
    using B = decltype(bits);
    const F* pr = static_cast<const F*>(params.untyped_data());
    const Params prm{pr[0], pr[1], pr[2], pr[3], pr[4], pr[5], pr[6], pr[7], pr[8], pr[9]};
    F* outs[5];
    ffi::AnyBuffer* bufs[5] = {&*w_out, &*p0_out, &*p1_out, &*q0_out, &*q1_out};
    for (int q = 0; q < 5; ++q) outs[q] = static_cast<F*>(bufs[q]->untyped_data());
    const F* sa = static_cast<const F*>(s_arr.untyped_data()) + arr_offset;
    const F* sp = static_cast<const F*>(s_post.untyped_data()) + post_offset;
    const auto go = [&](auto kind_tag) {
      constexpr Kind kK = decltype(kind_tag)::value;
      bad = TraceRule<F, B, kK>(outs[0], outs[1], outs[2], outs[3], outs[4], sa, sp, prm,
                                i32(indptr), i32(post), i32(col_ptr), i32(col_syn),
                                i32(col_pre), nnz, n_pre, n_post, n_trials, arr_stride,
                                post_stride, nearest != 0);
    };
    if (kind == kTriplet) {
      go(std::integral_constant<Kind, kTriplet>{});
    } else {
      go(std::integral_constant<Kind, kVogels>{});
    }
  };
  if (type == ffi::DataType::F32) {
    run(0.0f, uint32_t{0});
  } else {
    run(0.0, uint64_t{0});
  }
  if (bad) {
    return ffi::Error::InvalidArgument(
        "nj_trace_update: corrupted connectivity (weights not updated): " +
        std::to_string(bad) + " rows or columns with indices outside the projection");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjTraceUpdate, nj_ffi::Ordered<TraceImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // weights (*batch, nnz)
                                  .Arg<ffi::AnyBuffer>()  // pre trace 0 (*batch, n_pre)
                                  .Arg<ffi::AnyBuffer>()  // pre trace 1 (or empty)
                                  .Arg<ffi::AnyBuffer>()  // post trace 0 (*batch, n_post)
                                  .Arg<ffi::AnyBuffer>()  // post trace 1 (or empty)
                                  .Arg<ffi::AnyBuffer>()  // s_arr (*batch, arr_stride)
                                  .Arg<ffi::AnyBuffer>()  // s_post (*batch, post_stride)
                                  .Arg<ffi::AnyBuffer>()  // params (10,)
                                  .Arg<ffi::AnyBuffer>()  // indptr
                                  .Arg<ffi::AnyBuffer>()  // indices (post per synapse)
                                  .Arg<ffi::AnyBuffer>()  // col_ptr
                                  .Arg<ffi::AnyBuffer>()  // col_syn
                                  .Arg<ffi::AnyBuffer>()  // col_pre
                                  .Ret<ffi::AnyBuffer>()  // weights (aliased)
                                  .Ret<ffi::AnyBuffer>()  // pre trace 0 (aliased)
                                  .Ret<ffi::AnyBuffer>()  // pre trace 1 (aliased)
                                  .Ret<ffi::AnyBuffer>()  // post trace 0 (aliased)
                                  .Ret<ffi::AnyBuffer>()  // post trace 1 (aliased)
                                  .Attr<int64_t>("kind")
                                  .Attr<int64_t>("n_pre")
                                  .Attr<int64_t>("n_post")
                                  .Attr<int64_t>("arr_stride")
                                  .Attr<int64_t>("arr_offset")
                                  .Attr<int64_t>("post_stride")
                                  .Attr<int64_t>("post_offset")
                                  .Attr<int64_t>("nearest"));

// ---------------------------------------------------------------------------------------------
// Reward-modulated STDP with eligibility traces (nj.RewardSTDP, Izhikevich 2007): one step of
// the lazily updated synapses of neurojax.network._plastic (`modulated_update`), in place.
// See neurojax.plasticity._reward for the arithmetic. For trial b:
//
//   0. at the first step of a block (`sweep` != 0), every synapse is brought up to date,
//      w <- clip(w + gain * e * (acc - stamp)), e <- e * a_block, stamp <- 0, and acc <- 0;
//      then, with acc' = acc + phase * d:
//   1. x <- x * decay_x, then takes this step's arrivals (+s, or 1 with `nearest`);
//   2. every synapse k of a presynaptic neuron i that emits or whose spike arrives
//      (s_emit[b, i] > 0 or s_arr[b, i] > 0), along its CSR row, is brought up to date and
//      takes the arrival's eligibility:
//        w <- clip(w + gain * e * (acc' - stamp)),
//        e <- e + (-a_minus * (y[j] * decay_y) * s_arr[i]) / a_end,  stamp <- acc';
//   3. every synapse of a spiking postsynaptic neuron j, along its CSC column, likewise with
//        e <- e + (a_plus * x[i] * s_post[j]) / a_end   (x after this step's arrivals);
//   4. y <- y * decay_y, then takes this step's spikes.
//
// The same operations in the same order as the pure-JAX event path (`_modulated_event`).
//
// Arguments: weights, eligibility, stamp (*batch, nnz), acc (*batch,), x (*batch, n_pre),
// y (*batch, n_post), s_emit, s_arr (*batch, n_pre), s_post (*batch, n_post), d (*batch,),
// params (11,) = (decay_x, decay_y, phase, a_end, gain, a_plus, a_minus, w_min, w_max, sweep,
// a_block),
// indptr, indices, col_ptr, col_syn, col_pre (int32). Results: weights, eligibility, stamp,
// acc, x, y, aliased to the inputs.

namespace {

// Asks for the lines of [p, p + count) when count is plausible (a corrupted pointer array is
// caught by the checks that follow; this only must not loop for long).
template <typename T>
inline void PrefetchSpan(const T* p, int64_t begin, int64_t end, int64_t nnz, bool for_write) {
  if (begin >= 0 && begin <= end && end <= nnz) {
    nj_run::PrefetchRange(p + begin, (end - begin) * static_cast<int64_t>(sizeof(T)), for_write);
  }
}

// Catch-up and eligibility jump of the synapses [begin, end) of one presynaptic row, the
// jump -a_minus * (y[post[k]] * decay_y) * s: contiguous synapses, restrict pointers, so that
// the compiler vectorises it (gathering y).
template <typename F>
void RewardRow(F* __restrict w, F* __restrict e, F* __restrict st, const F* __restrict y,
               const int32_t* __restrict post, int32_t begin, int32_t end, F acc, F gain,
               F a_minus, F dy, F s, F a_end, F lo, F hi) {
  for (int32_t k = begin; k < end; ++k) {
    const F jump = -a_minus * (y[post[k]] * dy) * s;
    const F v = w[k] + gain * e[k] * (acc - st[k]);
    w[k] = Clip<F>(v, lo, hi);
    e[k] = e[k] + jump / a_end;
    st[k] = acc;
  }
}

// The same along one postsynaptic column (synapses col_syn[m], presynaptic neurons
// col_pre[m]), the jump a_plus * x[col_pre[m]] * s; the scattered weights, eligibilities
// and stamps are asked for eight synapses ahead.
template <typename F>
void RewardColumn(F* __restrict w, F* __restrict e, F* __restrict st, const F* __restrict x,
                  const int32_t* __restrict syn, const int32_t* __restrict pre, int32_t begin,
                  int32_t end, F acc, F gain, F a_plus, F s, F a_end, F lo, F hi) {
  for (int32_t m = begin; m < end; ++m) {
    if (m + 8 < end) {
      __builtin_prefetch(w + syn[m + 8], 1);
      __builtin_prefetch(e + syn[m + 8], 1);
      __builtin_prefetch(st + syn[m + 8], 1);
    }
    const int32_t k = syn[m];
    const F jump = a_plus * x[pre[m]] * s;
    const F v = w[k] + gain * e[k] * (acc - st[k]);
    w[k] = Clip<F>(v, lo, hi);
    e[k] = e[k] + jump / a_end;
    st[k] = acc;
  }
}

template <typename F, typename Bits>
int64_t Reward(F* w, F* e, F* st, F* acc, F* x, F* y, const F* s_emit, const F* s_arr,
               const F* s_post, const F* d, const F* prm, const int32_t* indptr,
               const int32_t* post, const int32_t* col_ptr, const int32_t* col_syn,
               const int32_t* col_pre, int64_t nnz, int64_t n_pre, int64_t n_post,
               int64_t n_trials, bool nearest) {
  const F dx = prm[0], dy = prm[1], phase = prm[2], a_end = prm[3], gain = prm[4];
  const F a_plus = prm[5], a_minus = prm[6], lo = prm[7], hi = prm[8];
  const bool sweep = prm[9] != F(0);
  const F a_block = prm[10];
  thread_local std::vector<int32_t> touched, fired;
  if (touched.size() < static_cast<size_t>(n_pre)) touched.resize(n_pre);
  if (fired.size() < static_cast<size_t>(n_post)) fired.resize(n_post);
  for (int64_t b = 0; b < n_trials; ++b) {
    F* wb = w + b * nnz;
    F* eb = e + b * nnz;
    F* sb = st + b * nnz;
    F* xb = x + b * n_pre;
    F* yb = y + b * n_post;
    const F* em = s_emit + b * n_pre;
    const F* ab = s_arr + b * n_pre;
    const F* pb = s_post + b * n_post;
    // The emitted and arriving spikes are often one buffer (no delay), and for a projection
    // of a population onto itself the postsynaptic spikes too: each list is then made once.
    const int64_t n_touch =
        ListSpikes<F, Bits, true>(em, ab == em ? nullptr : ab, n_pre, touched.data());
    int64_t n_fired;
    if (pb == em && ab == em && n_post == n_pre) {
      n_fired = n_touch;
      std::memcpy(fired.data(), touched.data(), n_touch * sizeof(int32_t));
    } else {
      n_fired = ListSpikes<F, Bits, true>(pb, nullptr, n_post, fired.data());
    }
    // Every row and column is checked before anything is written. The lines of all of them
    // are asked for first (a row's indices, weights, eligibilities and stamps, a column's
    // indices), so that their cache misses overlap.
    for (int64_t q = 0; q < n_touch; ++q) {
      const int32_t i = touched[q];
      PrefetchSpan(post, indptr[i], indptr[i + 1], nnz, false);
      PrefetchSpan(wb, indptr[i], indptr[i + 1], nnz, true);
      PrefetchSpan(eb, indptr[i], indptr[i + 1], nnz, true);
      PrefetchSpan(sb, indptr[i], indptr[i + 1], nnz, true);
    }
    for (int64_t q = 0; q < n_fired; ++q) {
      const int32_t j = fired[q];
      PrefetchSpan(col_syn, col_ptr[j], col_ptr[j + 1], nnz, false);
      PrefetchSpan(col_pre, col_ptr[j], col_ptr[j + 1], nnz, false);
    }
    int64_t bad = 0;
    for (int64_t q = 0; q < n_touch; ++q) bad += !RowOk(indptr, post, touched[q], nnz, n_post);
    for (int64_t q = 0; q < n_fired; ++q) {
      bad += !ColumnOk(col_ptr, col_syn, col_pre, fired[q], nnz, n_pre);
    }
    if (bad) return bad;  // nothing written in this trial; the call reports an error
    // Every synapse lies in one row and one column, and the sweep treats each synapse on its
    // own: each phase can be shared between threads (pool.h), each thread updating only its
    // own synapses (a run of them, of the rows, of the columns) with the serial operations,
    // so the results are bit for bit the same with any number of threads.
    const int32_t* touch_list = touched.data();
    const int32_t* fired_list = fired.data();
    int n = 1;
    int64_t work = 0;
    if (nj_pool::Threads() > 1) {
      work = sweep ? nnz : 0;
      for (int64_t q = 0; q < n_touch; ++q) {
        work += static_cast<int64_t>(indptr[touch_list[q] + 1]) - indptr[touch_list[q]];
      }
      for (int64_t q = 0; q < n_fired; ++q) {
        work += static_cast<int64_t>(col_ptr[fired_list[q] + 1]) - col_ptr[fired_list[q]];
      }
      n = nj_pool::Worth(work, sweep ? 3 : 2);
    }
    const int64_t t0 = n > 1 ? nj_pool::NowNs() : 0;
    if (sweep) {  // the block's one pass over every synapse, as the pure-JAX sweep
      const F acc_b = acc[b];
      auto pass = [&](int t) {
        int64_t k0, k1;
        nj_pool::Split(nnz, t, n, k0, k1);
        for (int64_t k = k0; k < k1; ++k) {
          wb[k] = Clip<F>(wb[k] + gain * eb[k] * (acc_b - sb[k]), lo, hi);
          eb[k] = eb[k] * a_block;
          sb[k] = F(0);
        }
      };
      nj_pool::RunParts(n, pass);
      acc[b] = F(0);
    }
    const F acc_new = acc[b] + phase * d[b];
    acc[b] = acc_new;
    AdvanceTrace<F>(xb, ab, n_pre, dx, nearest);
    auto rows = [&](int t) {
      int64_t q0, q1;
      nj_pool::Split(n_touch, t, n, q0, q1);
      for (int64_t q = q0; q < q1; ++q) {
        const int32_t i = touch_list[q];
        RewardRow<F>(wb, eb, sb, yb, post, indptr[i], indptr[i + 1], acc_new, gain, a_minus,
                     dy, ab[i], a_end, lo, hi);
      }
    };
    nj_pool::RunParts(n, rows);
    auto columns = [&](int t) {
      int64_t q0, q1;
      nj_pool::Split(n_fired, t, n, q0, q1);
      for (int64_t q = q0; q < q1; ++q) {
        const int32_t j = fired_list[q];
        RewardColumn<F>(wb, eb, sb, xb, col_syn, col_pre, col_ptr[j], col_ptr[j + 1], acc_new,
                        gain, a_plus, pb[j], a_end, lo, hi);
      }
    };
    nj_pool::RunParts(n, columns);
    if (n > 1) nj_pool::RecordShared(work, n, nj_pool::NowNs() - t0);
    AdvanceTrace<F>(yb, pb, n_post, dy, nearest);
  }
  return 0;
}

ffi::Error RewardImpl(ffi::AnyBuffer w_in, ffi::AnyBuffer e_in, ffi::AnyBuffer st_in,
                      ffi::AnyBuffer acc_in, ffi::AnyBuffer x_in, ffi::AnyBuffer y_in,
                      ffi::AnyBuffer s_emit, ffi::AnyBuffer s_arr, ffi::AnyBuffer s_post,
                      ffi::AnyBuffer d, ffi::AnyBuffer params, ffi::AnyBuffer indptr,
                      ffi::AnyBuffer post, ffi::AnyBuffer col_ptr, ffi::AnyBuffer col_syn,
                      ffi::AnyBuffer col_pre, ffi::Result<ffi::AnyBuffer> w_out,
                      ffi::Result<ffi::AnyBuffer> e_out, ffi::Result<ffi::AnyBuffer> st_out,
                      ffi::Result<ffi::AnyBuffer> acc_out, ffi::Result<ffi::AnyBuffer> x_out,
                      ffi::Result<ffi::AnyBuffer> y_out, int64_t n_pre, int64_t n_post,
                      int64_t nearest) {
  const auto type = w_in.element_type();
  if (type != ffi::DataType::F32 && type != ffi::DataType::F64) {
    return ffi::Error::InvalidArgument("nj_reward_update: float32 or float64 expected");
  }
  for (const ffi::AnyBuffer* buf :
       {&e_in, &st_in, &acc_in, &x_in, &y_in, &s_emit, &s_arr, &s_post, &d, &params}) {
    if (buf->element_type() != type) {
      return ffi::Error::InvalidArgument("nj_reward_update: float buffers must share one dtype");
    }
  }
  for (const ffi::AnyBuffer* buf : {&indptr, &post, &col_ptr, &col_syn, &col_pre}) {
    if (buf->element_type() != ffi::DataType::S32) {
      return ffi::Error::InvalidArgument("nj_reward_update: index buffers must be int32");
    }
  }
  const auto count = [](const ffi::AnyBuffer& b) {
    return static_cast<int64_t>(b.element_count());
  };
  const int64_t nnz = count(post);
  const int64_t n_trials = count(acc_in);
  if (n_pre < 0 || n_post < 0 || count(params) != 11 || count(d) != n_trials ||
      count(w_in) != n_trials * nnz || count(e_in) != n_trials * nnz ||
      count(st_in) != n_trials * nnz || count(x_in) != n_trials * n_pre ||
      count(y_in) != n_trials * n_post || count(s_emit) != n_trials * n_pre ||
      count(s_arr) != n_trials * n_pre || count(s_post) != n_trials * n_post ||
      count(indptr) != n_pre + 1 || count(col_ptr) != n_post + 1 || count(col_syn) != nnz ||
      count(col_pre) != nnz) {
    return ffi::Error::InvalidArgument(
        "nj_reward_update: weights, eligibility, stamps, traces, spikes or index arrays do "
        "not match the trials, n_pre, n_post and nnz");
  }
  const std::pair<ffi::AnyBuffer*, const ffi::AnyBuffer*> pairs[] = {
      {&*w_out, &w_in},     {&*e_out, &e_in}, {&*st_out, &st_in},
      {&*acc_out, &acc_in}, {&*x_out, &x_in}, {&*y_out, &y_in}};
  for (const auto& [out, in] : pairs) {
    if (out->untyped_data() != in->untyped_data() && in->size_bytes() > 0) {
      std::memcpy(out->untyped_data(), in->untyped_data(), in->size_bytes());
    }
  }
  const auto i32 = [](const ffi::AnyBuffer& b) {
    return static_cast<const int32_t*>(b.untyped_data());
  };
  int64_t bad = 0;
  const auto run = [&](auto zero, auto bits) {
    using F = decltype(zero);
    const auto f = [](ffi::AnyBuffer& b) { return static_cast<F*>(b.untyped_data()); };
    const auto c = [](const ffi::AnyBuffer& b) {
      return static_cast<const F*>(b.untyped_data());
    };
    bad = Reward<F, decltype(bits)>(f(*w_out), f(*e_out), f(*st_out), f(*acc_out), f(*x_out),
                                    f(*y_out), c(s_emit), c(s_arr), c(s_post), c(d),
                                    c(params), i32(indptr), i32(post), i32(col_ptr),
                                    i32(col_syn), i32(col_pre), nnz, n_pre, n_post, n_trials,
                                    nearest != 0);
  };
  if (type == ffi::DataType::F32) {
    run(0.0f, uint32_t{0});
  } else {
    run(0.0, uint64_t{0});
  }
  if (bad) {
    return ffi::Error::InvalidArgument(
        "nj_reward_update: corrupted connectivity (weights not updated): " +
        std::to_string(bad) + " rows or columns with indices outside the projection");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjRewardUpdate, nj_ffi::Ordered<RewardImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // weights (*batch, nnz)
                                  .Arg<ffi::AnyBuffer>()  // eligibility (*batch, nnz)
                                  .Arg<ffi::AnyBuffer>()  // stamp (*batch, nnz)
                                  .Arg<ffi::AnyBuffer>()  // acc (*batch,)
                                  .Arg<ffi::AnyBuffer>()  // x (*batch, n_pre)
                                  .Arg<ffi::AnyBuffer>()  // y (*batch, n_post)
                                  .Arg<ffi::AnyBuffer>()  // s_emit (*batch, n_pre)
                                  .Arg<ffi::AnyBuffer>()  // s_arr (*batch, n_pre)
                                  .Arg<ffi::AnyBuffer>()  // s_post (*batch, n_post)
                                  .Arg<ffi::AnyBuffer>()  // d (*batch,)
                                  .Arg<ffi::AnyBuffer>()  // params (11,)
                                  .Arg<ffi::AnyBuffer>()  // indptr
                                  .Arg<ffi::AnyBuffer>()  // indices
                                  .Arg<ffi::AnyBuffer>()  // col_ptr
                                  .Arg<ffi::AnyBuffer>()  // col_syn
                                  .Arg<ffi::AnyBuffer>()  // col_pre
                                  .Ret<ffi::AnyBuffer>()  // weights (aliased)
                                  .Ret<ffi::AnyBuffer>()  // eligibility (aliased)
                                  .Ret<ffi::AnyBuffer>()  // stamp (aliased)
                                  .Ret<ffi::AnyBuffer>()  // acc (aliased)
                                  .Ret<ffi::AnyBuffer>()  // x (aliased)
                                  .Ret<ffi::AnyBuffer>()  // y (aliased)
                                  .Attr<int64_t>("n_pre")
                                  .Attr<int64_t>("n_post")
                                  .Attr<int64_t>("nearest"));
