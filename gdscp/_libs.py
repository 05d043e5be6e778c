"""Where NVIDIA's pieces are on this machine, as far as Python can tell."""

from __future__ import annotations

import functools

__all__ = ["cufile_wheel_library"]


# Once per process: the engine loads libcufile at its first use and ignores
# later hints, while the look itself (an import that may fail, a library
# search) costs tens of microseconds, more than opening a small file.
@functools.lru_cache(maxsize=1)
def cufile_wheel_library() -> str:
    """The nvidia-cufile wheel's libcufile, when cuda-pathfinder finds it; "" otherwise.
    The engine tries the system's libcufile.so.0 first and this path second."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # noqa: PLC0415 - optional

        return load_nvidia_dynamic_lib("cufile").abs_path or ""
    except Exception:  # noqa: BLE001 - not installed, or no wheel: the system library it is
        return ""
