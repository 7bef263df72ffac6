"""`import neurojax` without SciPy: `jax.experimental.sparse.linalg` loaded on first use.

neurojax's connectivity is `jax.experimental.sparse.BCOO`, so `import neurojax` imports
`jax.experimental.sparse`, whose `__init__` ends with `from jax.experimental.sparse import
linalg`, and that module imports `scipy.sparse` and `scipy.sparse.linalg` (for its sparse
eigen- and linear solvers, which neurojax never calls). SciPy is then about a third of the
import's time, paid by every script and command that never touches it.

`defer_sparse_linalg()` (called first thing by `neurojax/__init__.py`) puts a stand-in for
that one module into `sys.modules` before `jax.experimental.sparse` is imported: the package
binds the stand-in as its `linalg`, and the first attribute read from it (for example
`jax.experimental.sparse.linalg.spsolve`) imports the real module, which then replaces the
stand-in in `sys.modules` and in the package, so every later access is the module itself.
Nothing changes when `jax.experimental.sparse` or SciPy is already imported, or when the
module cannot be found where this JAX keeps it.
"""

import importlib
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

__all__ = ["defer_sparse_linalg"]

_LINALG = "jax.experimental.sparse.linalg"


class _DeferredModule(types.ModuleType):
    """Stands in for a module until the first attribute that it does not hold is read."""

    def _load(self) -> types.ModuleType:
        real = self.__dict__.get("_deferred_real")
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            # Imports it as if for the first time; the import system also sets it as the
            # attribute of its package, over the stand-in.
            real = importlib.import_module(self.__name__)
            self._deferred_real = real
        return real

    def __getattr__(self, name: str) -> Any:
        # Only called for names not in the stand-in's own namespace (its __name__, __spec__,
        # __path__ ... are, so the import system can look at it without loading it).
        return getattr(self._load(), name)

    def __dir__(self) -> list[str]:
        return dir(self._load())


def defer_sparse_linalg() -> None:
    """Put the stand-in for `jax.experimental.sparse.linalg` in place (see the module)."""
    if any(m in sys.modules for m in ("jax.experimental.sparse", _LINALG, "scipy.sparse")):
        return
    import jax.experimental

    folders = [str(Path(p) / "sparse") for p in jax.experimental.__path__]
    spec = importlib.machinery.PathFinder.find_spec(_LINALG, folders)
    if spec is None:
        return
    stand_in = _DeferredModule(_LINALG)
    stand_in.__spec__ = spec
    stand_in.__file__ = spec.origin
    stand_in.__loader__ = spec.loader
    stand_in.__package__ = "jax.experimental.sparse"
    sys.modules[_LINALG] = stand_in


defer_sparse_linalg()
