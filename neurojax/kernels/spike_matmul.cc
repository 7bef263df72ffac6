// Products of a mostly-zero input matrix (spikes) with a dense one, on CPU through XLA's FFI
// (neurojax.training._spike_matmul, used by the layers built with `sparse_input=True`).
//
// nj_spike_matmul:   y[m, :] = sum over k with x[m, k] != 0 of x[m, k] * w[k, :]
//                    x (M, K), w (K, N) -> y (M, N)          (the forward product x @ w)
// nj_spike_matmul_t: d[k, :] = sum over m with x[m, k] != 0 of x[m, k] * g[m, :]
//                    x (M, K), g (M, N) -> d (K, N)          (the weight gradient x^T @ g)
//
// Work is proportional to the number of non-zero inputs times N, not to M * K * N: with spike
// inputs (a few per cent of entries are 1) that is ten to fifty times fewer operations than a
// dense product, which more than pays for the lower arithmetic intensity of adding rows.
//
// How: the non-zero entries of x are first listed once per call (row-wise for the forward
// product, column-wise for the transposed one; positions ascending). The output is then made
// in column panels of 256 bytes (64 floats or 32 doubles), each panel by one task of XLA's
// intra-op thread pool. Within a panel, the dense operand is taken in slabs of up to
// kSlabBytes, copied into one contiguous buffer (its rows are N values apart in memory, a
// stride that would map a slab onto a few cache sets), which stays in the caches (L2, or L3
// for the larger slabs) while every output row of the panel adds its non-zero inputs' rows of
// the slab in registers. With fewer non-zero inputs than dense rows the copy would cost more
// than it saves, and the rows are read in place.
//
// Sums start from zero and run in ascending input position, a multiply and an add per entry
// (the multiply is exact for inputs of 1), so results do not depend on the number of threads;
// they equal a dense product up to rounding, since a dense product adds in an order of its own.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 64;  // float columns per task (8 AVX vectors); 32 for doubles
// Rows of the dense operand packed per pass: 4 MiB holds a whole panel of K = 16384 rows,
// so that every output row is made in one pass (no reloading of partial sums).
constexpr int64_t kSlabBytes = 4 << 20;
constexpr int64_t kAhead = 4;  // entries ahead whose slab row is prefetched

// The non-zero entries of a matrix along one of its axes: for line j, positions
// index[start[j] .. start[j + 1]) (ascending) with values value[...].
template <typename F>
struct Lists {
  std::vector<int64_t> start;
  std::vector<int32_t> index;
  std::vector<F> value;
};

// Non-zeros of each row of x (M, K).
template <typename F>
Lists<F> RowLists(const F* x, int64_t m_rows, int64_t k_cols) {
  Lists<F> l;
  l.start.assign(m_rows + 1, 0);
  int64_t total = 0;
  for (int64_t m = 0; m < m_rows; ++m) {
    const F* row = x + m * k_cols;
    int64_t c = 0;
    for (int64_t k = 0; k < k_cols; ++k) c += row[k] != F(0);
    l.start[m] = total;
    total += c;
  }
  l.start[m_rows] = total;
  l.index.resize(total);
  l.value.resize(total);
  for (int64_t m = 0; m < m_rows; ++m) {
    const F* row = x + m * k_cols;
    int64_t p = l.start[m];
    for (int64_t k = 0; k < k_cols; ++k) {
      if (row[k] != F(0)) {
        l.index[p] = static_cast<int32_t>(k);
        l.value[p] = row[k];
        ++p;
      }
    }
  }
  return l;
}

// Non-zeros of each column of x (M, K), rows ascending.
template <typename F>
Lists<F> ColumnLists(const F* x, int64_t m_rows, int64_t k_cols) {
  Lists<F> l;
  std::vector<int64_t> count(k_cols + 1, 0);
  for (int64_t m = 0; m < m_rows; ++m) {
    const F* row = x + m * k_cols;
    for (int64_t k = 0; k < k_cols; ++k) count[k + 1] += row[k] != F(0);
  }
  for (int64_t k = 0; k < k_cols; ++k) count[k + 1] += count[k];
  l.start = count;
  l.index.resize(count[k_cols]);
  l.value.resize(count[k_cols]);
  std::vector<int64_t> fill(count.begin(), count.end() - 1);
  for (int64_t m = 0; m < m_rows; ++m) {
    const F* row = x + m * k_cols;
    for (int64_t k = 0; k < k_cols; ++k) {
      if (row[k] != F(0)) {
        const int64_t p = fill[k]++;
        l.index[p] = static_cast<int32_t>(m);
        l.value[p] = row[k];
      }
    }
  }
  return l;
}

