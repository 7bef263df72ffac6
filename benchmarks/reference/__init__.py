"""Generators of the reference data that neurojax's tests compare with (scripts, not tests).

Each runs a peer simulator (Brian2, NEST) and writes a JSON file under `tests/data/`, with the
command that made it:

- `brian2_network_stats`: COBA and CUBA statistics from Brian2
  (`tests/data/brian2_coba_cuba_stats.json`, `tests/test_brette_statistics.py`);
- `microcircuit_reference`: Potjans-Diesmann microcircuit statistics from NEST
  (`tests/data/microcircuit_nest_*.json`, `tests/test_microcircuit.py`);
- `microcircuit_single_neuron`: one NEST `iaf_psc_exp` trace with the microcircuit's
  parameters (`tests/data/microcircuit_nest_single_neuron.json`).
"""
