"""Benchmarks of neurojax against peer simulators (scripts, not tests).

Run one benchmark with `python -m benchmarks.NAME`, or those of `run_all.BENCHMARKS` with
`python -m benchmarks.run_all` (`make bench`). Every script prints one JSON line per
configuration on stdout and its progress on stderr; `--quick` runs a small smoke
configuration. `benchmarks/RESULTS.md` keeps the latest full runs.

- `hh_batch`, `lif_population`: single-neuron models against Brian2, Jaxley and NumPy.
- `brette_networks`: the COBA and CUBA networks against Brian2 and brainpy-state.
- `network_scale`: a 10^6-neuron, 10^8-synapse network (memory per synapse, steps/s).
- `connect_scale`: building large sparse connectivity.
- `stdp_overhead`: COBA with STDP on E->E against COBA without it, and against Brian2.
- `stdp_song`: the Song, Miller and Abbott (2000) experiment (bimodal weights; a figure).
- `stdp_learn_rule`: gradient descent on STDP amplitudes through `nj.simulate`.
- `assembly`: assembly-calculus projection against a NumPy implementation of the reference
  algorithm (`peers/assembly_numpy.py`), sparse mode at 10^6 and 10^7, a vmapped batch.
- `training`: one forward+backward training step of a dense layer into LIF neurons against
  snnTorch, Norse and Spyx.
- `parallel_scaling`: one network sharded over forced host devices (exchange cost, bytes).
- `sweep`: a COBA parameter sweep of 64 sets through `nj.parallel.sweep`, time per trial.
- `gpu`: every GPU figure and its GPU peers in one time-limited run (`make bench-gpu`).
- `brian2_network_stats`: writes the stored Brian2 statistics used by the tests.
"""
