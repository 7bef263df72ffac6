"""neurojax's kernel layer: one registry of operations with a pure-JAX reference and faster
implementations per platform, one dispatch function, one build of the compiled CPU library,
and the public switch that chooses between them.

- `nj.kernels.use(mode)` / `set_mode(mode)` / `mode()`: `"auto"` (each platform's
  implementation where there is one) or `"reference"` (pure JAX everywhere); part of
  `jax.jit`'s cache key. `NEUROJAX_CPU_KERNEL=0` sets `"reference"` as a process's default.
- `nj.kernels.registry()`: every registered `Kernel` by name.
- `nj.kernels.cross_platform()`: trace every platform's implementation (by default only the
  default backend's), to lower a program for another machine's platform;
  `NEUROJAX_CROSS_PLATFORM=1` sets it for a process.
- `nj.kernels.interpret(slot)`: the CPU runs each entry's `"gpu"` or `"tpu"` implementation,
  Pallas kernels in interpret mode (how the accelerator kernels are tested without one);
  `NEUROJAX_PALLAS_INTERPRET=gpu` (or `tpu`) sets it as a process's default.
- `nj.kernels.whole_networks(enabled)`: let (default) or stop a network that fits one GPU
  program running whole (`network_run`); stopped, networks run step by step.
- `nj.kernels.explain(kernel, *args, **static)`: which implementation each platform runs
  for a call, and why (the mode, a missing slot, the entry's `supports`, the CPU library).
- `Kernel`, `call`, `register`, `Fold`, `Sequential`, `Example`: how a kernel is declared and
  run (see the Architecture page of the docs).
"""

from ._config import cross_platform as cross_platform
from ._config import mode as mode
from ._config import set_mode as set_mode
from ._config import use as use
from ._pallas import interpret as interpret
from ._pallas import interpret_mode as interpret_mode
from ._pallas_network import whole_networks as whole_networks
from ._registry import Batching as Batching
from ._registry import Example as Example
from ._registry import Fold as Fold
from ._registry import Kernel as Kernel
from ._registry import Sequential as Sequential
from ._registry import call as call
from ._registry import explain as explain
from ._registry import implementations as implementations
from ._registry import register as register
from ._registry import registry as registry
