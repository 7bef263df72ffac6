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
// the pure-JAX path. The spike vector is scanned 16 neurons at a time, skipping blocks with no
// spike, then the work is proportional to spikes x fan-out.
//
// Arguments: spikes (*batch, n_source), step () int32, ring (*batch, n_slots, n_targets), then
// per projection: indptr (n_pre + 1,) int32, indices (nnz,) int32, weights (nnz,) or, with
// `weights_batched`, one row of nnz weights per trial (plastic weights), delays
// (nnz,) int8/int16/int32 (or a dummy when the delay is homogeneous). Result: the ring,
// aliased to the input ring; with `overwrite` the input ring is ignored and the result starts
// from zeros (a fresh one-slot buffer).

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Calls fn(i, s[i]) for every nonzero s[i], ascending. Blocks of 16 entries are first tested
// with an OR over their bit patterns, which vectorises well (-0.0 is the only nonzero pattern of
// a zero value, and spikes never hold it), so a mostly silent vector is scanned quickly.
template <typename F, typename Bits, typename Fn>
inline void ForEachNonzero(const F* s, int64_t n, Fn fn) {
  constexpr int64_t kBlock = 16;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    Bits any = 0;
    for (int64_t j = 0; j < kBlock; ++j) {
      Bits x;
      std::memcpy(&x, s + i + j, sizeof(Bits));
      any |= x;
    }
    if (any == 0) continue;
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
  bool per_synapse;
  int64_t w_stride;  // weights of trial b start at b * w_stride (0: shared by all trials)
};

template <typename F, typename D>
inline void Row(const Proj& p, int64_t b, int64_t r, F v, F* rb, int64_t step, int64_t n_slots,
                int64_t n_targets) {
  const F* w = static_cast<const F*>(p.w) + b * p.w_stride;
  const int32_t end = p.indptr[r + 1];
  F* base = rb + p.target_offset;
  if (n_slots == 1) {
    for (int32_t k = p.indptr[r]; k < end; ++k) base[p.post[k]] += v * w[k];
  } else if (!p.per_synapse) {
    F* row = base + ((step + 1 + p.delay_steps) % n_slots) * n_targets;
    for (int32_t k = p.indptr[r]; k < end; ++k) row[p.post[k]] += v * w[k];
  } else {
    const D* d = static_cast<const D*>(p.delay);
    for (int32_t k = p.indptr[r]; k < end; ++k) {
      const int64_t slot = (step + 1 + static_cast<int64_t>(d[k])) % n_slots;
      base[slot * n_targets + p.post[k]] += v * w[k];
    }
  }
}

template <typename F>
inline void Neuron(const std::vector<Proj>& projs, int64_t b, int64_t i, F v, F* rb,
                   int64_t step, int64_t n_slots, int64_t n_targets) {
  for (const Proj& p : projs) {
    const int64_t r = i - p.pre_offset;
    if (r < 0 || r >= p.n_pre) continue;
    switch (p.per_synapse ? p.delay_type : ffi::DataType::S32) {
      case ffi::DataType::S8:
        Row<F, int8_t>(p, b, r, v, rb, step, n_slots, n_targets);
        break;
      case ffi::DataType::S16:
        Row<F, int16_t>(p, b, r, v, rb, step, n_slots, n_targets);
        break;
      default:
        Row<F, int32_t>(p, b, r, v, rb, step, n_slots, n_targets);
    }
  }
}

template <typename F, typename Bits>
void Deliver(const F* s, const std::vector<Proj>& projs, int64_t step, F* ring,
             int64_t n_source, int64_t n_slots, int64_t n_targets, int64_t n_trials) {
  for (int64_t b = 0; b < n_trials; ++b) {
    F* rb = ring + b * n_slots * n_targets;
    ForEachNonzero<F, Bits>(s + b * n_source, n_source, [&](int64_t i, F v) {
      Neuron(projs, b, i, v, rb, step, n_slots, n_targets);
    });
  }
}

ffi::Error CsrDeliverImpl(ffi::AnyBuffer s, ffi::AnyBuffer step, ffi::AnyBuffer ring_in,
                          ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> ring_out,
                          int64_t n_source, int64_t n_slots, int64_t n_targets,
                          int64_t overwrite, ffi::Span<const int64_t> pre_offset,
                          ffi::Span<const int64_t> n_pre, ffi::Span<const int64_t> delay_steps,
                          ffi::Span<const int64_t> target_offset,
                          ffi::Span<const int64_t> per_synapse,
                          ffi::Span<const int64_t> weights_batched) {
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
      target_offset.size() != k || per_synapse.size() != k || weights_batched.size() != k) {
    return ffi::Error::InvalidArgument("nj_csr_deliver: inconsistent projection arguments");
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
    projs[p] = Proj{static_cast<const int32_t*>(indptr->untyped_data()),
                    static_cast<const int32_t*>(post->untyped_data()),
                    w->untyped_data(),
                    d->untyped_data(),
                    dt,
                    pre_offset[p],
                    n_pre[p],
                    delay_steps[p],
                    target_offset[p],
                    per_synapse[p] != 0,
                    weights_batched[p] ? static_cast<int64_t>(post->element_count()) : 0};
  }
  if (overwrite) {
    std::memset(ring_out->untyped_data(), 0, ring_out->size_bytes());
  } else if (ring_out->untyped_data() != ring_in.untyped_data()) {
    std::memcpy(ring_out->untyped_data(), ring_in.untyped_data(), ring_in.size_bytes());
  }
  const int64_t n_trials = n_source > 0 ? s.element_count() / n_source : 0;
  const int64_t t = *static_cast<const int32_t*>(step.untyped_data());
  if (type == ffi::DataType::F32) {
    Deliver<float, uint32_t>(static_cast<const float*>(s.untyped_data()), projs, t,
                             static_cast<float*>(ring_out->untyped_data()), n_source, n_slots,
                             n_targets, n_trials);
  } else {
    Deliver<double, uint64_t>(static_cast<const double*>(s.untyped_data()), projs, t,
                              static_cast<double*>(ring_out->untyped_data()), n_source, n_slots,
                              n_targets, n_trials);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjCsrDeliver, CsrDeliverImpl,
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
                                  .Attr<ffi::Span<const int64_t>>("pre_offset")
                                  .Attr<ffi::Span<const int64_t>>("n_pre")
                                  .Attr<ffi::Span<const int64_t>>("delay_steps")
                                  .Attr<ffi::Span<const int64_t>>("target_offset")
                                  .Attr<ffi::Span<const int64_t>>("per_synapse")
                                  .Attr<ffi::Span<const int64_t>>("weights_batched"));

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
// The traces are advanced here too: x <- x decay_x and y <- y decay_y first, x takes this
// step's arrivals before potentiation, y this step's postsynaptic spikes at the end
// (+1, or reset to 1 with `nearest`).
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

