"""Benchmarks of neurojax against peer simulators (scripts, not tests).

Run one benchmark with `python -m benchmarks.NAME`, or every one of `run_all.BENCHMARKS`
with `python -m benchmarks.run_all` (`make bench`; `--quick` is the smoke run CI can afford).
Every script prints one JSON line per configuration on stdout and its progress on stderr.
`benchmarks/RESULTS.md` opens with the current figures and links the dated history in
`benchmarks/results/`.

The folder holds four kinds of script:

- timing scripts, here at the top (`python -m benchmarks.NAME`):
  - `hh_batch`, `lif_population`: single-neuron models against Brian2, Jaxley and NumPy;
  - `brette_networks`: the COBA and CUBA networks against Brian2 and brainpy-state;
  - `network_scale`: a 10^6-neuron, 10^8-synapse network (memory per synapse, steps/s);
  - `connect_scale`: building large sparse connectivity;
  - `stdp_overhead`, `plasticity`, `plasticity_stp`: the cost of STDP, of the other
    plasticity rules and of short-term plasticity and learnable delays on COBA;
  - `assembly`: assembly-calculus projection against a NumPy implementation of the
    reference algorithm (`peers/assembly_numpy.py`);
  - `training`: one forward+backward training step of a dense layer into LIF neurons
    against snnTorch, Norse and Spyx;
  - `parallel_scaling`: one network sharded over forced host devices;
  - `sweep`, `vmap_cost`: COBA parameter sweeps and the cost per trial of `vmap`;
  - `procedural`: procedural against stored connectivity;
  - `microcircuit`, `memory_stages`: the Potjans-Diesmann microcircuit against NEST, and
    where its memory goes;
  - `time_to_result`, `threads_default`: a user's whole command, and the default threads;
  - `gpu`: every GPU figure and its GPU peers in one time-limited run (`make bench-gpu`);
- `peers/`: the peer implementations the timing scripts run in their own processes;
- `reference/`: generators of the reference data in `tests/data/` (Brian2, NEST);
- `examples/`: experiments that reproduce published results or make the docs' figures;
- `tools/`: the machine's measured limits, the report renderer, interleaved before/after runs.
"""
