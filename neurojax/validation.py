"""Parameter conversion and checks for models, the ones the built-in models use.

A model converts each physical parameter with `as_float` (its `eqx.field` converter) and
checks them once, in `__check_init__`, with the `check_*` helpers; `init_state` turns its
`shape` argument into a tuple with `normalize_shape` and checks per-neuron parameters with
`check_broadcast`. Every message names the owner (the class), the parameter, the rule and
the value received: `"LIF: tau_m must be > 0 ms, got -1.0"`. The checks skip traced values
(a model built inside `jit` or `vmap`), which cannot be read without a host
synchronisation. The helpers that a model's `step` shares (`input_current`,
`refractory_clamped`, `refractory_next`) are in `neurojax.neurons`; the page
[Write your own model](../concepts/write-your-own-model.md) uses both.
"""

from ._validation import as_float as as_float
from ._validation import check_broadcast as check_broadcast
from ._validation import check_choice as check_choice
from ._validation import check_dt as check_dt
from ._validation import check_finite as check_finite
from ._validation import check_less as check_less
from ._validation import check_nonnegative as check_nonnegative
from ._validation import check_positive as check_positive
from ._validation import check_positive_int as check_positive_int
from ._validation import default_float as default_float
from ._validation import is_concrete as is_concrete
from ._validation import normalize_shape as normalize_shape

__all__ = [
    "as_float",
    "default_float",
    "is_concrete",
    "check_finite",
    "check_positive",
    "check_nonnegative",
    "check_less",
    "check_choice",
    "check_broadcast",
    "check_dt",
    "check_positive_int",
    "normalize_shape",
]
