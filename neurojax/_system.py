"""What neurojax asks of the machine it runs on: memory available, private cache folders and
the `NEUROJAX_*` environment variables.

The bottom layer of the package (beside `_validation` and `_recording`): it imports nothing
from neurojax, so the kernels, the connectivity builders and `simulate` can all use it.
"""

import os
import stat
from pathlib import Path

import jax

__all__ = [
    "available_bytes",
    "cache_dir",
    "check_private_path",
    "env_choice",
    "env_flag",
]


# ----------------------------------------------------------------------------- environment

# The spellings of a yes/no environment variable, as pip and most CLIs read them.
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_choice(name: str, allowed: tuple[str, ...], default: str) -> str:
    """The value of the environment variable `name`, lower-cased and stripped, or `default`
    when it is unset or empty; any other value than `allowed` raises `ValueError` with one
    line naming the variable, the value and the values allowed."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value not in allowed:
        raise ValueError(
            f"neurojax: the environment variable {name}={raw!r} is not one of "
            f"{', '.join(allowed)}; set one of those or unset it"
        )
    return value


def env_flag(name: str, default: bool) -> bool:
    """A yes/no environment variable: `1/true/yes/on` or `0/false/no/off` (any case), else
    `ValueError` naming the variable and the values allowed; `default` when unset or empty."""
    value = env_choice(name, _TRUE + _FALSE, "1" if default else "0")
    return value in _TRUE


# ----------------------------------------------------------------------------- memory


def available_bytes(on_host: bool) -> int | None:
    """Memory a recording or a build may use: the device's limit where JAX reports one (GPU,
    TPU) unless `on_host`, else the host's available memory (Linux `MemAvailable`); None when
    unknown."""
    if not on_host:
        try:
            stats = jax.devices()[0].memory_stats() or {}
        except Exception:  # noqa: BLE001  (backends without memory statistics)
            stats = {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# ----------------------------------------------------------------------------- caches


def cache_dir() -> Path:
    """neurojax's cache folder (compiled kernels, `xla/` for XLA's compiled programs):
    `$NEUROJAX_CACHE_DIR`, else `$XDG_CACHE_HOME/neurojax`, else `~/.cache/neurojax`."""
    base = os.environ.get("NEUROJAX_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "neurojax"


def check_private_path(owner: str, path: Path, what: str) -> None:
    """Refuse a cache folder or file that another user could have written.

    As compilers' and package managers' caches do (ccache, pip): the path must be owned by
    this process's user and carry no group or other write permission; a folder must not be
    a symbolic link owned by someone else either. A library or compiled program found there
    is executed, so anything another user can replace is code that user runs as you.
    Raises `PermissionError`; no check where the platform has no user ids (Windows).
    """
    if not hasattr(os, "getuid"):
        return
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    uid = os.getuid()
    if stat.S_ISLNK(info.st_mode):
        if info.st_uid != uid:
            raise PermissionError(
                f"{owner}: the {what} {str(path)!r} is a symbolic link owned by user id "
                f"{info.st_uid}, not by you ({uid}); refusing to use it"
            )
        info = os.stat(path)
    if info.st_uid != uid:
        raise PermissionError(
            f"{owner}: the {what} {str(path)!r} is owned by user id {info.st_uid}, not by you "
            f"({uid}); another user could place code there, refusing to use it (remove it, or "
            "point NEUROJAX_CACHE_DIR at a folder of your own)"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"{owner}: the {what} {str(path)!r} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}); refusing to use it (chmod go-w it, or point "
            "NEUROJAX_CACHE_DIR at a folder of your own)"
        )
