"""Gradient-based training of spiking networks.

- Encoders turning static features into time-major spike or current sequences:
  `rate_encode`, `poisson_encode`, `latency_encode`, `current_encode`.
- Layers built from neurojax neuron models: `SpikingDense`, `SpikingRecurrent`,
  `LeakyReadout`, `Sequential`; `trainable` selects the leaves to train. With
  `sparse_input=True` a layer's input product skips zero inputs (`spike_matmul`).
- Convolution and pooling: the operations `conv1d`, `conv2d`, `sum_pool2d`, `avg_pool2d`,
  `conv_output_shape` on `(*batch, channels, *spatial)` arrays (PyTorch's conventions) and
  the layers `SpikingConv1d`, `SpikingConv2d`, `SumPool2d`, `AvgPool2d`, `Flatten` (bases
  `SpikingConv` and `StatelessLayer`).
- Readouts and losses on time-major outputs: `spike_count_cross_entropy`,
  `max_membrane_cross_entropy`, `rate_mse`, `rate_regularizer`, `accuracy`,
  `spike_counts`, `firing_rates`.
- An optax loop: `make_train_step` (jitted value, gradient and update, vmapped over the
  batch), `init_opt_state` and `fit` (epochs of shuffled batches, metrics, progress).

Memory and long sequences: `simulate` and every layer take `checkpoint=True` (rematerialise
each step in the backward pass) and `truncate_backprop=K` (truncated backpropagation through
time).
"""

from .._eventprop import EventNetwork as EventNetwork
from .._eventprop import EventProjection as EventProjection
from .._eventprop import EventRecording as EventRecording
from .._eventprop import eventprop_run as eventprop_run
from ._conv import AvgPool2d as AvgPool2d
from ._conv import Flatten as Flatten
from ._conv import SpikingConv as SpikingConv
from ._conv import SpikingConv1d as SpikingConv1d
from ._conv import SpikingConv2d as SpikingConv2d
from ._conv import StatelessLayer as StatelessLayer
from ._conv import SumPool2d as SumPool2d
from ._conv import avg_pool2d as avg_pool2d
from ._conv import conv1d as conv1d
from ._conv import conv2d as conv2d
from ._conv import conv_output_shape as conv_output_shape
from ._conv import sum_pool2d as sum_pool2d
from ._datasets import latency_digits as latency_digits
from ._datasets import ttfs_encode as ttfs_encode
from ._datasets import yin_yang as yin_yang
from ._encoders import current_encode as current_encode
from ._encoders import latency_encode as latency_encode
from ._encoders import poisson_encode as poisson_encode
from ._encoders import rate_encode as rate_encode
from ._eventprop_losses import first_spike_accuracy as first_spike_accuracy
from ._eventprop_losses import first_spike_cross_entropy as first_spike_cross_entropy
from ._eventprop_losses import first_spike_mse as first_spike_mse
from ._eventprop_losses import first_spike_times as first_spike_times
from ._eventprop_losses import voltage_integral_cross_entropy as voltage_integral_cross_entropy
from ._eventprop_losses import voltage_max_cross_entropy as voltage_max_cross_entropy
from ._layers import LeakyReadout as LeakyReadout
from ._layers import ReadoutState as ReadoutState
from ._layers import RecurrentState as RecurrentState
from ._layers import Sequential as Sequential
from ._layers import SpikingDense as SpikingDense
from ._layers import SpikingRecurrent as SpikingRecurrent
from ._layers import default_neuron as default_neuron
from ._layers import trainable as trainable
from ._loop import FitResult as FitResult
from ._loop import fit as fit
from ._loop import init_opt_state as init_opt_state
from ._loop import make_train_step as make_train_step
from ._losses import accuracy as accuracy
from ._losses import firing_rates as firing_rates
from ._losses import max_membrane_cross_entropy as max_membrane_cross_entropy
from ._losses import rate_mse as rate_mse
from ._losses import rate_regularizer as rate_regularizer
from ._losses import spike_count_cross_entropy as spike_count_cross_entropy
from ._losses import spike_counts as spike_counts
from ._spike_matmul import spike_matmul as spike_matmul
