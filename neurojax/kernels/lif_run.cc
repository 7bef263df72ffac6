// A whole run of an uncoupled LIF population on CPU in one call through XLA's FFI
// (neurojax.neurons._lif_fused, used by `nj.simulate` for `nj.LIF` with no input or a
// constant input, spikes recorded as the bool raster or as counts, no recorded state fields).
//
// nj_lif_run: for every neuron k and step t = 0 .. n_steps - 1, exactly `LIF.step`:
//   clamped = r > half_dt
//   v_free  = v_inf + (v - v_inf) * c          (method "exact": c = exp(-dt / tau_m))
//           = v + c * (v_inf - v)              (method "euler": c = dt / tau_m)
//   v       = clamped ? v_reset : v_free
//   spike   = (v - v_th) / (v_th - v_reset) >= 0
//   v       = spike ? v_reset : v
//   r       = spike ? t_ref : (clamped ? r - dt : 0)
// and raster[o, t, i] = spike for the neuron k = o * inner + i (with every > 1, counts
// [o, w, i] of the spikes of steps w * every .. (w + 1) * every - 1 instead). The same
// operations in the same order as the XLA program of the pure-JAX path, so that both give
// identical numbers.
// XLA:CPU contracts a multiply feeding an add into one fused multiply-add on CPUs that have
// it, so the v_free line is written with std::fma where this build targets such a CPU (the
// library is compiled with -march=native) and with a separate multiply and add otherwise;
// nothing else here is a multiply-add. `inner` is the number of neurons of one run; leading
// dimensions that vmap adds (o) become the raster's outer axis, in front of time.
//
// Why a kernel: XLA:CPU evaluates the step as several loop fusions, each of which re-reads
// the state and recomputes the update for one of its outputs (new v, new refractory time,
// the raster row), and streams the whole population through memory every step. Here the
// neurons are taken in blocks small enough to stay in the L1 cache, and each block runs all
// steps before the next: the state is read and written once per run, and each step of a
// neuron costs its arithmetic and one raster byte.
//
// Arguments (all of one float dtype and n elements): v, r, v_inf, c, v_reset, v_th, t_ref;
// dts (2,) = (dt, half_dt) in that dtype (repeated rows under vmap). Results: v, r (n,),
// spikes: bool (n_steps * n) or counts, uint8 or int32 (n_steps / every * n).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

namespace ffi = xla::ffi;

namespace {

using nj_run::MulAdd;  // a * b + c, rounded as XLA:CPU rounds it (see the header)

constexpr int64_t kBlock = 512;  // neurons per block: 7 arrays of 4 bytes fit the L1 cache

using nj_run::FlagOf;

// All steps of one block of m <= kBlock neurons. The compiler vectorises the neuron loop
// only when it may evaluate both sides of a select (the library is built with
// -fno-trapping-math, which changes no result: no floating-point exception is trapped) and
// when the spike flags are as wide as F (nj_run::FlagOf).
template <typename F, bool kEuler, typename Out>
void LifBlock(
    F* __restrict v, F* __restrict r, const F* __restrict v_inf, const F* __restrict c,
    const F* __restrict v_reset, const F* __restrict v_th, const F* __restrict t_ref, F dt,
    F half_dt, Out* __restrict out, int64_t row_stride, int64_t m, int64_t n_steps,
    int64_t every) {
  FlagOf<F> flags[kBlock];
  FlagOf<F> counts[kBlock] = {};
  for (int64_t t = 0; t < n_steps; ++t) {
    for (int64_t k = 0; k < m; ++k) {
      // Every load and every operation unconditional, only selects between values.
      const F vk = v[k], rk = r[k], vi = v_inf[k], ck = c[k];
      const F vr = v_reset[k], vt = v_th[k], tr = t_ref[k];
      const bool clamped = rk > half_dt;
      const F v_free = kEuler ? MulAdd(ck, vi - vk, vk) : MulAdd(vk - vi, ck, vi);
      const F v1 = clamped ? vr : v_free;
      const bool spike = (v1 - vt) / (vt - vr) >= F(0);
      const F r_dec = rk - dt;
      const F r1 = clamped ? r_dec : F(0);
      v[k] = spike ? vr : v1;
      r[k] = spike ? tr : r1;
      flags[k] = spike ? FlagOf<F>(1) : FlagOf<F>(0);
    }
    nj_run::RecordStep(flags, counts, out, row_stride, m, t, every);
  }
}

template <typename F, typename Out>
void LifRun(const F* v_in, const F* r_in, const F* v_inf, const F* c, const F* v_reset,
            const F* v_th, const F* t_ref, const F* dts, F* v, F* r, Out* out, int64_t n,
            int64_t inner, int64_t n_steps, int64_t every, bool euler) {
  if (v != v_in) std::memcpy(v, v_in, n * sizeof(F));
  if (r != r_in) std::memcpy(r, r_in, n * sizeof(F));
  const F dt = dts[0], half_dt = dts[1];
  const int64_t n_rec = n_steps / every;
  nj_run::AdviseHugePages(out, n * n_rec * static_cast<int64_t>(sizeof(Out)));
  const int64_t outer = n / inner;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i0 = 0; i0 < inner; i0 += kBlock) {
      const int64_t k0 = o * inner + i0;
      const int64_t m = std::min(kBlock, inner - i0);
      Out* rows = out + o * n_rec * inner + i0;
      if (euler) {
        LifBlock<F, true, Out>(v + k0, r + k0, v_inf + k0, c + k0, v_reset + k0, v_th + k0,
                               t_ref + k0, dt, half_dt, rows, inner, m, n_steps, every);
      } else {
        LifBlock<F, false, Out>(v + k0, r + k0, v_inf + k0, c + k0, v_reset + k0, v_th + k0,
                                t_ref + k0, dt, half_dt, rows, inner, m, n_steps, every);
      }
    }
  }
}

