"""Process-wide settings, with KvikIO's interface.

``get(name)``, ``set(name, value)`` and ``set({...})``; ``set`` also works as
a context manager that restores the previous values (blocks nest), and
KvikIO's older per-setting accessors (``task_size()``, ``task_size_reset(n)``,
``set_task_size(n)``, ...) remain, each warning with a ``FutureWarning`` as
KvikIO's do. Each setting starts from its ``GDSCP_*``
environment variable when that is set, else from the engine's built-in
default (``_core.Settings()`` and ``_core.default_num_threads()``). This is
the only module that reads those variables; size variables take the command
line's spellings (``GDSCP_TASK_SIZE=4M``). Where the system refuses some of
the threads of that first ``num_threads`` (a pids limit, ``ulimit -u``, an
address-space limit), the pool runs the workers that started,
``get("num_threads")`` says how many, and a ``RuntimeWarning`` says so at
import; a ``set()`` the system refuses raises instead. A value in
``gdscp._preset.PRESET`` (the ``gdscp`` command's ``--threads``) comes
before its variable, which is still checked: a bad one raises all the same.

KvikIO's settings: ``compat_mode`` (ON: never cuFile; OFF: cuFile or an
error; AUTO: cuFile where GPUDirect Storage really works), ``num_threads``
(the worker pool), ``task_size`` (largest chunk of a request one worker
takes), ``gds_threshold`` (requests below it run on the calling thread),
``bounce_buffer_size`` (pinned staging buffer size), and
``auto_direct_io_read`` / ``auto_direct_io_write``, two views of
``direct_io``. gdscp's own: ``direct_io`` ("auto": writes through O_DIRECT in
pieces of 4 MiB and more, reads through the page cache; "on": O_DIRECT for
the aligned middle of every piece of 1 MiB and more, read or written; "off":
never; a piece is one worker's share of a request, so a request split into
smaller pieces stays buffered),
``min_task_size`` (medium requests are split down to this size so every
worker gets a share), ``pipeline_depth`` (staging buffers in flight per
worker) and ``mapped_reads`` (True: reads into host memory of data already in
the page cache copy it through a read-only mapping with streaming stores
instead of pread; False: always pread).

Values are checked as KvikIO checks them, with the same exception types: a
count or size of 0 where it must be positive is a ``ValueError``, a negative
or too large one an ``OverflowError``, a value of the wrong type (a string,
None) a ``TypeError``; any other number goes through ``int()``, as in KvikIO's
binding (a float, ``Decimal`` or ``Fraction`` is truncated).
``num_threads`` above ``MAX_NUM_THREADS`` (4096) is a ``ValueError`` where
KvikIO would try to start that many threads.
gdscp also takes "ON", "off", "auto"... for ``compat_mode``. KvikIO's remote
file settings (``http_*``, ``remote_io_*``) raise ``NotImplementedError``
(a ``RuntimeError``): gdscp has no remote files.
"""

import enum as _enum
import os as _os
import threading as _threading
import typing as _typing
import warnings as _warnings

from . import _args, _core, _sizes
from ._errors import ArgumentError as _ArgumentError
from ._errors import invalid_variable as _invalid_variable
from ._preset import PRESET as _PRESET

__all__ = [
    "CompatMode",
    "MAX_NUM_THREADS",
    "bounce_buffer_size",
    "bounce_buffer_size_reset",
    "compat_mode",
    "compat_mode_reset",
    "current",
    "gds_threshold",
    "gds_threshold_reset",
    "get",
    "get_num_threads",
    "is_compat_mode_preferred",
    "num_threads",
    "num_threads_reset",
    "set",
    "set_bounce_buffer_size",
    "set_compat_mode",
    "set_gds_threshold",
    "set_num_threads",
    "set_task_size",
    "task_size",
    "task_size_reset",
]


class CompatMode(_enum.IntEnum):
    """When cuFile is used for device memory (the numbering matches the engine's and KvikIO's)."""

    OFF = 0
    ON = 1
    AUTO = 2


# -- checking values ---------------------------------------------------------
_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
# The most workers num_threads takes: a larger count is a ValueError before
# any thread starts (KvikIO tries to start them all).
MAX_NUM_THREADS: int = _core.MAX_NUM_THREADS
_TRUE = _args.TRUE_WORDS
_FALSE = _args.FALSE_WORDS