// out[j, c0:c0+width] = sum over entries (i, a) of list j of a * dense[i, c0:c0+width], for
// every line j, with the dense operand's rows taken slab by slab (packed when `pack`, else
// read in place). `out` rows are `out_stride` apart, `dense` rows `dense_stride` apart;
// `dense_rows` rows in all.
template <typename F>
void Panel(const Lists<F>& lists, int64_t n_lines, const F* dense, int64_t dense_rows,
           int64_t dense_stride, F* out, int64_t out_stride, int64_t c0, int64_t width,
           bool pack) {
  // Vectors of 32 bytes that may sit at any F-aligned address (one AVX register on x86).
  typedef F Vec __attribute__((vector_size(32), aligned(sizeof(F))));
  constexpr int64_t kLanes = 32 / sizeof(F);
  constexpr int64_t kVecs = kPanel * sizeof(float) / 32;  // accumulators for a full panel
  constexpr int64_t panel = kVecs * kLanes;                 // values per full panel
  const int64_t slab = pack ? std::max<int64_t>(1, kSlabBytes / (panel * sizeof(F)))
                            : std::max<int64_t>(1, dense_rows);
  const int64_t stride = pack ? panel : dense_stride;  // between rows of a slab
  // The packed slab, 64-byte aligned so that no row crosses more cache lines than it must.
  std::unique_ptr<F[]> storage(pack ? new F[slab * panel + 64 / sizeof(F)] : nullptr);
  F* packed = reinterpret_cast<F*>((reinterpret_cast<uintptr_t>(storage.get()) + 63) &
                                   ~static_cast<uintptr_t>(63));
  std::vector<int64_t> cursor(lists.start.begin(), lists.start.end() - 1);
  const int32_t* index = lists.index.data();
  const F* value = lists.value.data();
  if (dense_rows == 0) {
    for (int64_t j = 0; j < n_lines; ++j) {
      std::fill(out + j * out_stride + c0, out + j * out_stride + c0 + width, F(0));
    }
  }
  for (int64_t r0 = 0; r0 < dense_rows; r0 += slab) {
    const int64_t rows = std::min(slab, dense_rows - r0);
    for (int64_t r = 0; pack && r < rows; ++r) {
      std::memcpy(packed + r * panel, dense + (r0 + r) * dense_stride + c0, width * sizeof(F));
    }
    const int32_t r_end = static_cast<int32_t>(r0 + rows);
    // row i of the slab at base + i * stride
    const F* base = pack ? packed - r0 * panel : dense + c0;
    const bool first = r0 == 0;
    for (int64_t j = 0; j < n_lines; ++j) {
      int64_t p = cursor[j];
      const int64_t p_end = lists.start[j + 1];
      F* o = out + j * out_stride + c0;
      if (width == panel) {
        Vec acc[kVecs];
#pragma GCC unroll 16
        for (int64_t v = 0; v < kVecs; ++v) {
          acc[v] = first ? Vec{} : *reinterpret_cast<const Vec*>(o + v * kLanes);
        }
        for (; p < p_end && index[p] < r_end; ++p) {
          const F a = value[p];
          const F* src = base + static_cast<int64_t>(index[p]) * stride;
          // The slab row of a later entry, fetched ahead: rows come in no order that the
          // hardware prefetchers could follow, and a slab larger than L2 is read from L3.
          const int64_t q = p + kAhead < p_end ? p + kAhead : p;
          const char* ahead = reinterpret_cast<const char*>(
              base + static_cast<int64_t>(std::min(index[q], r_end - 1)) * stride);
#pragma GCC unroll 16
          for (int64_t b = 0; b < panel * static_cast<int64_t>(sizeof(F)); b += 64) {
            __builtin_prefetch(ahead + b);
          }
#pragma GCC unroll 16
          for (int64_t v = 0; v < kVecs; ++v) {
            acc[v] = a * *reinterpret_cast<const Vec*>(src + v * kLanes) + acc[v];
          }
        }
#pragma GCC unroll 16
        for (int64_t v = 0; v < kVecs; ++v) *reinterpret_cast<Vec*>(o + v * kLanes) = acc[v];
      } else {  // the last, narrower panel
        if (first) std::fill(o, o + width, F(0));
        for (; p < p_end && index[p] < r_end; ++p) {
          const F a = value[p];
          const F* src = base + static_cast<int64_t>(index[p]) * stride;
          for (int64_t c = 0; c < width; ++c) o[c] = a * src[c] + o[c];
        }
      }
      cursor[j] = p;
    }
  }
}

