"""The contenders: gdscp and the ways a user would otherwise read a file.

Each tool opens a file, reads ``size`` bytes at an offset into the benchmark's
buffer (host or GPU memory), and writes a buffer to a file with ``fsync``.
Timing is not done here (see ``measure``); a tool only performs the calls a
user of that library would make.
"""

from __future__ import annotations

import abc
import contextlib
import os
from typing import Any, Iterator, Optional

import numpy as np

from .stats import threads_text

__all__ = [
    "Tool",
    "GdscpTool",
    "PythonTool",
    "NumpyCupyTool",
    "KvikioTool",
    "PreadvTool",
    "kvikio_status",
    "TOOL_NAMES",
]

TOOL_NAMES = ("gdscp", "python", "numpy_cupy", "kvikio", "preadv")


class Tool(abc.ABC):
    """One way of moving bytes between a file and the target memory."""

    name = ""
    #: whether ``read`` leaves the bytes in the caller's buffer (so they can be checked)
    fills_buffer = True
    #: the modes the tool takes part in
    modes: tuple[str, ...] = ("read", "write", "randread")

    def __init__(self, target: Any, threads: Optional[int] = None):
        self.target = target
        self.threads = threads

    @contextlib.contextmanager
    def configured(self) -> Iterator[None]:
        """Apply this tool's settings (thread count) for the duration of the block."""
        yield

    @abc.abstractmethod
    def open(self, path: str, mode: str) -> Any:
        ...

    @abc.abstractmethod
    def close(self, handle: Any) -> None:
        ...

    @abc.abstractmethod
    def read(self, handle: Any, buf: Any, size: int, offset: int, task_size: Optional[int]) -> int:
        ...

    @abc.abstractmethod
    def write(self, handle: Any, buf: Any, size: int, task_size: Optional[int]) -> int:
        """Write ``size`` bytes of ``buf`` at offset 0 and fsync."""

    @abc.abstractmethod
    def describe(self, mode: str) -> str:
        ...

    @property
    def label(self) -> str:
        return self.name if self.threads is None else f"{self.name} ({threads_text(self.threads)})"


class GdscpTool(Tool):
    name = "gdscp"

    def __init__(self, target: Any, threads: Optional[int] = None):
        super().__init__(target, threads)
        import gdscp

        self._gdscp = gdscp

    @contextlib.contextmanager
    def configured(self) -> Iterator[None]:
        if self.threads is None:
            yield
            return
        with self._gdscp.defaults.set("num_threads", self.threads):
            yield

    def open(self, path: str, mode: str) -> Any:
        return self._gdscp.CuFile(path, mode)

    def close(self, handle: Any) -> None:
        handle.close()

    def read(self, handle, buf, size, offset, task_size):
        view = buf if size == len(buf) else buf[:size]
        return handle.read(view, size, offset, task_size)

    def write(self, handle, buf, size, task_size):
        view = buf if size == len(buf) else buf[:size]
        n = handle.write(view, size, 0, task_size)
        os.fsync(handle.fileno())
        return n

    def describe(self, mode: str) -> str:
        if mode == "write":
            return "gdscp.CuFile(path, 'w').write(buf) then os.fsync"
        if mode == "randread":
            return "gdscp.CuFile.read(view, io_size, offset) into one view of io_size bytes, one call at a time"
        return "gdscp.CuFile(path, 'r').read(buf)"


class KvikioTool(Tool):
    """KvikIO's CuFile, called the same way as gdscp's, with its thread pool set
    to the same size (its own default is 1 thread)."""

    name = "kvikio"

    def __init__(self, target: Any, threads: Optional[int] = None):
        super().__init__(target, threads)
        import kvikio
        import kvikio.defaults

        self._kvikio = kvikio

    @contextlib.contextmanager
    def configured(self) -> Iterator[None]:
        if self.threads is None:
            yield
            return
        defaults = self._kvikio.defaults
        if hasattr(defaults, "set"):
            with defaults.set("num_threads", self.threads):
                yield
        else:  # KvikIO before 25.x
            old = defaults.get_num_threads()
            defaults.num_threads_reset(self.threads)
            try:
                yield
            finally:
                defaults.num_threads_reset(old)

    def open(self, path: str, mode: str) -> Any:
        return self._kvikio.CuFile(path, mode)

    def close(self, handle: Any) -> None:
        handle.close()

    def read(self, handle, buf, size, offset, task_size):
        view = buf if size == len(buf) else buf[:size]
        if task_size is None:
            return handle.pread(view, size, offset).get()
        return handle.pread(view, size, offset, task_size).get()

    def write(self, handle, buf, size, task_size):
        view = buf if size == len(buf) else buf[:size]
        if task_size is None:
            n = handle.pwrite(view, size, 0).get()
        else:
            n = handle.pwrite(view, size, 0, task_size).get()
        os.fsync(handle.fileno())
        return n

    def describe(self, mode: str) -> str:
        if mode == "write":
            return "kvikio.CuFile(path, 'w').pwrite(buf).get() then os.fsync"
        if mode == "randread":
            return "kvikio.CuFile.pread(view, io_size, offset).get() into one view of io_size bytes, one call at a time"
        return "kvikio.CuFile(path, 'r').pread(buf).get()"


