"""gdscp: fast parallel I/O between files and GPU or host memory.

``gdscp.CuFile`` is call-compatible with ``kvikio.CuFile``, and the package
offers the rest of KvikIO's module-level interface (``Mmap``, the page cache
helpers, ``defaults``, ...): docs/kvikio-compatibility.md says what matches and
what differs. Device memory goes through NVIDIA cuFile where GPUDirect Storage
really works, and through gdscp's own pinned, overlapped POSIX path otherwise.
Importing gdscp needs no GPU and no CUDA library.

Names are imported when first used, so that ``import gdscp`` (and the
``gdscp`` command's start, which a Ctrl-C may interrupt) loads nothing
heavy. A bad ``GDSCP_*`` environment variable raises
``EnvironmentVariableError`` (a ``ValueError`` naming it) when the settings
are first needed: ``gdscp.defaults``, ``gdscp.CuFile``, ...
"""

import importlib as _importlib

# typing.TYPE_CHECKING without importing typing (tens of milliseconds at the
# command's start); type checkers treat this name as true.
TYPE_CHECKING = False
if TYPE_CHECKING:  # what the lazy names are, for type checkers
    from . import buffer, cufile, defaults, mmap, remote_file, stream
    from ._errors import (ArgumentError, ClosedFileError, CudaError, CuFileError, EnvironmentVariableError,
                          RangeEndError)
    from .buffer import bounce_buffer_free, memory_deregister, memory_register, prepare
    from .bulk import BulkJob, copy_files, read_files, replicate, write_files
    from .cufile import CuFile, IOFuture, IOFutureStream
    from .defaults import CompatMode
    from .mmap import Mmap
    from .page_cache import clear_page_cache, drop_file_page_cache, drop_system_page_cache, get_page_cache_info
    from .remote_file import RemoteFile, is_remote_file_available
    from .stream import stream_deregister, stream_register

    __version__: str

# public name -> the module that defines it ("defaults" is itself a module)
_HOME = {
    "ArgumentError": "_errors",
    "BulkJob": "bulk",
    "ClosedFileError": "_errors",
    "CompatMode": "defaults",
    "CuFile": "cufile",
    "CuFileError": "_errors",
    "CudaError": "_errors",
    "EnvironmentVariableError": "_errors",
    "IOFuture": "cufile",
    "IOFutureStream": "cufile",
    "Mmap": "mmap",
    "RangeEndError": "_errors",
    "RemoteFile": "remote_file",
    "bounce_buffer_free": "buffer",
    "clear_page_cache": "page_cache",
    "copy_files": "bulk",
    "defaults": None,
    "drop_file_page_cache": "page_cache",
    "drop_system_page_cache": "page_cache",
    "get_page_cache_info": "page_cache",
    "is_remote_file_available": "remote_file",
    "memory_deregister": "buffer",
    "memory_register": "buffer",
    "prepare": "buffer",
    "read_files": "bulk",
    "replicate": "bulk",
    "stream_deregister": "stream",
    "stream_register": "stream",
    "write_files": "bulk",
}

__all__ = sorted(_HOME) + ["__version__"]

# KvikIO's modules of the same names, which ``import kvikio`` makes attributes
# of the package: ``kvikio.mmap.Mmap``, ``kvikio.cufile.IOFuture``, ...
_MODULES = frozenset({"buffer", "cufile", "mmap", "remote_file", "stream"})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - slow to import

    try:
        return version("gdscp")
    except PackageNotFoundError:  # running from a source tree
        return "0.0.0"


def __getattr__(name: str) -> object:
    if name == "__version__":
        value: object = _version()
    elif name in _HOME:
        home = _HOME[name]
        module = _importlib.import_module(f"{__name__}.{home or name}")
        value = module if home is None else getattr(module, name)
    elif name in _MODULES:
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted((set(globals()) - {"TYPE_CHECKING"}) | set(__all__) | _MODULES)