// transposed == false: y (M, N) = x (M, K) @ dense (K, N); true: d (K, N) = x^T @ dense (M, N).
template <typename F>
void Product(const F* x, const F* dense, F* out, int64_t m_rows, int64_t k_cols, int64_t n_cols,
             bool transposed, ffi::ThreadPool& pool) {
  const Lists<F> lists = transposed ? ColumnLists(x, m_rows, k_cols) : RowLists(x, m_rows, k_cols);
  const int64_t n_lines = transposed ? k_cols : m_rows;
  const int64_t dense_rows = transposed ? m_rows : k_cols;
  const int64_t panel = kPanel * sizeof(float) / sizeof(F);
  const int64_t panels = (n_cols + panel - 1) / panel;
  if (n_lines == 0 || panels == 0) return;
  nj_run::AdviseHugePages(out, n_lines * n_cols * static_cast<int64_t>(sizeof(F)));
  // Packing a panel of the dense operand pays when its rows are read at least once on
  // average; with fewer non-zero inputs than dense rows (a few rows of spikes, as in one step
  // of a simulation) the rows are read where they lie.
  const bool pack = static_cast<int64_t>(lists.index.size()) >= dense_rows;
  nj_run::RunTasks(panels, pool, [&](int64_t b) {
    const int64_t c0 = b * panel;
    Panel(lists, n_lines, dense, dense_rows, n_cols, out, n_cols, c0,
          std::min(panel, n_cols - c0), pack);
  });
}

ffi::Error Check(const char* name, ffi::AnyBuffer x, ffi::AnyBuffer dense,
                 ffi::Result<ffi::AnyBuffer>& out, int64_t& m_rows, int64_t& k_cols,
                 int64_t& n_cols, bool transposed) {
  const auto type = x.element_type();
  if ((type != ffi::DataType::F32 && type != ffi::DataType::F64) ||
      dense.element_type() != type || out->element_type() != type) {
    return ffi::Error::InvalidArgument(std::string(name) +
                                       ": operands must all be float32 or all float64");
  }
  const auto xd = x.dimensions();
  const auto dd = dense.dimensions();
  const auto od = out->dimensions();
  if (xd.size() != 2 || dd.size() != 2 || od.size() != 2) {
    return ffi::Error::InvalidArgument(std::string(name) + ": operands must be matrices");
  }
  m_rows = xd[0];
  k_cols = xd[1];
  n_cols = dd[1];
  const int64_t dense_rows = transposed ? m_rows : k_cols;
  const int64_t out_rows = transposed ? k_cols : m_rows;
  if (dd[0] != dense_rows || od[0] != out_rows || od[1] != n_cols) {
    return ffi::Error::InvalidArgument(std::string(name) + ": operand shapes do not match");
  }
  if (k_cols > INT32_MAX || m_rows > INT32_MAX) {
    return ffi::Error::InvalidArgument(std::string(name) + ": more than 2^31 rows or columns");
  }
  return ffi::Error::Success();
}

ffi::Error Run(const char* name, ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer dense,
               ffi::Result<ffi::AnyBuffer> out, bool transposed) {
  int64_t m_rows = 0, k_cols = 0, n_cols = 0;
  ffi::Error err = Check(name, x, dense, out, m_rows, k_cols, n_cols, transposed);
  if (err.failure()) return err;
  if (x.element_type() == ffi::DataType::F32) {
    Product(static_cast<const float*>(x.untyped_data()),
            static_cast<const float*>(dense.untyped_data()),
            static_cast<float*>(out->untyped_data()), m_rows, k_cols, n_cols, transposed, pool);
  } else {
    Product(static_cast<const double*>(x.untyped_data()),
            static_cast<const double*>(dense.untyped_data()),
            static_cast<double*>(out->untyped_data()), m_rows, k_cols, n_cols, transposed, pool);
  }
  return ffi::Error::Success();
}

ffi::Error SpikeMatmulImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w,
                           ffi::Result<ffi::AnyBuffer> y) {
  return Run("nj_spike_matmul", pool, x, w, y, false);
}

ffi::Error SpikeMatmulTImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer g,
                            ffi::Result<ffi::AnyBuffer> d) {
  return Run("nj_spike_matmul_t", pool, x, g, d, true);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjSpikeMatmul, nj_ffi::Ordered<SpikeMatmulImpl>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()   // x (M, K)
                                  .Arg<ffi::AnyBuffer>()   // w (K, N)
                                  .Ret<ffi::AnyBuffer>());  // y (M, N)

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjSpikeMatmulT, nj_ffi::Ordered<SpikeMatmulTImpl>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()   // x (M, K)
                                  .Arg<ffi::AnyBuffer>()   // g (M, N)
                                  .Ret<ffi::AnyBuffer>());  // d (K, N)
