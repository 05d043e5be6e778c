"""Python exceptions for engine errors.

OS failures become exceptions that are both the matching ``OSError`` subclass
(``FileNotFoundError``, ``PermissionError``, ...) and ``RuntimeError``, so that
Pythonic code and code written for KvikIO (which raises ``RuntimeError``) both
catch them.
"""

from __future__ import annotations

import os

__all__ = ["CudaError", "CuFileError", "from_engine"]

# Mirrors gdscp::ErrorKind in cpp/include/gdscp/error.hpp.
_OS, _CUDA, _CUFILE, _INVALID, _STATE = range(5)


class CudaError(RuntimeError):
    """A CUDA driver call failed; ``code`` is the ``CUresult``."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


class CuFileError(RuntimeError):
    """A cuFile call failed; ``code`` is the ``CUfileOpError``."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


def _engine_str(self) -> str:
    return self.args[2] if len(self.args) > 2 else OSError.__str__(self)


_os_classes: dict[type, type] = {}


def _os_class(errno: int) -> type:
    base = type(OSError(errno, ""))  # FileNotFoundError for ENOENT, and so on
    cls = _os_classes.get(base)
    if cls is None:
        cls = type(base.__name__, (base, RuntimeError), {"__str__": _engine_str, "__module__": "gdscp"})
        _os_classes[base] = cls
    return cls


def from_engine(kind: int, code: int, message: str, path: str, offset: int) -> BaseException:
    """Build the exception for a ``gdscp::Error`` (called by the bindings)."""
    if kind == _OS:
        exc = _os_class(code)(code, os.strerror(code), path or None)
        # Keep OSError's fields; show the engine's full sentence.
        exc.args = (code, os.strerror(code), message)
        exc.offset = offset if offset >= 0 else None
        return exc
    if kind == _CUDA:
        return CudaError(message, code)
    if kind == _CUFILE:
        return CuFileError(message, code)
    if kind == _INVALID:
        return ValueError(message)
    return RuntimeError(message)
