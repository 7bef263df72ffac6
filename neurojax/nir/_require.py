"""The optional `nir` package, imported only when a conversion needs it."""

import importlib
from types import ModuleType


def require_nir(caller: str) -> ModuleType:
    """The `nir` module, or an `ImportError` that says how to install it."""
    try:
        return importlib.import_module("nir")
    except ImportError as err:
        raise ImportError(
            f"{caller} needs the `nir` package (the Neuromorphic Intermediate Representation), "
            "which is not installed; install it with `pip install 'neurojax[nir]'` or "
            "`pip install 'nir>=1.0'`"
        ) from err
