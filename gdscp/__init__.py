"""gdscp: fast parallel I/O between files and GPU or host memory.

``gdscp.CuFile`` is call-compatible with ``kvikio.CuFile``; ``gdscp.defaults``
holds the settings. Device memory goes through NVIDIA cuFile where GPUDirect
Storage really works, and through gdscp's own pinned, overlapped POSIX path
otherwise. Importing gdscp needs no GPU and no CUDA library.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from . import defaults
from ._errors import CudaError, CuFileError
from .cufile import CuFile, IOFuture, IOFutureStream
from .bulk import BulkJob, copy_files, read_files, write_files  # noqa: F401 - many files at once: gdscp/bulk.py
from .defaults import CompatMode

try:
    __version__ = _version("gdscp")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "CompatMode",
    "CuFile",
    "CuFileError",
    "CudaError",
    "IOFuture",
    "IOFutureStream",
    "defaults",
    "__version__",
]
