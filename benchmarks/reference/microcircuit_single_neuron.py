"""NEST trace of one iaf_psc_exp with the microcircuit parameters, for the exactness test of
`nj.models.microcircuit` (tests/test_microcircuit.py::test_single_neuron_matches_nest).

Run: `python benchmarks/reference/microcircuit_single_neuron.py` (writes
tests/data/microcircuit_nest_single_neuron.json).
"""

import json

import nest
import numpy as np

nest.ResetKernel()
nest.set_verbosity("M_ERROR")
nest.resolution = 0.1
n = nest.Create(
    "iaf_psc_exp",
    params=dict(
        tau_syn_ex=0.5,
        tau_syn_in=0.5,
        E_L=-65.0,
        V_th=-50.0,
        V_reset=-65.0,
        t_ref=2.0,
        C_m=250.0,
        tau_m=10.0,
        I_e=300.0,
        V_m=-58.0,
    ),
)
ex_steps = [20, 21, 22, 60, 61, 62, 63, 64, 65, 66, 67, 68, 150, 151, 152, 153, 154, 155]
in_steps = [100, 101, 300]
ge = nest.Create("spike_generator", params={"spike_times": [(k + 1) * 0.1 for k in ex_steps]})
gi = nest.Create("spike_generator", params={"spike_times": [(k + 1) * 0.1 for k in in_steps]})
nest.Connect(ge, n, syn_spec={"weight": 2000.0, "delay": 1.5})
nest.Connect(gi, n, syn_spec={"weight": -1500.0, "delay": 0.8})
vm = nest.Create("voltmeter", params={"interval": 0.1})
sr = nest.Create("spike_recorder")
nest.Connect(vm, n)
nest.Connect(n, sr)
nest.Simulate(50.0)
ev = vm.get("events")
order = np.argsort(ev["times"])
doc = {
    "what": "one iaf_psc_exp (microcircuit parameters, I_e = 300 pA, V_m(0) = -58 mV) "
    "driven by spike_generators; V_m every 0.1 ms",
    "command": "python benchmarks/reference/microcircuit_single_neuron.py",
    "nest_version": nest.__version__,
    "exc_steps": ex_steps,
    "inh_steps": in_steps,
    "w_exc_pa": 2000.0,
    "w_inh_pa": -1500.0,
    "d_exc_ms": 1.5,
    "d_inh_ms": 0.8,
    "times_ms": np.asarray(ev["times"])[order].tolist(),
    "v_m": np.asarray(ev["V_m"])[order].tolist(),
    "spike_times_ms": np.asarray(sr.get("events")["times"]).tolist(),
}
json.dump(doc, open("tests/data/microcircuit_nest_single_neuron.json", "w"), indent=0)
print(doc["spike_times_ms"], len(doc["v_m"]), doc["times_ms"][:3])
