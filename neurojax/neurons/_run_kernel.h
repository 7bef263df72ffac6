// Shared by the whole-run kernels of uncoupled populations (_lif_kernel.cc, _hh_kernel.cc):
// how a block of neurons writes its spike record, and the huge-page advice on that record.
// Part of the compiled library's source hash (neurojax.network._kernel._HEADERS).

#ifndef NEUROJAX_NEURONS_RUN_KERNEL_H_
#define NEUROJAX_NEURONS_RUN_KERNEL_H_

#include <cstdint>
#include <type_traits>

#if defined(__linux__)
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

}  // namespace nj_run

#endif  // NEUROJAX_NEURONS_RUN_KERNEL_H_
