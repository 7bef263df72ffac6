"""JAX's persistent compilation cache, in a folder the user owns.

XLA compiles every jitted program on its first call in a process: for the COBA network's run
about 1 s on a 2-core machine, paid again by every new process. JAX can keep the compiled
programs on disk and reuse them in later processes whose program is the same (a process still
traces its programs, which takes a fraction of the compilation); this module turns that on in
neurojax's cache folder.

Where it is on:
- `neurojax run` (the command line): on by default (`--no-compilation-cache` or
  `NEUROJAX_COMPILATION_CACHE=0` turn it off). A command owns its process.
- From Python: off until asked, with one call, `nj.enable_compilation_cache()`, or for every
  script at once with `NEUROJAX_COMPILATION_CACHE=1` in the environment (read at `import
  neurojax`). Importing a library does not change a JAX setting that every other program of
  the process shares (JAX's own default is off): a JAX user's own jitted functions would
  otherwise be written to disk too.
Either way a compilation cache the user configured for JAX (`JAX_COMPILATION_CACHE_DIR`, or
`jax.config.update("jax_compilation_cache_dir", ...)`) is kept as it is: neurojax's programs
go to that folder.
"""

import os
from pathlib import Path

import jax

from ._system import cache_dir, check_private_path

__all__ = ["enable_compilation_cache", "compilation_cache_dir"]

_ENV_DIR = "NEUROJAX_COMPILATION_CACHE_DIR"
_ENV_SWITCH = "NEUROJAX_COMPILATION_CACHE"


def compilation_cache_dir() -> Path:
    """Where `enable_compilation_cache()` keeps compiled programs by default:
    `$NEUROJAX_COMPILATION_CACHE_DIR`, else `xla/` in neurojax's cache folder
    (`$NEUROJAX_CACHE_DIR`, else `$XDG_CACHE_HOME/neurojax` or `~/.cache/neurojax`)."""
    explicit = os.environ.get(_ENV_DIR)
    if explicit:
        return Path(explicit)
    return cache_dir() / "xla"


def enable_compilation_cache(
    path: str | os.PathLike | None = None, *, min_compile_time_s: float = 0.0
) -> Path:
    """Keep XLA's compiled programs on disk and reuse them in later processes.

    Args:
        path: the folder (created if missing); default `compilation_cache_dir()`. It holds
            one file per compiled program (a few kB to a few MB each) and may be deleted at
            any time; JAX recompiles what is missing. It must belong to you and be writable
            by no other user (no group or other write bit): a shared folder is refused with a
            `ValueError`, as compilers' caches refuse one, since its programs are executed;
            so is a folder inside neurojax's cache folder (the default) when that one is
            shared, as the compiled kernels refuse it. A path that is not a folder (a file, a
            number) is refused with the same errors, before anything is created.
        min_compile_time_s: cache only programs that took at least this long to compile
            (0: all of them, the small samplers of connectivity builders included, which is
            what makes a repeated build fast).

    Returns the folder in use. Call it before the first compilation you want cached (at the
    top of a script or notebook; programs compiled before the call are not written). A
    cached program is reused only by a process whose program, JAX version, device and flags
    are the same; anything else compiles as usual.

    Without `path`, a folder already configured for JAX's compilation cache
    (`JAX_COMPILATION_CACHE_DIR` or `jax.config.update("jax_compilation_cache_dir", ...)`)
    is kept, with its settings, and returned: neurojax does not move a cache you set up.
    `NEUROJAX_COMPILATION_CACHE=1` in the environment makes `import neurojax` call this (a
    folder that is refused then leaves the cache off with a warning); `neurojax run` calls
    it unless given `--no-compilation-cache` or `NEUROJAX_COMPILATION_CACHE=0`.

    Example:
    ```python
    import neurojax as nj
    nj.enable_compilation_cache()            # ~/.cache/neurojax/xla
    net, state = nj.models.coba(jax.random.key(0))   # fast from the second process on
    ```
    """
    if isinstance(min_compile_time_s, bool) or not isinstance(min_compile_time_s, (int, float)):
        raise TypeError(
            f"enable_compilation_cache: min_compile_time_s must be a number >= 0, got "
            f"{min_compile_time_s!r}"
        )
    if not min_compile_time_s >= 0:
        raise ValueError(
            f"enable_compilation_cache: min_compile_time_s must be >= 0, got {min_compile_time_s}"
        )
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            "enable_compilation_cache: path must be a folder (a str or os.PathLike) or None "
            f"for compilation_cache_dir(), got {type(path).__name__} {path!r:.60}"
        )
    folder = Path(path) if path is not None else compilation_cache_dir()
    configured = jax.config.jax_compilation_cache_dir
    if path is None and configured:
        return Path(configured)  # the user's own JAX cache, left as they set it
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"enable_compilation_cache: path {str(folder)!r} is not a folder (it is a file); "
            "pass a folder for the compiled programs"
        )
    # Compiled programs found there are executed: refuse what another user can write, and a
    # folder inside neurojax's cache folder when that one is refused (as the compiled kernels
    # refuse it), before anything is created in it.
    guarded = [folder]
    if folder.parent == cache_dir():
        guarded.insert(0, folder.parent)
    try:
        for place in guarded[:-1]:
            check_private_path("enable_compilation_cache", place, "neurojax cache folder")
        folder.parent.mkdir(parents=True, exist_ok=True)
        if not folder.exists():
            folder.mkdir(mode=0o700)
    except PermissionError as err:
        raise ValueError(str(err)) from None
    except OSError as err:
        raise ValueError(
            f"enable_compilation_cache: cannot create the cache folder {str(folder)!r}: {err}"
        ) from err
    try:
        check_private_path("enable_compilation_cache", folder, "compilation cache folder")
    except PermissionError as err:
        raise ValueError(str(err)) from None
    if not os.access(folder, os.W_OK):
        raise ValueError(f"enable_compilation_cache: the folder {str(folder)!r} is not writable")
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if configured and configured != str(folder):
        # JAX opens its cache once per process, at the first compilation after a folder is
        # set: a cache already opened at another folder is closed so the next one opens here.
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
    return folder


def _enable_from_environment() -> None:
    """`NEUROJAX_COMPILATION_CACHE=1` at `import neurojax`: the cache on for this process."""
    import warnings  # here, not with the module's imports: only this function warns

    value = os.environ.get(_ENV_SWITCH, "").strip()
    if value in ("", "0"):
        return
    if value != "1":
        warnings.warn(
            f"neurojax: {_ENV_SWITCH} must be 1 (compilation cache on) or 0 (off), got "
            f"{value!r}; the compilation cache stays off",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    try:
        enable_compilation_cache()
    except ValueError as err:
        warnings.warn(
            f"neurojax: {_ENV_SWITCH}=1 but the compilation cache stays off: {err}",
            RuntimeWarning,
            stacklevel=2,
        )


_enable_from_environment()
