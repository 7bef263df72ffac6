// Shared by the event kernels (csr_deliver.cc, plastic_trace.cc): the block test of the spike
// scans, the weight clip, and the bounds checks of a CSR row and a CSC column that every
// plastic update runs before it writes. Part of the compiled library's source hash
// (neurojax.kernels._build).

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
