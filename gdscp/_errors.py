"""gdscp's exceptions.

OS failures become exceptions that are both the matching ``OSError`` subclass
(``FileNotFoundError``, ``PermissionError``, ...) and ``RuntimeError``, so that
Pythonic code and code written for KvikIO (which raises ``RuntimeError``) both
catch them. Where KvikIO raises ``ValueError`` for what Python calls a
``TypeError`` (a call of the wrong form or with an argument of the wrong
kind), gdscp raises ``ArgumentError``, which is both. This module imports
nothing heavy: the command line catches ``EnvironmentVariableError`` before
anything else of gdscp is loaded.
"""

from __future__ import annotations

import os

__all__ = ["ArgumentError", "ClosedFileError", "CudaError", "CuFileError", "EnvironmentVariableError", "RangeEndError",
           "from_engine", "from_os_error", "invalid_variable", "os_error"]

# Mirrors gdscp::ErrorKind in cpp/include/gdscp/error.hpp.
_OS, _CUDA, _CUFILE, _INVALID, _STATE, _RANGE, _CLOSED = range(7)


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


class ArgumentError(TypeError, ValueError):
    """An argument of the wrong kind or a call of the wrong form: a
    ``TypeError`` to Python, and the ``ValueError`` KvikIO raises for it."""

    __module__ = "gdscp"


class ClosedFileError(ValueError, RuntimeError):
    """I/O on a closed file: the ``ValueError`` Python's file objects raise,
    and the ``RuntimeError`` KvikIO raises."""

    __module__ = "gdscp"


class RangeEndError(OverflowError, RuntimeError):
    """A request whose offset fits but whose range ends past the largest
    offset a file can have (2**63-1): the ``OverflowError`` of any other
    number out of range, and the ``RuntimeError`` KvikIO raises for it."""

    __module__ = "gdscp"


class EnvironmentVariableError(ValueError):
    """A ``GDSCP_*`` environment variable holds a value its setting does not
    accept; ``variable`` names it."""

    __module__ = "gdscp"

    def __init__(self, message: str, variable: str):
        super().__init__(message)
        self.variable = variable

    def __reduce__(self) -> tuple:
        # Rebuilt (by pickle: a process pool's worker) with both arguments.
        return type(self), (self.args[0], self.variable), self.__dict__


def invalid_variable(variable: str, raw: str, why: object, accepted: str) -> EnvironmentVariableError:
    """The error for ``variable`` set to ``raw``, which it does not take
    (``why``); ``accepted`` says what it takes. One wording for every
    ``GDSCP_*`` variable, wherever it is read. What ``accepted`` says whole is
    not said again from ``why``: a check's "GDSCP_X must be ..." or its
    "(examples: ...)"."""
    why = str(why)
    head, examples, listed = why.partition(" (examples: ")
    if examples and listed.rstrip(")") in accepted:
        why = head
    if why.startswith(f"{variable} must be "):
        return EnvironmentVariableError(f"{variable}={raw!r} is not valid: {variable} takes {accepted}", variable)
    return EnvironmentVariableError(f"{variable}={raw!r} is not valid: {why}; {variable} takes {accepted}", variable)


def _engine_str(self) -> str:
    return self.args[2] if len(self.args) > 2 else OSError.__str__(self)


def _engine_reduce(self) -> tuple:
    # The class is made here, not found by name: pickle (a process pool's
    # worker sending its failure back) rebuilds the error through this module.
    return _os_error, (self.errno, self.strerror, self.filename, self.args), self.__dict__


def _os_error(errno: int, strerror: str, filename: object, args: tuple) -> OSError:
    exc = _os_class(errno)(errno, strerror, filename)
    exc.args = args
    return exc


_os_classes: dict[type, type] = {}


def _os_class(errno: int) -> type:
    base = type(OSError(errno, ""))  # FileNotFoundError for ENOENT, and so on
    cls = _os_classes.get(base)
    if cls is None:
        cls = type(base.__name__, (base, RuntimeError),
                   {"__str__": _engine_str, "__reduce__": _engine_reduce, "__module__": "gdscp"})
        _os_classes[base] = cls
    return cls


def from_os_error(exc: OSError) -> OSError:
    """``exc`` (raised by Python's ``os`` module) as gdscp raises OS failures:
    the same ``OSError`` subclass, fields and message, and ``RuntimeError`` too."""
    if exc.errno is None or isinstance(exc, RuntimeError):
        return exc
    dual = _os_class(exc.errno)(exc.errno, exc.strerror, exc.filename)
    dual.args = (exc.errno, exc.strerror, str(exc))
    dual.offset = None
    return dual


def os_error(code: int, what: str, path: str) -> OSError:
    """The error for a system call that failed with errno ``code`` on
    ``path``, said as the engine says its own: "WHAT 'PATH': STRERROR
    (errno CODE)"."""
    return from_engine(_OS, code, f"{what} '{path}': {os.strerror(code)} (errno {code})", path, -1)


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
    if kind == _RANGE:
        return IndexError(message)
    if kind == _CLOSED:
        return ClosedFileError(message)
    return RuntimeError(message)
