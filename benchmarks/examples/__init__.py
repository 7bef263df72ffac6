"""Experiments that reproduce published results or make the figures of the docs (scripts,
not timings):

- `stdp_song`: the Song, Miller and Abbott (2000) experiment (bimodal weights; a figure);
- `stdp_learn_rule`: gradient descent on STDP amplitudes through `nj.simulate`;
- `distal_reward`: the distal reward problem of Izhikevich (2007) in the paper's network;
- `surrogate_scale`: the scale of a surrogate gradient in a recurrent network against the
  slope of the simulated rate (the gradients page).
"""