def kvikio_status() -> tuple[bool, str, Optional[str]]:
    """``(importable, reason, version)`` for KvikIO (no version where it is not importable)."""
    try:
        import kvikio
    except Exception as exc:
        return False, f"kvikio is not importable ({type(exc).__name__}: {exc})", None
    return True, "importable", str(getattr(kvikio, "__version__", "unknown"))


class PythonTool(Tool):
    """Plain Python: an unbuffered file object and ``readinto`` a preallocated
    host buffer (then, for GPU memory, one copy into the preallocated device
    buffer, as a user without a GPU I/O library would do)."""

    name = "python"

    def __init__(self, target: Any, host_buffer: np.ndarray):
        super().__init__(target, None)
        self.host = host_buffer

    def open(self, path: str, mode: str) -> Any:
        return open(path, "rb" if mode == "r" else "wb", buffering=0)

    def close(self, handle: Any) -> None:
        handle.close()

    def read(self, handle, buf, size, offset, task_size):
        # Host memory: the benchmark's buffer itself (a fresh one where the run
        # measures fresh buffers); GPU memory: the host buffer, then one copy.
        view = memoryview(buf if self.target.kind == "host" else self.host)[:size]
        handle.seek(offset)
        done = 0
        while done < size:  # Linux returns at most ~2 GiB per read()
            n = handle.readinto(view[done:])
            if not n:
                break
            done += n
        if self.target.kind == "gpu":
            self.target.upload(buf, self.host, done)
        return done

    def write(self, handle, buf, size, task_size):
        if self.target.kind == "gpu":
            self.target.download(buf, self.host, size)
            source = self.host
        else:
            source = buf
        view = memoryview(source)[:size]
        done = 0
        while done < size:
            done += handle.write(view[done:])
        os.fsync(handle.fileno())
        return done

    def describe(self, mode: str) -> str:
        # The copies target.download and target.upload make: CuPy's where the
        # device buffer is a CuPy array, else the driver's own.
        if self.target.kind != "gpu":
            prefix = suffix = ""
        elif self.target.cupy is not None:
            prefix, suffix = "cupy .get(out=host) then ", " then cupy .set(host) into the device buffer"
        else:
            prefix, suffix = "cuMemcpyDtoH into host then ", " then cuMemcpyHtoD into the device buffer"
        if mode == "write":
            return prefix + "open(path, 'wb', buffering=0).write(host) then os.fsync"
        if mode == "randread":
            return "f.seek(offset); f.readinto(view)" + suffix + ", one call at a time"
        return "open(path, 'rb', buffering=0).readinto(host) into a preallocated buffer" + suffix


class PreadvTool(Tool):
    """The bare system call, from Python: ``os.preadv(fd, [view], offset)`` into
    the same host buffer as the others. Random reads into host memory only:
    the floor that a library adds its own cost to."""

    name = "preadv"
    modes = ("randread",)

    def __init__(self, target: Any):
        super().__init__(target, None)

    def open(self, path: str, mode: str) -> Any:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def close(self, handle: Any) -> None:
        os.close(handle)

    def read(self, handle, buf, size, offset, task_size):
        view = buf if size == len(buf) else buf[:size]
        return os.preadv(handle, [view], offset)

    def write(self, handle, buf, size, task_size):
        raise NotImplementedError("the preadv baseline only reads")

    def describe(self, mode: str) -> str:
        return "os.preadv(fd, [view], offset) into one view of io_size bytes, one call at a time"


class NumpyCupyTool(Tool):
    """The naive GPU route: ``numpy.fromfile`` then ``cupy.asarray`` (a new host
    array and a new device array for every read)."""

    name = "numpy_cupy"
    fills_buffer = False

    def __init__(self, target: Any):
        super().__init__(target, None)
        import cupy

        self._cupy = cupy

    def open(self, path: str, mode: str) -> Any:
        return path

    def close(self, handle: Any) -> None:
        return None

    def read(self, handle, buf, size, offset, task_size):
        host = np.fromfile(handle, dtype=np.uint8, count=size, offset=offset)
        device = self._cupy.asarray(host)
        return int(device.nbytes)

    def write(self, handle, buf, size, task_size):
        host = self._cupy.asnumpy(buf[:size])
        with open(handle, "wb") as f:
            host.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        return int(host.nbytes)

    def describe(self, mode: str) -> str:
        if mode == "write":
            return "cupy.asnumpy(buf).tofile(f) then os.fsync"
        if mode == "randread":
            return "cupy.asarray(numpy.fromfile(path, count=io_size, offset=offset)), one call at a time"
        return "cupy.asarray(numpy.fromfile(path))"
