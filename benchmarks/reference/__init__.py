"""Generators of the reference data that neurojax's tests compare with (scripts, not tests).

Each runs a peer simulator (Brian2, NEST, eventax, jaxsnn) and writes a JSON file under
`tests/data/`, with the command that made it:

- `brian2_network_stats`: COBA and CUBA statistics from Brian2
  (`tests/data/brian2_coba_cuba_stats.json`, `tests/test_brette_statistics.py`);
- `eventprop_eventax`, `eventprop_jaxsnn`: first spike times and EventProp weight gradients of
  one 3 -> 4 -> 2 LIF network from eventax and jaxsnn (`tests/data/eventprop_eventax.json`,
  `tests/data/eventprop_jaxsnn.json`, `tests/test_eventprop.py`);
- `microcircuit_reference`: Potjans-Diesmann microcircuit statistics from NEST
  (`tests/data/microcircuit_nest_*.json`, `tests/test_microcircuit.py`);
- `microcircuit_single_neuron`: one NEST `iaf_psc_exp` trace with the microcircuit's
  parameters (`tests/data/microcircuit_nest_single_neuron.json`).
"""