def _is_number(value: _typing.Any) -> bool:
    """Whether Python's C API counts ``value`` as a number (``PyNumber_Check``:
    its type fills the int, index or float slot, or it is complex): what
    KvikIO's binding asks before it converts. Not a ``hasattr`` test, which
    numpy's string scalars pass."""
    import ctypes  # noqa: PLC0415 - only for values that are not plain ints

    return bool(ctypes.pythonapi.PyNumber_Check(ctypes.py_object(value)))


def _whole(name: str, value: _typing.Any) -> int:
    """A number as KvikIO's binding converts it: an object Python counts as a
    number goes through ``int()``, so floats, ``Decimal`` and ``Fraction`` are
    truncated and ``__int__`` comes before ``__index__``; anything else (a
    string, bytes, None) is a TypeError, as is a number ``int()`` refuses."""
    if type(value) is int:
        return value
    kind = type(value).__name__
    if not _is_number(value):
        raise TypeError(f"{name} must be an integer, not {kind}")
    import decimal  # noqa: PLC0415 - only for values that are not plain ints

    # int() of a Decimal such as 1E+1000000 takes minutes: one that has more
    # digits before its point than any setting could hold is out of range.
    if isinstance(value, decimal.Decimal) and value.is_finite() and value.adjusted() >= 40:
        raise OverflowError(f"{name} {value!r} is out of range")
    try:
        return int(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {kind}") from None
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {value!r}") from None
    except OverflowError:
        raise OverflowError(f"{name} {value!r} is out of range") from None


def _integer(minimum: int, maximum: int, type_max: int) -> _typing.Callable[[str, _typing.Any], int]:
    """Integers from ``minimum`` to ``maximum``; negative ones, and ones past
    ``type_max`` (what KvikIO's C++ type holds), are OverflowErrors."""

    def check(name: str, value: _typing.Any) -> int:
        number = _whole(name, value)
        if number < 0:
            raise OverflowError(f"{name} {_args.shown(number)} is negative")
        if number > type_max:
            raise OverflowError(f"{name} {_args.shown(number)} is out of range (at most {type_max})")
        if number < minimum:
            raise ValueError(f"{name} must be at least {minimum} (got {number})")
        if number > maximum:
            raise ValueError(f"{name} must be at most {maximum} (got {number})")
        return number

    return check


def _compat_mode(name: str, value: _typing.Any) -> CompatMode:
    if isinstance(value, CompatMode):
        return value
    if isinstance(value, str):  # gdscp's extension: KvikIO's setter takes numbers only
        text = value.strip().lower()
        if text == "auto":
            return CompatMode.AUTO
        if text in _TRUE:
            return CompatMode.ON
        if text in _FALSE:
            return CompatMode.OFF
        raise ValueError(f"{name} must be ON, OFF or AUTO, not {value!r}")
    try:
        number = _integer(0, 2, 255)(name, value)
    except TypeError:
        raise TypeError(
            f"{name} must be a CompatMode, 0, 1, 2 or ON, OFF or AUTO, not {type(value).__name__}"
        ) from None
    return CompatMode(number)


def _flag(name: str, value: _typing.Any) -> bool:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise ValueError(f"{name} must be true or false, not {value!r}")
    if isinstance(value, bool):
        return value
    try:
        number = _whole(name, value)
    except TypeError:
        raise TypeError(f"{name} must be true or false (a bool, 0 or 1), not {type(value).__name__}") from None
    if number not in (0, 1):
        raise ValueError(f"{name} must be true or false, not {_args.shown(value)}")
    return bool(number)


def _direct_io(name: str, value: _typing.Any) -> str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return "on" if _flag(name, value) else "off"
    except ValueError:
        raise ValueError(f"{name} must be on, off or auto, not {_args.shown(value)}") from None
    except TypeError:
        raise TypeError(f"{name} must be on, off or auto (or a bool), not {type(value).__name__}") from None


def _truth(name: str, value: _typing.Any) -> bool:
    """KvikIO's boolean settings take any object and keep its truth value."""
    return bool(value)


# -- the settings ------------------------------------------------------------
class _Setting(_typing.NamedTuple):
    check: _typing.Callable[[str, _typing.Any], _typing.Any]
    from_text: _typing.Callable[[str], _typing.Any]  # a GDSCP_* variable's text -> a value to check
    accepted: str  # what the variable takes, for its error message


def _size_text(text: str) -> int:
    return _sizes.parse_size(text)


_SIZE_EXAMPLES = f"such as {_sizes.EXAMPLES}"
_SPEC: dict[str, _Setting] = {
    "compat_mode": _Setting(_compat_mode, str, "ON, OFF or AUTO"),
    "num_threads": _Setting(
        _integer(1, MAX_NUM_THREADS, _UINT32_MAX), _sizes.parse_integer, f"an integer from 1 to {MAX_NUM_THREADS}"
    ),
    "task_size": _Setting(_integer(1, _UINT64_MAX, _UINT64_MAX), _size_text, f"a positive size {_SIZE_EXAMPLES}"),
    "gds_threshold": _Setting(_integer(0, _UINT64_MAX, _UINT64_MAX), _size_text, f"a size {_SIZE_EXAMPLES}"),
    "bounce_buffer_size": _Setting(
        _integer(1, _UINT64_MAX, _UINT64_MAX), _size_text, f"a positive size {_SIZE_EXAMPLES}"
    ),
    "min_task_size": _Setting(_integer(1, _UINT64_MAX, _UINT64_MAX), _size_text, f"a positive size {_SIZE_EXAMPLES}"),
    "direct_io": _Setting(_direct_io, str, "on, off or auto"),
    "pipeline_depth": _Setting(_integer(2, 8, _UINT32_MAX), _sizes.parse_integer, "an integer from 2 to 8"),
    "mapped_reads": _Setting(_flag, str, "true or false"),
}

# KvikIO's two direct I/O switches, as views of direct_io: (read, write) ->
# direct_io. Reads through O_DIRECT with buffered writes has no direct_io value.
_DIRECT_IO_VIEWS = ("auto_direct_io_read", "auto_direct_io_write")
_DIRECT_IO_OF = {(False, False): "off", (False, True): "auto", (True, True): "on"}
_DIRECT_IO_SWITCHES = {mode: switches for switches, mode in _DIRECT_IO_OF.items()}

_REMOTE = frozenset(
    {
        "http_max_attempts",
        "http_status_codes",
        "http_timeout",
        "remote_io_backend",
        "remote_io_max_concurrent_requests",
        "remote_io_num_reactors",
        "remote_io_reactor_dispatch",
    }
)

# The engine's view, passed to every open and every request; never read by the
# engine otherwise.
_settings = _core.Settings()
_values: dict[str, _typing.Any] = {}
# Held by every change: each copies _settings and puts its copy in place, and
# two at once would each drop the other's value from the engine's view while
# get() still reported it.
_changing = _threading.Lock()


def _unlocked_in_child() -> None:
    # A set() running on another thread as the process forked left the lock
    # held in the child, where that thread does not exist to release it.
    global _changing
    _changing = _threading.Lock()


_os.register_at_fork(after_in_child=_unlocked_in_child)

# Staging buffers and tasks smaller than a page cost a system call or a copy
# per few bytes and move nothing faster, so the engine gets at least a page;
# get() still returns what was set, and every size moves the same bytes.
_ENGINE_MINIMUM = {"task_size": 4096, "bounce_buffer_size": 4096}


def _engine_value(name: str, value: int) -> int:
    return max(value, _ENGINE_MINIMUM.get(name, 0))


def _apply(name: str, value: _typing.Any) -> None:
    global _settings
    if name == "num_threads":
        try:
            _core.set_num_threads(value)
        finally:
            # What runs: where the system refuses threads, the pool keeps the
            # workers it could start and the call raises.
            _values[name] = _core.num_threads()
        return
    # A new object, never the one in use changed: a call reads _settings once
    # and passes that object down, which no other thread's set() then changes
    # under it (between the engine's checks and its transfer, say).
    settings = _core.Settings(_settings)
    if name == "direct_io":
        settings.direct_io = getattr(_core.DirectIO, value)
    elif name == "compat_mode":
        settings.compat_mode = _core.CompatMode(int(value))
    else:
        setattr(settings, name, _engine_value(name, value))
    _values[name] = value
    _settings = settings


def _known(name: _typing.Any) -> str:
    """``name`` if it is a setting gdscp has; KeyError or NotImplementedError otherwise."""
    if name in _SPEC or name in _DIRECT_IO_VIEWS:
        return name
    if name in _REMOTE:
        raise NotImplementedError(
            f"{name!r} is a setting of KvikIO's remote files (RemoteFile), which gdscp does not support"
        )
    raise KeyError(f"unknown setting {name!r}; gdscp's settings: {', '.join(sorted([*_SPEC, *_DIRECT_IO_VIEWS]))}")


def _checked(items: dict[_typing.Any, _typing.Any]) -> dict[str, _typing.Any]:
    """The values to apply for a set() call, every one checked; the direct I/O
    views become the direct_io value they make together."""
    checked = {_known(name): value for name, value in items.items()}
    out = {name: _SPEC[name].check(name, value) for name, value in checked.items() if name in _SPEC}
    views = {name: _truth(name, checked[name]) for name in _DIRECT_IO_VIEWS if name in checked}
    if views:
        if "direct_io" in out:
            raise ValueError("set direct_io or auto_direct_io_read/auto_direct_io_write, not both")
        read, write = _DIRECT_IO_SWITCHES[_values["direct_io"]]
        pair = (views.get("auto_direct_io_read", read), views.get("auto_direct_io_write", write))
        if pair not in _DIRECT_IO_OF:
            raise ValueError(
                "gdscp cannot read through O_DIRECT while writing through the page cache "
                "(auto_direct_io_read=True with auto_direct_io_write=False); "
                "direct_io='on' uses O_DIRECT for both"
            )
        out["direct_io"] = _DIRECT_IO_OF[pair]
    return out


def _built_in(name: str) -> _typing.Any:
    """The engine's default for setting ``name``."""
    if name == "num_threads":
        return _core.default_num_threads()
    value = getattr(_core.Settings(), name)
    if name == "compat_mode":
        return CompatMode(value.value)
    if name == "direct_io":
        return value.name
    return value


def _start_pool(value: int, asked: _typing.Optional[str]) -> None:
    """The worker pool grown to its first count as the module loads. Where the
    system refuses threads (a pids limit, RLIMIT_NPROC, an address-space limit
    with many threads), the pool runs the workers that started, which
    get("num_threads") returns, and a RuntimeWarning says so once, naming
    ``asked`` (where the count came from; None: said by whoever gave it) and
    the count reached. Failing the import instead would leave all of gdscp
    unusable, set() included, with which a program could ask for fewer,
    though workers run. A pool that could start no worker at all has nothing
    to run with: its error is the import's."""
    try:
        _apply("num_threads", value)
    except RuntimeError as exc:
        if "num_threads" not in _values:  # no worker runs
            raise
        if asked is not None:
            _warnings.warn(f"{asked}: {exc}", RuntimeWarning)


def _preset(name: str) -> _typing.Any:
    """The value ``_preset.PRESET`` gives setting ``name``, where it is one the
    setting takes; None otherwise."""
    if name not in _PRESET:
        return None
    try:
        return _SPEC[name].check(name, _PRESET[name])
    except (TypeError, ValueError, OverflowError):
        return None


def _load_environment() -> None:
    for name, spec in _SPEC.items():
        variable = "GDSCP_" + name.upper()
        raw = _os.environ.get(variable)
        given = None
        if raw is not None and raw.strip() != "":
            # Checked even where a preset comes first: a bad variable is the
            # same mistake whatever else the command line says.
            try:
                given = spec.check(variable, spec.from_text(raw))
            except (TypeError, ValueError, OverflowError) as exc:
                raise _invalid_variable(variable, raw, exc, spec.accepted) from None
        value = _preset(name)
        if value is not None:
            asked = None
        elif given is None:
            value = _built_in(name)
            asked = f"the default {name} ({value})"
        else:
            value = given
            asked = f"{variable}={raw.strip()}"
        if name == "num_threads":
            _start_pool(value, asked)
        else:
            _apply(name, value)


# -- the interface -------------------------------------------------------------
def current() -> dict[str, _typing.Any]:
    """Every setting and its value, JSON-ready (compat_mode by name, e.g. "AUTO")."""
    return {name: value.name if isinstance(value, CompatMode) else value for name, value in _values.items()}


def get(config_name: str) -> _typing.Any:
    """The current value of setting ``config_name``: what was last set, even
    where the engine rounds it (task and staging sizes below a page)."""
    name = _known(config_name)
    if name in _DIRECT_IO_VIEWS:
        return _DIRECT_IO_SWITCHES[_values["direct_io"]][_DIRECT_IO_VIEWS.index(name)]
    return _values[name]


class _Restore:
    """Returned by set(): the change is already made; leaving a ``with`` block undoes it."""

    def __init__(self, old: dict[str, _typing.Any]):
        self._old = old

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        with _changing:
            for name, value in self._old.items():
                _apply(name, value)


def set(*config: _typing.Any) -> _Restore:  # noqa: A001 - KvikIO's name
    """Change settings: ``set(name, value)`` or ``set({name: value, ...})``.

    Every value is checked before any is applied, so a failing call changes
    nothing (but for a thread count the system refuses: the pool keeps the
    workers it could start, which the error says, and nothing else changes). The change takes effect at once; used as a context manager, the
    previous values come back when the block ends. Another form of call is an
    ``ArgumentError`` (a ``ValueError``, as in KvikIO, and a ``TypeError``).
    """
    if len(config) == 1 and isinstance(config[0], dict):
        items = dict(config[0])
    elif len(config) == 2 and isinstance(config[0], str):
        items = {config[0]: config[1]}
    else:
        raise _ArgumentError("call set(name, value) or set({name: value, ...})")
    with _changing:
        checked = _checked(items)
        old = {name: _values[name] for name in checked}
        # The thread count first: the one change the system can refuse (no
        # threads, no memory), and the pool then keeps the workers it could
        # start, as its error says. Whatever fails, the changes before it are undone.
        order = sorted(checked, key=lambda name: name != "num_threads")
        done: list[str] = []
        try:
            for name in order:
                done.append(name)
                _apply(name, checked[name])
        except BaseException:
            for name in reversed(done[:-1]):
                try:
                    _apply(name, old[name])
                except Exception:  # noqa: BLE001, S110 - the first failure is the one to report
                    pass
            raise
    return _Restore(old)


def is_compat_mode_preferred() -> bool:
    """True when device I/O will not use cuFile (compat_mode ON, or AUTO without nvidia-fs)."""
    mode = get("compat_mode")
    if mode == CompatMode.AUTO:
        return not _core.nvidia_fs_present()
    return mode == CompatMode.ON


# KvikIO's older accessors, for code written against them: name() reads,
# name_reset(value) sets, set_name(value) sets for a ``with`` block. KvikIO
# deprecates them (since 25.04; get_num_threads() it has removed) with a
# FutureWarning, and so does gdscp: the warning names the caller's line.
def _deprecated(old: str, instead: str) -> None:
    _warnings.warn(
        f"gdscp.defaults.{old}() is deprecated, as in KvikIO: use gdscp.defaults.{instead}",
        FutureWarning,
        stacklevel=3,  # past this function and the accessor: the line that called the accessor
    )


def compat_mode() -> CompatMode:
    _deprecated("compat_mode", "get('compat_mode')")
    return get("compat_mode")


def compat_mode_reset(compatmode: _typing.Any) -> None:
    _deprecated("compat_mode_reset", "set('compat_mode', value)")
    set("compat_mode", compatmode)


def set_compat_mode(compatmode: _typing.Any) -> _Restore:
    _deprecated("set_compat_mode", "set('compat_mode', value)")
    return set("compat_mode", compatmode)


def num_threads() -> int:
    _deprecated("num_threads", "get('num_threads')")
    return get("num_threads")


def get_num_threads() -> int:
    _deprecated("get_num_threads", "get('num_threads')")
    return get("num_threads")


def num_threads_reset(nthreads: int) -> None:
    _deprecated("num_threads_reset", "set('num_threads', value)")
    set("num_threads", nthreads)


def set_num_threads(nthreads: int) -> _Restore:
    _deprecated("set_num_threads", "set('num_threads', value)")
    return set("num_threads", nthreads)


def task_size() -> int:
    _deprecated("task_size", "get('task_size')")
    return get("task_size")


def task_size_reset(nbytes: int) -> None:
    _deprecated("task_size_reset", "set('task_size', value)")
    set("task_size", nbytes)


def set_task_size(nbytes: int) -> _Restore:
    _deprecated("set_task_size", "set('task_size', value)")
    return set("task_size", nbytes)


def gds_threshold() -> int:
    _deprecated("gds_threshold", "get('gds_threshold')")
    return get("gds_threshold")


def gds_threshold_reset(nbytes: int) -> None:
    _deprecated("gds_threshold_reset", "set('gds_threshold', value)")
    set("gds_threshold", nbytes)


def set_gds_threshold(nbytes: int) -> _Restore:
    _deprecated("set_gds_threshold", "set('gds_threshold', value)")
    return set("gds_threshold", nbytes)


def bounce_buffer_size() -> int:
    _deprecated("bounce_buffer_size", "get('bounce_buffer_size')")
    return get("bounce_buffer_size")


def bounce_buffer_size_reset(nbytes: int) -> None:
    _deprecated("bounce_buffer_size_reset", "set('bounce_buffer_size', value)")
    set("bounce_buffer_size", nbytes)


def set_bounce_buffer_size(nbytes: int) -> _Restore:
    _deprecated("set_bounce_buffer_size", "set('bounce_buffer_size', value)")
    return set("bounce_buffer_size", nbytes)


_load_environment()
