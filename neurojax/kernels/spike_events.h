// Shared by the event kernels (csr_deliver.cc, plastic_trace.cc, network_run.cc): the block
// test of the spike scans, the weight clip, pair STDP's events on a row and a column, and the
// bounds checks of a CSR row and a CSC column that every plastic update runs before it
// writes. Part of the compiled library's source hash (neurojax.kernels._build).

#ifndef NEUROJAX_KERNELS_SPIKE_EVENTS_H_
#define NEUROJAX_KERNELS_SPIKE_EVENTS_H_

#include <cstdint>
#include <cstring>

namespace nj_events {

// Blocks of the spike scans: two 32-byte vectors (16 float32 or 8 float64 entries), tested
// with one OR over their bit patterns (-0.0 is the only nonzero pattern of a zero value, and
// spikes never hold it), so that a mostly silent vector is scanned a few vectors per cycle.
// GCC/Clang vector extensions keep this portable across instruction sets.
template <typename F>
constexpr int64_t kLanes = 32 / sizeof(F);

template <typename F, typename Bits>
inline bool AnyBits(const F* s) {
  typedef Bits VB __attribute__((vector_size(32)));
  VB a, b;
  std::memcpy(&a, s, 32);
  std::memcpy(&b, s + kLanes<F>, 32);
  const VB o = a | b;
  uint64_t w[4];
  std::memcpy(w, &o, 32);
  return (w[0] | w[1] | w[2] | w[3]) != 0;
}

template <typename F>
inline F Clip(F w, F lo, F hi) {
  w = w < lo ? lo : w;  // max(w, lo) then min(., hi), as jnp.clip
  return w > hi ? hi : w;
}

// Pair STDP's events on a run of synapses, the operations of `STDP.on_pre` / `on_post` in
// their order (shared by nj_stdp_update and nj_network_run, so that both give the pure-JAX
// update's numbers). One synapse's depression (weight v, postsynaptic trace y_post) and
// potentiation (presynaptic trace x_pre): the rows and columns below, and nj_network_run's
// walk that does both on one row, apply exactly these operations.
template <typename F, bool kMultiplicative>
inline F Depressed(F v, F y_post, F a_minus, F decay_y, F s, F lo, F hi) {
  const F f = kMultiplicative ? v - lo : F(1);
  return Clip<F>(v - a_minus * f * (y_post * decay_y) * s, lo, hi);
}

template <typename F, bool kMultiplicative>
inline F Potentiated(F v, F x_pre, F a_plus, F s, F lo, F hi) {
  const F f = kMultiplicative ? hi - v : F(1);
  return Clip<F>(v + a_plus * f * x_pre * s, lo, hi);
}

// Depression of the synapses [begin, end) of an arriving row:
// w <- clip(w - a_minus * f_-(w) * (y[post] * decay_y) * s), with f_- = w - lo
// (multiplicative) or 1; a function of its own with restrict pointers so that the compiler
// vectorises it (gathering the postsynaptic trace).
template <typename F, bool kMultiplicative>
void DepressRow(F* __restrict w, const F* __restrict y, const int32_t* __restrict post,
                int64_t begin, int64_t end, F a_minus, F decay_y, F s, F lo, F hi) {
  for (int64_t k = begin; k < end; ++k) {
    w[k] = Depressed<F, kMultiplicative>(w[k], y[post[k]], a_minus, decay_y, s, lo, hi);
  }
}

// Potentiation of the synapses of a spiking postsynaptic neuron's column entries
// [begin, end): w <- clip(w + a_plus * f_+(w) * x[pre] * s), with f_+ = hi - w
// (multiplicative) or 1 and x the presynaptic trace after this step's arrivals.
template <typename F, bool kMultiplicative>
void PotentiateColumn(F* __restrict w, const F* __restrict x, const int32_t* __restrict col_syn,
                      const int32_t* __restrict col_pre, int64_t begin, int64_t end, F a_plus,
                      F s, F lo, F hi) {
  for (int64_t m = begin; m < end; ++m) {
    if (m + 8 < end) __builtin_prefetch(w + col_syn[m + 8], 1);
    const int32_t k = col_syn[m];
    w[k] = Potentiated<F, kMultiplicative>(w[k], x[col_pre[m]], a_plus, s, lo, hi);
  }
}

// The largest of the indices idx[begin, end) as unsigned (a negative index is larger than
// any count): one branch-free pass that the compiler vectorises, so that the checks below
// cost a few cycles per 8 or 16 indices.
inline uint32_t MaxIndex(const int32_t* __restrict idx, int64_t begin, int64_t end) {
  uint32_t worst = 0;
  for (int64_t k = begin; k < end; ++k) {
    const uint32_t v = static_cast<uint32_t>(idx[k]);
    worst = v > worst ? v : worst;
  }
  return worst;
}

// Whether row i's synapses [indptr[i], indptr[i + 1]) lie inside [0, nnz) and point at
// postsynaptic neurons of [0, n_post); and column j's entries likewise at synapses of
// [0, nnz) and presynaptic neurons of [0, n_pre). Read before any weight is written, so that
// no content of the index arrays makes an update touch memory outside its arrays.
inline bool RowOk(const int32_t* indptr, const int32_t* post, int64_t i, int64_t nnz,
                  int64_t n_post) {
  const int64_t begin = indptr[i], end = indptr[i + 1];
  if (begin < 0 || end < begin || end > nnz) return false;
  return begin == end || static_cast<uint64_t>(MaxIndex(post, begin, end)) <
                             static_cast<uint64_t>(n_post);
}

inline bool ColumnOk(const int32_t* col_ptr, const int32_t* col_syn, const int32_t* col_pre,
                     int64_t j, int64_t nnz, int64_t n_pre) {
  const int64_t begin = col_ptr[j], end = col_ptr[j + 1];
  if (begin < 0 || end < begin || end > nnz) return false;
  return begin == end ||
         (static_cast<uint64_t>(MaxIndex(col_syn, begin, end)) < static_cast<uint64_t>(nnz) &&
          static_cast<uint64_t>(MaxIndex(col_pre, begin, end)) < static_cast<uint64_t>(n_pre));
}

}  // namespace nj_events

#endif  // NEUROJAX_KERNELS_SPIKE_EVENTS_H_
