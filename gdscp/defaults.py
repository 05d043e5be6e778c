"""Process-wide settings, with KvikIO's interface.

``get(name)``, ``set(name, value)`` and ``set({...})``; ``set`` also works as
a context manager that restores the previous values. Each setting starts from
its ``GDSCP_*`` environment variable when that is set, else from the engine's
built-in default (``_core.Settings()`` and ``_core.default_num_threads()``).
This is the only module that reads those variables.

Settings: ``compat_mode`` (ON: never cuFile; OFF: cuFile or an error; AUTO:
cuFile where GPUDirect Storage really works), ``num_threads`` (the worker
pool), ``task_size`` (largest chunk of a request one worker takes),
``gds_threshold`` (requests below it run on the calling thread),
``bounce_buffer_size`` (pinned staging buffer size), and gdscp's own
``direct_io`` ("auto": O_DIRECT for writes of 4 MiB and more, reads through
the page cache; "on": O_DIRECT for the aligned middle of every read and write
of 1 MiB and more; "off": never), ``min_task_size`` (medium requests are split
down to this size so every worker gets a share), ``pipeline_depth`` (staging
buffers in flight per worker) and ``mapped_reads`` (True: reads into host
memory of data already in the page cache copy it through a read-only mapping
with streaming stores instead of pread; False: always pread).
"""
from __future__ import annotations

import enum
import os
from typing import Any, Callable

from . import _core

__all__ = [
    "CompatMode",
    "current",
    "get",
    "set",
    "compat_mode",
    "num_threads",
    "task_size",
    "gds_threshold",
    "bounce_buffer_size",
    "is_compat_mode_preferred",
]


class CompatMode(enum.IntEnum):
    """When cuFile is used for device memory (the numbering matches the engine)."""

    OFF = 0
    ON = 1
    AUTO = 2


_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n"}


def _parse_compat_mode(name: str, value: Any) -> CompatMode:
    if isinstance(value, CompatMode):
        return value
    if isinstance(value, bool):
        return CompatMode.ON if value else CompatMode.OFF
    if isinstance(value, int) and value in (0, 1, 2):
        return CompatMode(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return CompatMode.AUTO
        if text in _TRUE:
            return CompatMode.ON
        if text in _FALSE:
            return CompatMode.OFF
    raise ValueError(f"invalid value for {name}: {value!r} (expected ON, OFF or AUTO)")


def _int_parser(minimum: int) -> Callable[[str, Any], int]:
    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"invalid value for {name}: {value!r} (expected an integer)")
        if isinstance(value, str):
            try:
                value = int(value.strip(), 0)
            except ValueError:
                raise ValueError(f"invalid value for {name}: {value!r} (expected an integer)") from None
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"invalid value for {name}: {value!r} (expected an integer)") from None
        if number != value or number < minimum:
            raise ValueError(f"invalid value for {name}: {value!r} (must be an integer >= {minimum})")
        return number

    return parse


def _parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"invalid value for {name}: {value!r} (expected true or false)")


def _parse_depth(name: str, value: Any) -> int:
    depth = _int_parser(2)(name, value)
    if depth > 8:
        raise ValueError(f"invalid value for {name}: {value!r} (must be between 2 and 8)")
    return depth


def _parse_direct_io(name: str, value: Any) -> str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return "on" if _parse_bool(name, value) else "off"
    except ValueError:
        raise ValueError(f"invalid value for {name}: {value!r} (expected on, off or auto)") from None


# name -> (parser, built-in default). The defaults are the engine's: its
# Settings' initial values and its pool's default size.
_BUILT_IN = _core.Settings()
_SPEC: dict[str, tuple[Callable[[str, Any], Any], Any]] = {
    "compat_mode": (_parse_compat_mode, CompatMode(_BUILT_IN.compat_mode.value)),
    "num_threads": (_int_parser(1), _core.default_num_threads()),
    "task_size": (_int_parser(1), _BUILT_IN.task_size),
    "gds_threshold": (_int_parser(0), _BUILT_IN.gds_threshold),
    "bounce_buffer_size": (_int_parser(4096), _BUILT_IN.bounce_buffer_size),
    "min_task_size": (_int_parser(4096), _BUILT_IN.min_task_size),
    "direct_io": (_parse_direct_io, _BUILT_IN.direct_io.name),
    "pipeline_depth": (_parse_depth, _BUILT_IN.pipeline_depth),
    "mapped_reads": (_parse_bool, _BUILT_IN.mapped_reads),
}

