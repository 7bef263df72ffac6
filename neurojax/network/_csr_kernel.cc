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
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

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
  constexpr int64_t kBlock = 16;
  for (int64_t b = 0; b < n_trials; ++b) {
    const F* sb = s + b * n_source;
    F* rb = ring + b * n_slots * n_targets;
    int64_t i = 0;
    for (; i + kBlock <= n_source; i += kBlock) {
      // Any nonzero in the block? An OR over the bit patterns vectorises well, and -0.0 is
      // the only nonzero pattern of a zero value, which spikes never hold.
      Bits any = 0;
      for (int64_t j = 0; j < kBlock; ++j) {
        Bits x;
        std::memcpy(&x, sb + i + j, sizeof(Bits));
        any |= x;
      }
      if (any == 0) continue;
      for (int64_t j = i; j < i + kBlock; ++j) {
        if (sb[j] != F(0)) Neuron(projs, b, j, sb[j], rb, step, n_slots, n_targets);
      }
    }
    for (; i < n_source; ++i) {
      if (sb[i] != F(0)) Neuron(projs, b, i, sb[i], rb, step, n_slots, n_targets);
    }
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
