// A whole run of an uncoupled Hodgkin-Huxley population on CPU in one call through XLA's FFI
// (neurojax.neurons._hh_fused, used by `nj.simulate` for `nj.HodgkinHuxley` with no input or
// a constant input, spikes recorded as the bool raster or as counts, no recorded state field).
//
// nj_hh_run: for every neuron and step, `HodgkinHuxley.step` with its method ("rk4" or
// "exp_euler"): the same equations, rate functions and order of updates, and the same spike
// test (an upward crossing of v_spike within the step, dated at its end). The arithmetic is
// not the XLA program's operation for operation, so results agree with the general path to
// rounding, not to the bit:
//   - exponentials: a vectorisable exp (range reduction by ln 2, then in single precision
//     the polynomial of Moshier's Cephes `expf`, in double precision the Taylor series to
//     degree 13; error about 1 ulp), and expm1 built from the same reduction.
//   - exp(-(v + 65)/20) is taken as exp(-(v + 65)/80)^4 (three exponentials serve the six
//     rates instead of four), and dv/dt multiplies by 1/c_m instead of dividing by c_m.
//   - fused multiply-adds where the CPU has them, in the exponentials' polynomials.
//
// Why a kernel: XLA:CPU evaluates an RK4 step as 23 loop fusions that stream every
// intermediate through memory (about 400 KB each at 10^5 neurons, more than L2) and pays a
// thread synchronisation after each of them. Here blocks of neurons small enough for the L1
// cache run all steps, each step of a neuron in registers, and the blocks are shared out
// between the threads of XLA's intra-op thread pool.
//
// Arguments (all of one float dtype, n elements each): v, m, h, n, i (input current), c_m,
// g_na, g_k, g_l, e_na, e_k, e_l, v_spike; dts: dt in that dtype, shape (1,) (one row per
// batch entry under vmap, all equal). Results: v, m, h, n (n,), spikes: bool (n_steps * n),
// or counts of each window of `every` steps, uint8 or int32 (n_steps / every * n). `inner`
// is the number of neurons of one run: leading dimensions added by vmap become the raster's
// outer axis, before time.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "xla/ffi/api/ffi.h"
#include "xla_order.h"

namespace ffi = xla::ffi;