# The engine's view, passed to every open and every request; never read by the
# engine otherwise.
_settings = _core.Settings()
_values: dict[str, Any] = {}


def _apply(name: str, value: Any) -> None:
    if name == "num_threads":
        try:
            _core.set_num_threads(value)
        finally:
            # What runs: where the system refuses threads, the pool keeps the
            # workers it could start and the call raises.
            _values[name] = _core.num_threads()
        return
    _values[name] = value
    if name == "direct_io":
        _settings.direct_io = getattr(_core.DirectIO, value)
    elif name == "compat_mode":
        _settings.compat_mode = _core.CompatMode(int(value))
    else:
        setattr(_settings, name, value)


def _parse(name: str, value: Any) -> Any:
    try:
        parser = _SPEC[name][0]
    except KeyError:
        raise KeyError(f"unknown setting {name!r}; known settings: {', '.join(sorted(_SPEC))}") from None
    return parser(name, value)


def _load_environment() -> None:
    for name, (parser, default) in _SPEC.items():
        env = "GDSCP_" + name.upper()
        raw = os.environ.get(env)
        value = default if raw is None or raw.strip() == "" else parser(env, raw)
        _apply(name, value)


def current() -> dict[str, Any]:
    """Every setting and its value, JSON-ready (compat_mode by name, e.g. "AUTO")."""
    return {name: value.name if isinstance(value, CompatMode) else value for name, value in _values.items()}


def get(name: str) -> Any:
    """The current value of setting ``name``."""
    try:
        return _values[name]
    except KeyError:
        raise KeyError(f"unknown setting {name!r}; known settings: {', '.join(sorted(_SPEC))}") from None


class _Restore:
    """Returned by set(): the change is already made; leaving a ``with`` block undoes it."""

    def __init__(self, old: dict[str, Any]):
        self._old = old

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        for name, value in self._old.items():
            _apply(name, value)


def set(*config: Any) -> _Restore:  # noqa: A001 - KvikIO's name
    """Change settings: ``set(name, value)`` or ``set({name: value, ...})``.

    All values are checked before any is applied. Usable as a context manager
    that restores the previous values on exit.
    """
    if len(config) == 1 and isinstance(config[0], dict):
        items = dict(config[0])
    elif len(config) == 2 and isinstance(config[0], str):
        items = {config[0]: config[1]}
    else:
        raise TypeError("use set(name, value) or set({name: value, ...})")
    parsed = {name: _parse(name, value) for name, value in items.items()}
    old = {name: _values[name] for name in parsed}
    for name, value in parsed.items():
        _apply(name, value)
    return _Restore(old)


# KvikIO's older per-setting accessors, for code written against them.
def compat_mode() -> CompatMode:
    return get("compat_mode")


def num_threads() -> int:
    return get("num_threads")


def task_size() -> int:
    return get("task_size")


def gds_threshold() -> int:
    return get("gds_threshold")


def bounce_buffer_size() -> int:
    return get("bounce_buffer_size")


def compat_mode_reset(value: Any) -> None:
    set("compat_mode", value)


def num_threads_reset(value: int) -> None:
    set("num_threads", value)


def task_size_reset(value: int) -> None:
    set("task_size", value)


def gds_threshold_reset(value: int) -> None:
    set("gds_threshold", value)


def bounce_buffer_size_reset(value: int) -> None:
    set("bounce_buffer_size", value)


def is_compat_mode_preferred() -> bool:
    """True when device I/O will not use cuFile (compat_mode ON, or AUTO without nvidia-fs)."""
    mode = compat_mode()
    if mode == CompatMode.AUTO:
        return not _core.nvidia_fs_present()
    return mode == CompatMode.ON


_load_environment()
