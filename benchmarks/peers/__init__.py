"""Peer implementations the benchmarks compare neurojax with.

- `_hh`: Hodgkin-Huxley constants, a plain vectorised NumPy RK4 and exponential-Euler
  integrator, the scipy reference solve and spike-time accuracy measure;
- `_lif`: a plain vectorised NumPy leaky integrate-and-fire population;
- `brian2_hh`, `brian2_lif`: Brian2 (cython runtime or C++ standalone), one process per
  configuration (`python -m benchmarks.peers.brian2_hh SPEC_JSON`);
- `jaxley_hh`: Jaxley single-compartment cells with its HH channel, one process per
  configuration.

Process-based peers print one JSON line and are started by `benchmarks._harness.run_peer`.
"""
