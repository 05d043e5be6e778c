"""What this machine offers gdscp, and how a given path would be read:
the answer to ``gdscheck -p``, as plain dictionaries (``gdscp info`` prints them).

``system_info()`` reports the NVIDIA driver and CUDA version, the GPUs,
libcufile (version and where it was loaded from), nvidia-fs, the cufile.json
in force and gdscp's settings. ``path_info(path)`` reports the filesystem a
path lives on, whether ``O_DIRECT`` opens there and which backend a read of
device memory would use, and why. Nothing here needs a GPU.
"""

from __future__ import annotations

import errno
import os
import platform
import re
import stat
import tempfile
from importlib import metadata
from typing import Any, Optional

from . import _core, _libs, defaults
from .cufile import CuFile

__all__ = ["system_info", "path_info", "mount_of", "free_space", "cufile_json"]

_NVIDIA_VERSION = "/proc/driver/nvidia/version"
_DEFAULT_CUFILE_JSON = "/etc/cufile.json"


def _package_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cupy_version() -> Optional[str]:
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"):
        found = _package_version(dist)
        if found:
            return found
    return None


def _nvidia_driver_version() -> Optional[str]:
    """The kernel driver's version ("580.65.06"), from /proc, if the driver is loaded."""
    try:
        with open(_NVIDIA_VERSION, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else text.splitlines()[0].strip() if text else None


def _cuda_version(code: int) -> Optional[str]:
    """cuDriverGetVersion's 12040 -> "12.4"."""
    if not code:
        return None
    return f"{code // 1000}.{(code % 1000) // 10}"


def _cufile_version(code: int) -> Optional[str]:
    """cuFileGetVersion's 1150 -> "1.15.0"."""
    if not code:
        return None
    return f"{code // 1000}.{(code % 1000) // 10}.{code % 10}"


def _strip_json_comments(text: str) -> str:
    # cufile.json allows // comments, which the json module does not; strings
    # are kept intact so that "http://..." survives.
    out = []
    for line in text.splitlines():
        in_string = False
        cut = len(line)
        i = 0
        while i < len(line):
            ch = line[i]
            if ch == "\\" and in_string:
                i += 2
                continue
            if ch == '"':
                in_string = not in_string
            elif not in_string and line.startswith("//", i):
                cut = i
                break
            i += 1
        out.append(line[:cut])
    return "\n".join(out)


def cufile_json() -> dict[str, Any]:
    """The cufile.json libcufile would read: ``CUFILE_ENV_PATH_JSON`` or /etc/cufile.json,
    whether it exists, and the settings in it that decide GDS behaviour."""
    import json  # noqa: PLC0415

    env = os.environ.get("CUFILE_ENV_PATH_JSON")
    path = env or _DEFAULT_CUFILE_JSON
    result: dict[str, Any] = {
        "path": path,
        "source": "CUFILE_ENV_PATH_JSON" if env else "default",
        "exists": os.path.isfile(path),
        "allow_compat_mode": None,
        "error": None,
    }
    if not result["exists"]:
        return result
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.loads(_strip_json_comments(f.read()))
        if not isinstance(doc, dict):
            raise ValueError("it is not a JSON object")
        props = doc.get("properties", {})
        if not isinstance(props, dict):
            raise ValueError('its "properties" is not an object')
        result["allow_compat_mode"] = props.get("allow_compat_mode")
        for key in ("use_poll_mode", "max_direct_io_size_kb", "max_device_cache_size_kb"):
            if key in props:
                result[key] = props[key]
    except (OSError, ValueError) as exc:
        result["error"] = str(exc)
    return result


def system_info() -> dict[str, Any]:
    """The machine as gdscp sees it (see the module docstring)."""
    cuda = _core.cuda_info()
    cufile = _core.cufile_info(_libs.cufile_wheel_library())
    settings = defaults.current()
    from . import __version__  # noqa: PLC0415 - the package imports this module's siblings first

    return {
        "gdscp": {
            "version": __version__,
            "python": platform.python_version(),
            "numpy": _package_version("numpy"),
            "cupy": _cupy_version(),
        },
        "cuda": {
            "available": bool(cuda["available"]),
            "driver_version": _nvidia_driver_version(),
            "cuda_version": _cuda_version(int(cuda["driver_version"])),
            "library": cuda["library"] or None,
            "error": cuda["error"] or None,
        },
        "gpus": [dict(gpu) for gpu in cuda["gpus"]],
        "cufile": {
            "available": bool(cufile["available"]),
            "version": _cufile_version(int(cufile["version"])),
            "version_code": int(cufile["version"]) or None,
            "library": cufile["library"] or None,
            "error": cufile["error"] or None,
        },
        "nvidia_fs": {
            "present": bool(cufile["nvidia_fs"]),
            "version": cufile["nvidia_fs_version"] or None,
        },
        "cufile_json": cufile_json(),
        "settings": settings,
        "compat_mode_preferred": defaults.is_compat_mode_preferred(),
    }


def _unescape_mount(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: str) -> dict[str, Optional[str]]:
    """The mount holding ``path``, from /proc/self/mountinfo: its mount point,
    filesystem type, source and device number ("major:minor"). The deepest (and,
    among equals, the latest) mount point that contains the resolved path wins."""
    real = os.path.realpath(path)
    best: dict[str, Optional[str]] = {"mount_point": None, "filesystem": None, "source": None, "device": None}
    best_len = -1
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.readlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        try:
            sep = fields.index("-")
        except ValueError:
            continue
        if sep < 5 or len(fields) < sep + 3:
            continue
        point = _unescape_mount(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/") or point == "/"
        if inside and len(point) >= best_len:
            best_len = len(point)
            best = {
                "mount_point": point,
                "filesystem": fields[sep + 1],
                "source": _unescape_mount(fields[sep + 2]),
                "device": fields[2],
            }
    return best


def free_space(path: str) -> Optional[int]:
    """Bytes an unprivileged user may still write on the filesystem holding
    ``path`` (``OSError`` where it cannot be asked); None where the filesystem
    reports no size at all, so that its free space is unknown rather than
    none: a FUSE filesystem without statfs answers all zeros, as procfs and
    sysfs do."""
    fs = os.statvfs(path)
    if fs.f_blocks == 0:
        return None
    return fs.f_bavail * fs.f_frsize


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "other"


def _test_file(directory: str) -> tuple[Optional[str], Optional[str]]:
    """(a new empty file in ``directory`` for a probe to open, which the
    caller removes; or None and why none could be made there)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gdscp-info-", dir=directory)
    except OSError as exc:
        return None, f"not tested: no test file could be created in the directory: {exc.strerror}"
    os.close(fd)
    return tmp, None


def _remove(tmp: Optional[str]) -> None:
    if tmp:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # a probe's answer stands without it


def _probe_o_direct(path: str, is_dir: bool) -> tuple[Optional[bool], Optional[str]]:
    """(whether an O_DIRECT open works, why not). For a directory, a temporary
    file is created in it and removed."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False, "this platform has no O_DIRECT"
    tmp, why = _test_file(path) if is_dir else (None, None)
    if why:
        return None, why
    try:
        fd = os.open(tmp, os.O_RDWR | flag) if tmp else os.open(path, os.O_RDONLY | os.O_NONBLOCK | flag)
        os.close(fd)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False, "the filesystem refuses O_DIRECT (EINVAL)"
        return None, f"not tested: the {'test ' if tmp else ''}file could not be opened: {exc.strerror}"
    finally:
        _remove(tmp)
    return True, None


def _probe_backend(path: str, is_dir: bool) -> tuple[Optional[str], Optional[str]]:
    """(backend, reason) a device-memory read of ``path`` would use, from a
    CuFile opened on it (or on a temporary file in the directory)."""
    tmp, why = _test_file(path) if is_dir else (None, None)
    if why:
        return None, why
    try:
        with CuFile(tmp or path, "r") as f:
            return f.backend, f.backend_reason
    except OSError as exc:
        return None, f"not tested: the {'test ' if tmp else ''}file could not be opened: {exc.strerror}"
    except Exception as exc:  # cuFile refusing the file, for one
        return None, str(exc)
    finally:
        _remove(tmp)


def path_info(path: str) -> dict[str, Any]:
    """How gdscp would do I/O at ``path`` (a file, block device or directory).
    Raises ``OSError`` if the path does not exist."""
    st = os.stat(path)
    is_dir = stat.S_ISDIR(st.st_mode)
    mount = mount_of(path)
    if is_dir or stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode):
        o_direct, o_direct_reason = _probe_o_direct(path, is_dir)
        backend, backend_reason = _probe_backend(path, is_dir)
    else:
        # Opening a FIFO would wait for a writer, and a character device or
        # socket has no storage behind it to probe.
        why = f"not probed: a {_kind(st.st_mode)} is read and written front to back"
        o_direct, o_direct_reason = None, why
        backend, backend_reason = "posix", why
    return {
        "path": path,
        "kind": _kind(st.st_mode),
        "filesystem": mount["filesystem"],
        "mount_point": mount["mount_point"],
        "source": mount["source"],
        "o_direct": o_direct,
        "o_direct_reason": o_direct_reason,
        "backend": backend,
        "backend_reason": backend_reason,
    }
