"""gdscp: fast parallel I/O between files and GPU or host memory.

``gdscp.CuFile`` is call-compatible with ``kvikio.CuFile``; ``gdscp.defaults``
holds the settings. Device memory goes through NVIDIA cuFile where GPUDirect
Storage really works, and through gdscp's own pinned, overlapped POSIX path
otherwise. Importing gdscp needs no GPU and no CUDA library.
"""

from . import defaults
from ._errors import CudaError, CuFileError
from .cufile import CuFile, IOFuture, IOFutureStream
from .bulk import BulkJob, copy_files, read_files, write_files  # many files at once
from .defaults import CompatMode


__all__ = [
    "CompatMode",
    "CuFile",
    "CuFileError",
    "CudaError",
    "IOFuture",
    "IOFutureStream",
    "defaults",
    "__version__",
    "BulkJob",
    "copy_files",
    "read_files",
    "write_files",
]


def __getattr__(name: str):
    # __version__ comes from the package metadata, read on first use:
    # importlib.metadata costs tens of milliseconds, every command's start.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

        try:
            value = version("gdscp")
        except PackageNotFoundError:  # running from a source tree
            value = "0.0.0"
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'gdscp' has no attribute {name!r}")

