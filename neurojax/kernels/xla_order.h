// The ordering XLA gives the kernels' FFI calls, told to ThreadSanitizer. Part of the compiled
// library's source hash (neurojax.kernels._build).
//
// Every FFI handler of this folder is defined as
//   XLA_FFI_DEFINE_HANDLER_SYMBOL(NjX, nj_ffi::Ordered<XImpl>, binding)
// (tests/test_thread_determinism.py checks that none is missing). In a normal build
// `Ordered<XImpl>` is XImpl itself, called through an empty frame: nothing changes. In a
// ThreadSanitizer build (the slow test of tests/test_thread_determinism.py) the call acquires
// one synchronisation object when it starts and releases it when it ends.
//
// Why. XLA:CPU runs a step's operations on its own threads (the thread that runs the program
// and the workers of its Eigen pool) and reuses the slices of one temporary buffer, allocated
// by the client thread for the whole execution, for values whose lifetimes do not overlap: the
// slice that one kernel call wrote (a ring it zeroed, a weight array) can hold, a few
// operations later, the spikes that another kernel call reads, on another thread. XLA orders
// the two through its thunk executor (atomics in libjax_common, which is not instrumented),
// so ThreadSanitizer sees two accesses of one heap block by two threads with nothing between
// them and reports a race. The report of the slow test was of that kind: a read of the spikes
// at csr_deliver.cc:195, which is the one-thread path of the delivery (reached only with one
// thread set, so no worker of the pool existed), on an XLA Eigen thread, in a block
// "allocated by main thread". With ignore_noninstrumented_modules=1 ThreadSanitizer records
// only this library's accesses, so the other access was another call of these kernels, on
// another XLA thread, and nothing but XLA's executor ordered the two. The edge added here is
// the one XLA guarantees: a kernel call that starts after another kernel call ended runs
// after it.
//
// What it does not hide: an access by the pool's workers is never ordered by it (only the
// thread that XLA called acquires and releases), so races between the workers and the caller
// inside a call, and between one call's workers and the next call, are reported as before;
// and two kernel calls that overlap in time (two XLA threads at once, where the pool's
// try-lock sends the second call to its own thread) are ordered only by the pool's own
// synchronisation.

#ifndef NEUROJAX_KERNELS_XLA_ORDER_H_
#define NEUROJAX_KERNELS_XLA_ORDER_H_

#include <utility>

#if defined(__SANITIZE_THREAD__)
#define NJ_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NJ_TSAN 1
#endif
#endif

#if defined(NJ_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace nj_ffi {

// Held for the length of one FFI call (see the header).
class XlaOrder {
 public:
#if defined(NJ_TSAN)
  XlaOrder() { __tsan_acquire(&token_); }
  ~XlaOrder() { __tsan_release(&token_); }

 private:
  static inline char token_ = 0;
#endif
};

template <auto Fn>
struct OrderedCall;

template <typename R, typename... A, R (*Fn)(A...)>
struct OrderedCall<Fn> {
  static R Call(A... args) {
    const XlaOrder order;
    return Fn(std::move(args)...);
  }
};

// The FFI implementation `Fn` under XLA's ordering (see the header).
template <auto Fn>
constexpr auto Ordered = &OrderedCall<Fn>::Call;

}  // namespace nj_ffi

#endif  // NEUROJAX_KERNELS_XLA_ORDER_H_