ffi::Error LifRunImpl(ffi::AnyBuffer v, ffi::AnyBuffer r, ffi::AnyBuffer v_inf, ffi::AnyBuffer c,
                      ffi::AnyBuffer v_reset, ffi::AnyBuffer v_th, ffi::AnyBuffer t_ref,
                      ffi::AnyBuffer dts, ffi::Result<ffi::AnyBuffer> v_out,
                      ffi::Result<ffi::AnyBuffer> r_out, ffi::Result<ffi::AnyBuffer> spikes,
                      int64_t n_steps, int64_t inner, int64_t euler, int64_t every) {
  const auto type = v.element_type();
  const int64_t n = static_cast<int64_t>(v.element_count());
  for (const ffi::AnyBuffer* b : {&r, &v_inf, &c, &v_reset, &v_th, &t_ref}) {
    if (b->element_type() != type || static_cast<int64_t>(b->element_count()) != n) {
      return ffi::Error::InvalidArgument(
          "nj_lif_run: state and parameters must share dtype and size");
    }
  }
  // The recorded spikes: a bool raster (every == 1), else counts per window of `every` steps,
  // uint8 up to 255 steps and int32 beyond (as neurojax._simulate._count_dtype).
  const auto out_type = spikes->element_type();
  const bool out_ok = every == 1 ? out_type == ffi::DataType::PRED
                                 : out_type == (every <= 255 ? ffi::DataType::U8
                                                             : ffi::DataType::S32);
  // Under vmap (broadcast_all) dts arrives repeated once per batch entry; all rows are equal.
  if (dts.element_type() != type || dts.element_count() < 2 || dts.element_count() % 2 != 0 ||
      v_out->element_type() != type || r_out->element_type() != type || !out_ok ||
      static_cast<int64_t>(v_out->element_count()) != n ||
      static_cast<int64_t>(r_out->element_count()) != n) {
    return ffi::Error::InvalidArgument("nj_lif_run: unexpected dtypes");
  }
  if (inner <= 0 || n_steps < 0 || every <= 0 || n_steps % every != 0 || n % inner != 0 ||
      static_cast<int64_t>(spikes->element_count()) != n * (n_steps / every)) {
    return ffi::Error::InvalidArgument("nj_lif_run: spike record size does not match the run");
  }
  const auto call = [&](auto zero, auto out_zero) {
    using F = decltype(zero);
    using Out = decltype(out_zero);
    const auto in = [](const ffi::AnyBuffer& b) { return static_cast<const F*>(b.untyped_data()); };
    LifRun<F, Out>(in(v), in(r), in(v_inf), in(c), in(v_reset), in(v_th), in(t_ref), in(dts),
                   static_cast<F*>(v_out->untyped_data()), static_cast<F*>(r_out->untyped_data()),
                   static_cast<Out*>(spikes->untyped_data()), n, inner, n_steps, every,
                   euler != 0);
  };
  const auto with_float = [&](auto out_zero) {
    if (type == ffi::DataType::F32) {
      call(0.0f, out_zero);
    } else {
      call(0.0, out_zero);
    }
  };
  if (type != ffi::DataType::F32 && type != ffi::DataType::F64) {
    return ffi::Error::InvalidArgument("nj_lif_run: float32 or float64 expected");
  }
  if (out_type == ffi::DataType::S32) {
    with_float(int32_t{0});
  } else {
    with_float(uint8_t{0});  // bool (PRED) is one byte 0/1, as uint8
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjLifRun, nj_ffi::Ordered<LifRunImpl>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // v (n)
                                  .Arg<ffi::AnyBuffer>()   // refractory (n)
                                  .Arg<ffi::AnyBuffer>()   // v_inf (n)
                                  .Arg<ffi::AnyBuffer>()   // c: decay or dt / tau_m (n)
                                  .Arg<ffi::AnyBuffer>()   // v_reset (n)
                                  .Arg<ffi::AnyBuffer>()   // v_th (n)
                                  .Arg<ffi::AnyBuffer>()   // t_ref (n)
                                  .Arg<ffi::AnyBuffer>()   // (dt, dt / 2)
                                  .Ret<ffi::AnyBuffer>()   // v (n)
                                  .Ret<ffi::AnyBuffer>()   // refractory (n)
                                  .Ret<ffi::AnyBuffer>()   // spikes (n_steps / every * n)
                                  .Attr<int64_t>("n_steps")
                                  .Attr<int64_t>("inner")
                                  .Attr<int64_t>("euler")
                                  .Attr<int64_t>("every"));
