"""``CuFile``: a file opened for parallel reads and writes between storage and
GPU or host memory, call-compatible with ``kvikio.CuFile``."""

import atexit
import copy
import pathlib
import weakref
from typing import Any, Optional, Union

from . import _args, _buffers, _core, _libs, _streams, defaults
from ._errors import ArgumentError, ClosedFileError, RangeEndError

# KvikIO defines its page cache functions in kvikio.cufile; here they live in
# gdscp.page_cache and are found through this module too, imported when first
# asked for (page_cache loads subprocess, which a transfer never needs).
_PAGE_CACHE = ("clear_page_cache", "drop_file_page_cache", "drop_system_page_cache", "get_page_cache_info")

__all__ = ["CuFile", "IOFuture", "IOFutureStream", *_PAGE_CACHE]


def __getattr__(name: str) -> Any:
    if name in _PAGE_CACHE:
        from . import page_cache  # noqa: PLC0415

        return getattr(page_cache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class IOFuture:
    """The result of ``CuFile.pread``/``pwrite``: ``get()`` waits and returns the
    byte count (or raises the first failure). Ctrl-C while waiting cancels the
    transfer's remaining tasks before the interrupt propagates.

    KvikIO's ``IOFuture`` has ``get()`` and ``done()``; gdscp's adds
    ``progress()``, ``cancel()`` and ``cancelled()``. A future belongs to the
    process that started the transfer: in a child forked while it ran, its
    ``get()``, ``done()`` and ``cancelled()`` raise ``RuntimeError`` saying so
    (the workers run in the parent, which finishes the transfer as usual) and
    ``cancel()`` does nothing; new transfers in the child run on a pool of its own.
    """

    __slots__ = ("_handle", "_keep", "__weakref__")

    def __init__(self, handle: Any, keep: Any = None):
        self._handle = handle
        self._keep = keep  # the buffer and the file, alive until the transfer ends
        _in_flight.add(self)

    def get(self) -> int:
        """Wait for the transfer; the number of bytes moved."""
        handle = self._handle
        if not handle.done():  # (in a process forked from the one that started it: the error saying so)
            try:
                while not handle.wait(0.1):
                    pass
            except BaseException:
                handle.cancel()
                handle.wait(-1.0)
                raise
        self._keep = None  # the transfer has ended: the buffer is the caller's again
        return handle.get()

    def done(self) -> bool:
        """True once every task of the transfer has finished."""
        if self._handle.done():
            self._keep = None
            return True
        return False

    def progress(self) -> int:
        """Bytes moved so far (for progress reports)."""
        return self._handle.progress()

    def cancel(self) -> None:
        """Skip the pieces of the transfer that have not started. ``get()``
        still waits for the running ones (after it the buffer is free to
        reuse) and returns the bytes moved without a gap from the start, so a
        cancelled transfer reads as a short one (an append is all or nothing:
        0, its range given back); ``cancelled()`` tells it from
        a read that met the end of the file. Cancelling a finished transfer,
        or twice, is harmless."""
        self._handle.cancel()

    def cancelled(self) -> bool:
        """True when ``cancel()`` made the transfer skip part of its range:
        ``get()`` then returns fewer bytes than asked for, those before the
        first piece skipped (a read's count then says nothing of the end of
        the file). False when it was not cancelled, or the cancel came after
        every piece had started: the transfer is then whole."""
        return self._handle.cancelled()


# The transfers whose futures are alive, parallel or stream-ordered, for the
# interpreter's exit.
_in_flight: "weakref.WeakSet[IOFuture | IOFutureStream]" = weakref.WeakSet()


def _finish_transfers_at_exit() -> None:
    """At interpreter exit, before modules are torn down: wait for every
    transfer whose future is still alive. The exit's last garbage collection
    runs every object's finaliser before any reference goes, so a buffer that
    frees its memory in ``__del__`` would otherwise be freed under a transfer
    still moving bytes into or out of it. A program that an exception nothing
    caught ends has them cancelled first, as a wait interrupted by it would
    have done. Further interrupts meanwhile cancel and wait again. A
    transfer queued on a CUDA stream cannot be cancelled: its stream is
    waited for (its outcome, with no one left to tell, is dropped)."""
    from ._interrupts import ended_by_uncaught_exception, through_interrupts  # noqa: PLC0415

    cancel = ended_by_uncaught_exception()
    for future in list(_in_flight):
        handle = future._handle

        def finish(handle: Any = handle, queued: bool = isinstance(future, IOFutureStream)) -> None:
            nonlocal cancel
            if queued:
                try:
                    handle.check_bytes_done()
                except Exception:  # noqa: BLE001, S110 - the transfer is over, which is what exit needs
                    pass
                return
            try:
                if cancel:
                    handle.cancel()
                handle.wait(-1.0)
            except RuntimeError:  # a future of the process this one was forked from: not ours to wait for
                return
            except BaseException:
                cancel = True
                raise

        through_interrupts(finish)


atexit.register(_finish_transfers_at_exit)


class _Done(IOFuture):
    """The future of a small ``pread``/``pwrite`` that already ran on the
    calling thread, or of one that failed before it started (the file closed
    or not open for it): the byte count, or the failure that ``get()`` raises.
    The failure is kept without its traceback, whose frames would hold the
    buffer and the file, and each ``get()`` raises a copy of it, as a future
    whose transfer ran raises a new error each time: raising one object
    again would add to its traceback at every call."""

    __slots__ = ("_result",)

    def __init__(self, result: Any):
        if isinstance(result, BaseException):
            result = result.with_traceback(None)
            result.__context__ = None
        self._result = result

    def get(self) -> int:
        if isinstance(self._result, BaseException):
            raise copy.copy(self._result)
        return self._result

    def done(self) -> bool:
        return True

    def progress(self) -> int:
        return 0 if isinstance(self._result, BaseException) else self._result

    def cancel(self) -> None:
        return None

    def cancelled(self) -> bool:
        return False


# What pread/pwrite report from the future rather than the call, once the
# arguments are checked: the file closed or not open for the transfer (an
# OSError of the engine), a range past the largest offset. KvikIO's
# futures report these; code written for it submits, then catches at get().
_DEFERRED = (ClosedFileError, OSError, RangeEndError)


class IOFutureStream:
    """The result of ``raw_read_async``/``raw_write_async``. Keep it alive until
    ``check_bytes_done()`` has synchronised the stream. An append queued on
    the stream is all or nothing, as other appends are: where it failed or
    wrote short, ``check_bytes_done()`` (or, never called, the future's end)
    gives its range back, the failure raised, a short write counted as 0.
    Any thread may call ``check_bytes_done()``, several at once. A script
    that ends with the transfer still queued waits for it as it exits, before
    its buffers are freed."""

    __slots__ = ("_handle", "_keep", "__weakref__")

    def __init__(self, handle: Any, keep: Any = None):
        self._handle = handle
        self._keep = keep  # the buffer and the file, alive until the stream has run the transfer
        _in_flight.add(self)

    def check_bytes_done(self) -> int:
        """Wait for the transfer on its stream; the number of bytes moved."""
        done = self._handle.check_bytes_done()
        self._keep = None  # the stream has run it: the buffer is the caller's again
        return done


def _request_size(size: Optional[int], available: int, what: str) -> int:
    if size is None:
        return available
    size = _args.size(size)
    if size > available:
        raise ValueError(f"size {size} is larger than the {what} ({available} bytes)")
    return size


def _settings(task_size: Optional[int], zero_is_default: bool = True) -> Any:
    """The engine settings for one request: the current ones, with ``task_size``
    replaced when the call passes one. As in KvikIO, a ``CuFile`` call's 0 (or
    False) means the default too, and an ``Mmap`` call's is an error."""
    if task_size is None:
        return defaults._settings
    task_size = _args.size(task_size, "task_size")
    if task_size == 0:
        if zero_is_default:
            return defaults._settings
        raise ValueError("task_size must be positive")
    settings = _core.Settings(defaults._settings)
    settings.task_size = defaults._engine_value("task_size", task_size)
    return settings


class CuFile:
    """A file open for parallel I/O between storage and device or host memory.

    ``flags`` follow Python's ``open()``: "r", "w", "a", "x", each optionally
    with "+". In append mode every write lands at the current end of the file
    and ``file_offset`` is ignored; a write that fails or is cancelled there
    leaves the file as it was, unless another append has landed after it
    meanwhile. Large appends take their range under an exclusive ``flock``:
    another program appending to the file must take it too, or its data can
    land in that range and be overwritten. The file is opened twice, buffered and (where
    the filesystem allows) with ``O_DIRECT``.
    """

    def __init__(self, file: Union[pathlib.Path, str], flags: str = "r"):
        if not isinstance(flags, str):
            raise ArgumentError(f"flags must be a string such as 'r' or 'w+', not {type(flags).__name__}")
        path = _args.path(file)
        library = "" if defaults.is_compat_mode_preferred() else _libs.cufile_wheel_library()
        self._handle = _core.Handle(path, flags, defaults._settings, library)

    # -- the file ----------------------------------------------------------
    def close(self) -> None:
        """Close the file (transfers in flight finish first, on their own)."""
        self._handle.close()

    @property
    def closed(self) -> bool:
        return self._handle.closed()

    def fileno(self) -> int:
        """The buffered file descriptor."""
        return self._handle.fileno()

    def open_flags(self) -> int:
        """The buffered descriptor's flags, as ``fcntl(F_GETFL)`` reports them."""
        return self._handle.open_flags()

    @property
    def name(self) -> str:
        return self._handle.path()

    @property
    def backend(self) -> str:
        """What device memory goes through: "cufile" or "posix"."""
        return self._handle.backend()

    @property
    def backend_reason(self) -> str:
        """Why that backend was chosen."""
        return self._handle.backend_reason()

    def is_direct_io_supported(self) -> bool:
        """Whether transfers of this file may use O_DIRECT: the filesystem
        accepted it when the file was opened, and ``direct_io`` is not "off"."""
        return self._handle.direct_io_supported() and defaults.get("direct_io") != "off"

    def __enter__(self) -> "CuFile":
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.backend
        return f"<gdscp.CuFile {self.name!r} {state}>"

    def __reduce_ex__(self, protocol: object) -> Any:
        # As Python's own file objects: an open file (its descriptors, its
        # transfers in flight) means nothing in another process. Without
        # this, pickle names the engine's internal class instead.
        raise TypeError(f"cannot pickle '{type(self).__name__}' object: a file handle belongs to the process that "
                        "opened it (pickle its name, and open that again)")

    # -- parallel I/O ----------------------------------------------------------
    def _start(self, call, buf: Any, into: bool, size, file_offset, task_size) -> IOFuture:
        """One parallel transfer through the engine's ``call`` (pread or pwrite);
        ``into``: the engine writes into ``buf``. The arguments are checked
        here, and their errors raised; what the request then meets (a file
        closed or not open for it, a range past the largest offset) comes
        from the future's ``get()``, as KvikIO reports it."""
        b = _buffers.resolve(buf, writable=into)
        size = _request_size(size, b.nbytes, "buffer")
        start = _args.offset(file_offset)
        settings = _settings(task_size)
        try:
            offset = _args.file_span(start, size)
            return IOFuture(call(b.ptr, b.device, size, offset, settings), (b.keep, self))
        except _DEFERRED as exc:
            return _Done(exc)

    def _now(self, now, call, buf: Any, into: bool, size, file_offset, task_size) -> int:
        """A transfer whose result the caller waits for: a request small enough
        for one task runs on this thread through ``now``, with no future;
        a larger one in parallel through ``call``."""
        b = _buffers.resolve(buf, writable=into)
        size = _request_size(size, b.nbytes, "buffer")
        offset = _args.file_span(file_offset, size)
        settings = _settings(task_size)
        if _core.Handle.runs_inline(size, settings):
            return now(b.ptr, b.device, size, offset, settings)
        return IOFuture(call(b.ptr, b.device, size, offset, settings), (b.keep, self)).get()

    def pread(
        self,
        buf: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        task_size: Optional[int] = None,
    ) -> IOFuture:
        """Start reading ``size`` bytes (default: the whole buffer) at
        ``file_offset`` into ``buf``, device or host memory, in parallel.
        The future's ``get()`` gives the bytes read: fewer only at end of file.
        A bad argument raises here; a file closed or not open for reading
        raises from ``get()``, as in KvikIO."""
        if task_size is None:
            done = self._handle.read_inline(buf, size, file_offset, defaults._settings, True)
            if done.__class__ is not int or done >= 0:  # -1: not taken here
                return _Done(done)
        return self._start(self._handle.pread, buf, True, size, file_offset, task_size)

    def pwrite(
        self,
        buf: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        task_size: Optional[int] = None,
    ) -> IOFuture:
        """Start writing ``size`` bytes (default: the whole buffer) of ``buf`` to
        the file at ``file_offset``, in parallel. A bad argument raises here;
        a file closed or not open for writing raises from ``get()``."""
        if task_size is None:
            done = self._handle.write_inline(buf, size, file_offset, defaults._settings, True)
            if done.__class__ is not int or done >= 0:  # -1: not taken here
                return _Done(done)
        return self._start(self._handle.pwrite, buf, False, size, file_offset, task_size)

    def read(
        self,
        buf: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        task_size: Optional[int] = None,
    ) -> int:
        """``pread(...).get()``: the bytes read."""
        if task_size is None:
            n = self._handle.read_inline(buf, size, file_offset, defaults._settings)
            if n >= 0:
                return n
        return self._now(self._handle.read_now, self._handle.pread, buf, True, size, file_offset, task_size)

    def write(
        self,
        buf: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        task_size: Optional[int] = None,
    ) -> int:
        """``pwrite(...).get()``: the bytes written."""
        if task_size is None:
            n = self._handle.write_inline(buf, size, file_offset, defaults._settings)
            if n >= 0:
                return n
        return self._now(self._handle.write_now, self._handle.pwrite, buf, False, size, file_offset, task_size)

    # -- single transfers on the calling thread (device memory only) -------------
    def _device(self, buf: Any, writable: bool, size: Optional[int], dev_offset: int, call: str):
        b = _buffers.resolve(buf, writable=writable)
        if not b.device:
            raise ValueError(f"{call} needs device memory; got host memory ({type(buf).__name__})")
        dev_offset = _args.offset(dev_offset, "dev_offset")
        if dev_offset > b.nbytes:
            raise ValueError(f"dev_offset {dev_offset} is past the end of the buffer ({b.nbytes} bytes)")
        size = _request_size(size, b.nbytes - dev_offset, "buffer after dev_offset")
        return b, size, dev_offset

    def raw_read(
        self,
        buf: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> int:
        """Read into device memory at ``dev_offset`` with one transfer on this
        thread (one ``cuFileRead``, or one staged read). The bytes read."""
        b, size, dev_offset = self._device(buf, True, size, dev_offset, "raw_read")
        offset = _args.file_span(file_offset, size)
        return self._handle.raw_read(b.ptr, size, offset, dev_offset, defaults._settings)

    def raw_write(
        self,
        buf: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> int:
        """Write device memory from ``dev_offset`` with one transfer on this thread."""
        b, size, dev_offset = self._device(buf, False, size, dev_offset, "raw_write")
        offset = _args.file_span(file_offset, size)
        return self._handle.raw_write(b.ptr, size, offset, dev_offset, defaults._settings)

    def raw_read_async(
        self,
        buf: Any,
        stream: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> IOFutureStream:
        """Read into device memory ordered on ``stream`` (``cuFileReadAsync`` where
        cuFile's stream API works; otherwise the stream is synchronised and the
        bytes are in place when this returns)."""
        b, size, dev_offset = self._device(buf, True, size, dev_offset, "raw_read_async")
        offset = _args.file_span(file_offset, size)
        handle = self._handle.raw_read_async(
            b.ptr, size, offset, dev_offset, _streams.stream_handle(stream), defaults._settings
        )
        return IOFutureStream(handle, (b.keep, self, stream))

    def raw_write_async(
        self,
        buf: Any,
        stream: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> IOFutureStream:
        """Write device memory ordered on ``stream`` (see ``raw_read_async``)."""
        b, size, dev_offset = self._device(buf, False, size, dev_offset, "raw_write_async")
        offset = _args.file_span(file_offset, size)
        handle = self._handle.raw_write_async(
            b.ptr, size, offset, dev_offset, _streams.stream_handle(stream), defaults._settings
        )
        return IOFutureStream(handle, (b.keep, self, stream))


# Written as a string above (the class did not exist yet); the class itself,
# so that help() and inspect show the type rather than a quoted name.
CuFile.__enter__.__annotations__["return"] = CuFile