namespace {

#define NJ_INLINE inline __attribute__((always_inline))

using nj_run::MulAdd;  // a * b + c, rounded as XLA:CPU rounds it (common.h)

// exp(x) without branches, so that loops calling it vectorise: x = n ln2 + r with
// |r| <= ln2 / 2 (n by adding and subtracting 1.5 * 2^23, or 2^52: rounding to an integer),
// ln2 split in two parts so that n * kLn2Hi is exact; e^r = 1 + r + r^2 p(r); 2^n built
// directly in the exponent bits. x is first clamped to the range where the result is a
// normal number (a NaN passes through). Returned as (e^r - 1, 2^n), from which both exp and
// an expm1 without cancellation near 0 follow.
template <typename F>
struct ExpParts {
  F pm1;    // e^r - 1
  F scale;  // 2^n
};

// Single precision: the split of ln2 and the polynomial of Moshier's Cephes Math Library
// `expf` (relative error about 1e-7 on the reduced range).
NJ_INLINE ExpParts<float> ExpReduce(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float shifted = MulAdd(x, kLog2e, kRound);
  const float n = shifted - kRound;
  float r = MulAdd(n, -kLn2Hi, x);
  r = MulAdd(n, -kLn2Lo, r);
  float p = 1.9875691500e-4f;
  p = MulAdd(p, r, 1.3981999507e-3f);
  p = MulAdd(p, r, 8.3334519073e-3f);
  p = MulAdd(p, r, 4.1665795894e-2f);
  p = MulAdd(p, r, 1.6666665459e-1f);
  p = MulAdd(p, r, 5.0000001201e-1f);
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  const int32_t e = (bits - 0x4B400000 + 127) << 23;  // the low bits of `shifted` hold n
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  return {MulAdd(p, r * r, r), scale};
}

// Double precision: the split of ln2 of Cephes' `exp`, and the Taylor series of e^r to
// r^13 (the first term left out, r^14 / 14!, is below 1e-17 for |r| <= ln2 / 2).
NJ_INLINE ExpParts<double> ExpReduce(double x) {
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 6.93145751953125e-1;
  constexpr double kLn2Lo = 1.42860682030941723212e-6;
  constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52
  x = std::min(std::max(x, -708.0), 709.0);
  const double shifted = MulAdd(x, kLog2e, kRound);
  const double n = shifted - kRound;
  double r = MulAdd(n, -kLn2Hi, x);
  r = MulAdd(n, -kLn2Lo, r);
  // 1/k! for k = 13 .. 2
  double p = 1.0 / 6227020800.0;
  p = MulAdd(p, r, 1.0 / 479001600.0);
  p = MulAdd(p, r, 1.0 / 39916800.0);
  p = MulAdd(p, r, 1.0 / 3628800.0);
  p = MulAdd(p, r, 1.0 / 362880.0);
  p = MulAdd(p, r, 1.0 / 40320.0);
  p = MulAdd(p, r, 1.0 / 5040.0);
  p = MulAdd(p, r, 1.0 / 720.0);
  p = MulAdd(p, r, 1.0 / 120.0);
  p = MulAdd(p, r, 1.0 / 24.0);
  p = MulAdd(p, r, 1.0 / 6.0);
  p = MulAdd(p, r, 0.5);
  int64_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  const int64_t e = (bits - 0x4338000000000000 + 1023) << 52;  // the low bits hold n
  double scale;
  std::memcpy(&scale, &e, sizeof scale);
  return {MulAdd(p, r * r, r), scale};
}

template <typename F>
NJ_INLINE F Exp(F x) {
  const ExpParts<F> q = ExpReduce(x);
  return MulAdd(q.pm1, q.scale, q.scale);  // 2^n (1 + (e^r - 1))
}

// e^x - 1 without cancellation near 0: 2^n (e^r - 1) + (2^n - 1), exact in the second term.
template <typename F>
NJ_INLINE F Expm1(F x) {
  const ExpParts<F> q = ExpReduce(x);
  return MulAdd(q.pm1, q.scale, q.scale - F(1));
}

template <typename F>
struct Params {
  F i, inv_c, g_na, g_k, g_l, e_na, e_k, e_l;
};

// x / (1 - e^-x) as (numerator, denominator), given x and e^-x, with the Taylor series near
// the removable singularity at 0 (as neurojax.neurons._hodgkin_huxley._bernoulli).
template <typename F>
NJ_INLINE void Bernoulli(F x, F e_minus_x, F& num, F& den) {
  constexpr F kDelta = sizeof(F) == 4 ? F(0.5) : F(0.01);
  const bool small = std::abs(x) < kDelta;
  const F x2 = x * x;
  const F series =
      F(1) + F(0.5) * x + x2 * (F(1.0 / 12.0) + x2 * (F(-1.0 / 720.0) + x2 * F(1.0 / 30240.0)));
  num = small ? series : x;
  den = small ? F(1) : F(1) - e_minus_x;
}

// The rates of `hh_rates` as numerators and denominators: alpha_m = a_m / d_m,
// beta_h = 1 / d_h, alpha_n = a_n / d_n.
template <typename F>
struct Rates {
  F a_m, d_m, beta_m, alpha_h, d_h, a_n, d_n, beta_n;
};

template <typename F>
NJ_INLINE Rates<F> RateTerms(F v) {
  constexpr F kE3 = F(20.085536923187668);   // e^3
  constexpr F kE2_5 = F(12.182493960703473);  // e^2.5
  constexpr F kE1 = F(2.718281828459045);     // e
  Rates<F> q;
  const F u = v + F(65);
  const F e10 = Exp(u * F(-0.1));
  Bernoulli((v + F(40)) * F(0.1), kE2_5 * e10, q.a_m, q.d_m);
  F a_n;
  Bernoulli((v + F(55)) * F(0.1), kE1 * e10, a_n, q.d_n);
  q.a_n = F(0.1) * a_n;
  q.beta_m = F(4) * Exp(u * F(-1.0 / 18.0));
  const F e80 = Exp(u * F(-1.0 / 80.0));
  const F e40 = e80 * e80;
  q.alpha_h = F(0.07) * (e40 * e40);
  q.d_h = F(1) + kE3 * e10;
  q.beta_n = F(0.125) * e80;
  return q;
}

template <typename F>
NJ_INLINE void Derivatives(const Params<F>& p, F v, F m, F h, F n, F& dv, F& dm, F& dh, F& dn) {
  const Rates<F> q = RateTerms(v);
  const F n2 = n * n;
  const F i_ion =
      p.g_na * (m * m * m * h) * (v - p.e_na) + p.g_k * (n2 * n2) * (v - p.e_k) + p.g_l * (v - p.e_l);
  dv = (p.i - i_ion) * p.inv_c;
  dm = (q.a_m * (F(1) - m) - q.beta_m * m * q.d_m) / q.d_m;
  dh = (q.alpha_h * (F(1) - h) * q.d_h - h) / q.d_h;
  dn = (q.a_n * (F(1) - n) - q.beta_n * n * q.d_n) / q.d_n;
}

template <typename F>
NJ_INLINE void Rk4Step(const Params<F>& p, F dt, F& v, F& m, F& h, F& n) {
  const F half = F(0.5) * dt, sixth = dt / F(6);
  F v1, m1, h1, n1, v2, m2, h2, n2, v3, m3, h3, n3, v4, m4, h4, n4;
  Derivatives(p, v, m, h, n, v1, m1, h1, n1);
  Derivatives(p, v + half * v1, m + half * m1, h + half * h1, n + half * n1, v2, m2, h2, n2);
  Derivatives(p, v + half * v2, m + half * m2, h + half * h2, n + half * n2, v3, m3, h3, n3);
  Derivatives(p, v + dt * v3, m + dt * m3, h + dt * h3, n + dt * n3, v4, m4, h4, n4);
  v = v + sixth * ((v1 + v4) + F(2) * (v2 + v3));
  m = m + sixth * ((m1 + m4) + F(2) * (m2 + m3));
  h = h + sixth * ((h1 + h4) + F(2) * (h2 + h3));
  n = n + sixth * ((n1 + n4) + F(2) * (n2 + n3));
}

// (1 - e^-z) / z for z >= 0 (neurojax.neurons._hodgkin_huxley._phi).
template <typename F>
NJ_INLINE F Phi(F z) {
  const bool small = z < F(1e-4);
  const F zs = small ? F(1) : z;
  const F series = F(1) + z * (F(-0.5) + z * F(1.0 / 6.0));
  return small ? series : -Expm1(-zs) / zs;
}

template <typename F>
NJ_INLINE F Gate(F x, F alpha, F beta, F dt) {
  const F k = alpha + beta;
  const F x_inf = alpha / k;
  return x_inf + (x - x_inf) * Exp(-dt * k);
}

// Neurons per block: the 13 arrays of a block (19 for exp_euler) take 13 to 19 KB in float32,
// which fits the L1 cache.
constexpr int64_t kBlock = 256;

// Exponential Euler (HodgkinHuxley._exp_euler) in three passes over a block: the six rates
// at the step's starting v, then each gate advanced exactly with its rates frozen, then v
// advanced exactly for the updated conductances.
template <typename F>
void ExpEulerRates(int64_t m, const F* __restrict v, F (*__restrict rates)[kBlock]) {
  for (int64_t k = 0; k < m; ++k) {
    const Rates<F> q = RateTerms(v[k]);
    rates[0][k] = q.a_m / q.d_m;
    rates[1][k] = q.beta_m;
    rates[2][k] = q.alpha_h;
    rates[3][k] = F(1) / q.d_h;
    rates[4][k] = q.a_n / q.d_n;
    rates[5][k] = q.beta_n;
  }
}

template <typename F>
void ExpEulerGates(int64_t m, const F (*__restrict rates)[kBlock], F dt, F* __restrict mm,
                   F* __restrict hh, F* __restrict nn) {
  for (int64_t k = 0; k < m; ++k) {
    mm[k] = Gate(mm[k], rates[0][k], rates[1][k], dt);
    hh[k] = Gate(hh[k], rates[2][k], rates[3][k], dt);
    nn[k] = Gate(nn[k], rates[4][k], rates[5][k], dt);
  }
}

template <typename F>
NJ_INLINE F ExpEulerVoltage(const Params<F>& p, F dt, F v, F m, F h, F n) {
  const F n2 = n * n;
  const F g_na = p.g_na * (m * m * m * h);
  const F g_k = p.g_k * (n2 * n2);
  const F g_tot = g_na + g_k + p.g_l;
  const F dv_dt = p.i - g_na * (v - p.e_na) - g_k * (v - p.e_k) - p.g_l * (v - p.e_l);
  const F dt_c = dt * p.inv_c;
  return v + dt_c * Phi(dt_c * g_tot) * dv_dt;
}

using nj_run::FlagOf;

struct Arrays {
  const void* v_in[4];
  const void* par[9];  // i, c_m, g_na, g_k, g_l, e_na, e_k, e_l, v_spike
  void* v_out[4];
  void* out;
};

// All steps of the block of m neurons starting at neuron k0; its record rows start at out.
template <typename F, bool kRk4, typename Out>
void HhBlock(const Arrays& a, int64_t k0, int64_t m, Out* __restrict out, int64_t row_stride,
             int64_t n_steps, int64_t every, F dt) {
  F* __restrict v = static_cast<F*>(a.v_out[0]) + k0;
  F* __restrict mm = static_cast<F*>(a.v_out[1]) + k0;
  F* __restrict hh = static_cast<F*>(a.v_out[2]) + k0;
  F* __restrict nn = static_cast<F*>(a.v_out[3]) + k0;
  const auto par = [&](int j) { return static_cast<const F*>(a.par[j]) + k0; };
  // Per-block copies of the parameters, with 1 / c_m formed once.
  alignas(64) F i_[kBlock], inv_c[kBlock], g_na[kBlock], g_k[kBlock], g_l[kBlock];
  alignas(64) F e_na[kBlock], e_k[kBlock], e_l[kBlock], v_spike[kBlock];
  for (int64_t k = 0; k < m; ++k) {
    i_[k] = par(0)[k];
    inv_c[k] = F(1) / par(1)[k];
    g_na[k] = par(2)[k];
    g_k[k] = par(3)[k];
    g_l[k] = par(4)[k];
    e_na[k] = par(5)[k];
    e_k[k] = par(6)[k];
    e_l[k] = par(7)[k];
    v_spike[k] = par(8)[k];
  }
  constexpr F kScale = F(0.1);  // 1 / SPIKE_SCALE: the spike test as HodgkinHuxley.step has it
  FlagOf<F> flags[kBlock];
  FlagOf<F> counts[kBlock] = {};
  // exp_euler: the rates, the gates and the voltage in three loops over the block. One
  // neuron-step is a long chain of dependent operations (exponential, division, exponential,
  // expm1, division), too long for the CPU to overlap consecutive neurons in one loop body;
  // in three shorter loops it does.
  alignas(64) F rates[6][kBlock];
  for (int64_t t = 0; t < n_steps; ++t) {
    if (kRk4) {
      for (int64_t k = 0; k < m; ++k) {
        const Params<F> p{i_[k], inv_c[k], g_na[k], g_k[k], g_l[k], e_na[k], e_k[k], e_l[k]};
        const F v_old = v[k];
        F vk = v_old, mk = mm[k], hk = hh[k], nk = nn[k];
        Rk4Step(p, dt, vk, mk, hk, nk);
        v[k] = vk;
        mm[k] = mk;
        hh[k] = hk;
        nn[k] = nk;
        const bool above_new = (vk - v_spike[k]) * kScale >= F(0);
        const bool above_old = (v_old - v_spike[k]) * kScale >= F(0);
        flags[k] = (above_new && !above_old) ? FlagOf<F>(1) : FlagOf<F>(0);
      }
    } else {
      ExpEulerRates(m, v, rates);
      ExpEulerGates(m, rates, dt, mm, hh, nn);
      for (int64_t k = 0; k < m; ++k) {
        const Params<F> p{i_[k], inv_c[k], g_na[k], g_k[k], g_l[k], e_na[k], e_k[k], e_l[k]};
        const F v_old = v[k];
        const F vk = ExpEulerVoltage(p, dt, v_old, mm[k], hh[k], nn[k]);
        v[k] = vk;
        const bool above_new = (vk - v_spike[k]) * kScale >= F(0);
        const bool above_old = (v_old - v_spike[k]) * kScale >= F(0);
        flags[k] = (above_new && !above_old) ? FlagOf<F>(1) : FlagOf<F>(0);
      }
    }
    nj_run::RecordStep(flags, counts, out, row_stride, m, t, every);
  }
}

template <typename F, typename Out>
ffi::Error HhRun(const Arrays& a, int64_t n, int64_t inner, int64_t n_steps, int64_t every,
                 bool rk4, F dt, ffi::ThreadPool& pool) {
  for (int j = 0; j < 4; ++j) {
    if (a.v_out[j] != a.v_in[j]) std::memcpy(a.v_out[j], a.v_in[j], n * sizeof(F));
  }
  const int64_t n_rec = n_steps / every;
  Out* out = static_cast<Out*>(a.out);
  nj_run::AdviseHugePages(out, n * n_rec * static_cast<int64_t>(sizeof(Out)));
  const int64_t per_run = (inner + kBlock - 1) / kBlock;
  const int64_t outer = n / inner;
  // The blocks are shared between the threads of XLA's pool; each writes its own neurons.
  nj_run::RunTasks(outer * per_run, pool, [=](int64_t b) {
    const int64_t o = b / per_run, i0 = (b % per_run) * kBlock;
    const int64_t m = std::min(kBlock, inner - i0);
    Out* rows = out + o * n_rec * inner + i0;
    if (rk4) {
      HhBlock<F, true, Out>(a, o * inner + i0, m, rows, inner, n_steps, every, dt);
    } else {
      HhBlock<F, false, Out>(a, o * inner + i0, m, rows, inner, n_steps, every, dt);
    }
  });
  return ffi::Error::Success();
}

ffi::Error HhRunImpl(ffi::ThreadPool pool, ffi::AnyBuffer v, ffi::AnyBuffer m, ffi::AnyBuffer h,
                     ffi::AnyBuffer n, ffi::AnyBuffer i, ffi::AnyBuffer c_m, ffi::AnyBuffer g_na,
                     ffi::AnyBuffer g_k, ffi::AnyBuffer g_l, ffi::AnyBuffer e_na,
                     ffi::AnyBuffer e_k, ffi::AnyBuffer e_l, ffi::AnyBuffer v_spike,
                     ffi::AnyBuffer dts, ffi::Result<ffi::AnyBuffer> v_out,
                     ffi::Result<ffi::AnyBuffer> m_out, ffi::Result<ffi::AnyBuffer> h_out,
                     ffi::Result<ffi::AnyBuffer> n_out, ffi::Result<ffi::AnyBuffer> spikes,
                     int64_t n_steps, int64_t inner, int64_t rk4, int64_t every) {
  const auto type = v.element_type();
  const int64_t size = static_cast<int64_t>(v.element_count());
  if (type != ffi::DataType::F32 && type != ffi::DataType::F64) {
    return ffi::Error::InvalidArgument("nj_hh_run: float32 or float64 expected");
  }
  Arrays a;
  const ffi::AnyBuffer* ins[13] = {&v, &m, &h, &n, &i, &c_m, &g_na, &g_k, &g_l,
                                   &e_na, &e_k, &e_l, &v_spike};
  for (int j = 0; j < 13; ++j) {
    if (ins[j]->element_type() != type || static_cast<int64_t>(ins[j]->element_count()) != size) {
      return ffi::Error::InvalidArgument(
          "nj_hh_run: state and parameters must share dtype and size");
    }
    (j < 4 ? a.v_in[j] : a.par[j - 4]) = ins[j]->untyped_data();
  }
  ffi::Result<ffi::AnyBuffer>* outs[4] = {&v_out, &m_out, &h_out, &n_out};
  for (int j = 0; j < 4; ++j) {
    if ((*outs[j])->element_type() != type ||
        static_cast<int64_t>((*outs[j])->element_count()) != size) {
      return ffi::Error::InvalidArgument("nj_hh_run: unexpected dtypes");
    }
    a.v_out[j] = (*outs[j])->untyped_data();
  }
  a.out = spikes->untyped_data();
  const auto out_type = spikes->element_type();
  const bool out_ok = every == 1 ? out_type == ffi::DataType::PRED
                                 : out_type == (every <= 255 ? ffi::DataType::U8
                                                             : ffi::DataType::S32);
  if (dts.element_type() != type || dts.element_count() < 1 || !out_ok) {
    return ffi::Error::InvalidArgument("nj_hh_run: unexpected dtypes");
  }
  if (inner <= 0 || n_steps < 0 || every <= 0 || n_steps % every != 0 || size % inner != 0 ||
      static_cast<int64_t>(spikes->element_count()) != size * (n_steps / every)) {
    return ffi::Error::InvalidArgument("nj_hh_run: spike record size does not match the run");
  }
  const auto call = [&](auto zero, auto out_zero) {
    using F = decltype(zero);
    using Out = decltype(out_zero);
    const F dt = static_cast<const F*>(dts.untyped_data())[0];
    return HhRun<F, Out>(a, size, inner, n_steps, every, rk4 != 0, dt, pool);
  };
  const auto with_float = [&](auto out_zero) {
    return type == ffi::DataType::F32 ? call(0.0f, out_zero) : call(0.0, out_zero);
  };
  // bool (PRED) is one byte 0/1, as uint8
  return out_type == ffi::DataType::S32 ? with_float(int32_t{0}) : with_float(uint8_t{0});
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NjHhRun, nj_ffi::Ordered<HhRunImpl>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()   // v (n)
                                  .Arg<ffi::AnyBuffer>()   // m (n)
                                  .Arg<ffi::AnyBuffer>()   // h (n)
                                  .Arg<ffi::AnyBuffer>()   // n (n)
                                  .Arg<ffi::AnyBuffer>()   // input current (n)
                                  .Arg<ffi::AnyBuffer>()   // c_m (n)
                                  .Arg<ffi::AnyBuffer>()   // g_na (n)
                                  .Arg<ffi::AnyBuffer>()   // g_k (n)
                                  .Arg<ffi::AnyBuffer>()   // g_l (n)
                                  .Arg<ffi::AnyBuffer>()   // e_na (n)
                                  .Arg<ffi::AnyBuffer>()   // e_k (n)
                                  .Arg<ffi::AnyBuffer>()   // e_l (n)
                                  .Arg<ffi::AnyBuffer>()   // v_spike (n)
                                  .Arg<ffi::AnyBuffer>()   // dt
                                  .Ret<ffi::AnyBuffer>()   // v (n)
                                  .Ret<ffi::AnyBuffer>()   // m (n)
                                  .Ret<ffi::AnyBuffer>()   // h (n)
                                  .Ret<ffi::AnyBuffer>()   // n (n)
                                  .Ret<ffi::AnyBuffer>()   // spikes (n_steps / every * n)
                                  .Attr<int64_t>("n_steps")
                                  .Attr<int64_t>("inner")
                                  .Attr<int64_t>("rk4")
                                  .Attr<int64_t>("every"));