template <typename F>
inline F Clip(F w, F lo, F hi) {
  w = w < lo ? lo : w;  // max(w, lo) then min(., hi), as jnp.clip
  return w > hi ? hi : w;
}

// Depression of the synapses [begin, end) of one arriving row. A function of its own, with
// restrict pointers and the bound rule as a template parameter, so that the compiler
// vectorises it (gathering the postsynaptic traces); the operations per synapse are those of
// the pure-JAX update, in its order.
template <typename F, bool kMultiplicative>
void DepressRow(F* __restrict w, const F* __restrict y, const int32_t* __restrict post,
                int32_t begin, int32_t end, F a_minus, F decay_y, F s, F lo, F hi) {
  for (int32_t k = begin; k < end; ++k) {
    const F v = w[k];
    const F f = kMultiplicative ? v - lo : F(1);
    const F yd = y[post[k]] * decay_y;
    w[k] = Clip<F>(v - a_minus * f * yd * s, lo, hi);
  }
}

template <typename F, typename Bits>
void Stdp(F* w, F* x, F* y, const F* s_arr, const F* s_post, const F* params,
          const int32_t* indptr, const int32_t* post, const int32_t* col_ptr,
          const int32_t* col_syn, const int32_t* col_pre, int64_t nnz, int64_t n_pre,
          int64_t n_post, int64_t n_trials, int64_t arr_stride, int64_t post_stride,
          bool multiplicative, bool nearest) {
  const F a_plus = params[0], a_minus = params[1], lo = params[2], hi = params[3];
  const F decay_x = params[4], decay_y = params[5];
  // Two passes over the neurons per step instead of six: each trace is decayed and
  // incremented in one pass that also visits the rows (or columns) of this step's spikes.
  // The arithmetic is that of the pure-JAX update, operation for operation: depression
  // reads the postsynaptic trace decayed but not yet incremented (y * decay_y, the same
  // product the stored trace gets), potentiation the presynaptic trace after the arrivals.
  const auto x_update = [&](F xi, F a) {
    const F d = xi * decay_x;
    return nearest ? (a > F(0) ? F(1) : d) : d + a;
  };
  const auto y_update = [&](F yj, F p) {
    const F d = yj * decay_y;
    return nearest ? (p > F(0) ? F(1) : d) : d + p;
  };
  for (int64_t b = 0; b < n_trials; ++b) {
    F* wb = w + b * nnz;
    F* xb = x + b * n_pre;
    F* yb = y + b * n_post;
    const F* ab = s_arr + b * arr_stride;
    const F* pb = s_post + b * post_stride;
    // Depression of the arriving rows (before any trace of this step is written).
    ForEachNonzero<F, Bits>(ab, n_pre, [&](int64_t i, F s) {
      if (multiplicative) {
        DepressRow<F, true>(wb, yb, post, indptr[i], indptr[i + 1], a_minus, decay_y, s, lo, hi);
      } else {
        DepressRow<F, false>(wb, yb, post, indptr[i], indptr[i + 1], a_minus, decay_y, s, lo, hi);
      }
    });
    for (int64_t i = 0; i < n_pre; ++i) xb[i] = x_update(xb[i], ab[i]);
    // Potentiation of the spiking columns with the new presynaptic trace.
    ForEachNonzero<F, Bits>(pb, n_post, [&](int64_t j, F s) {
      const int32_t end = col_ptr[j + 1];
      for (int32_t m = col_ptr[j]; m < end; ++m) {
        if (m + 8 < end) __builtin_prefetch(wb + col_syn[m + 8], 1);
        const int32_t k = col_syn[m];
        const F v = wb[k];
        const F f = multiplicative ? hi - v : F(1);
        wb[k] = Clip<F>(v + a_plus * f * xb[col_pre[m]] * s, lo, hi);
      }
    });
    for (int64_t j = 0; j < n_post; ++j) yb[j] = y_update(yb[j], pb[j]);
  }
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
  const auto run = [&](auto zero, auto bits) {
    using F = decltype(zero);
    Stdp<F, decltype(bits)>(
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
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjStdpUpdate, StdpImpl,
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
