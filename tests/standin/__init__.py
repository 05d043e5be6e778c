"""Stand-ins for libcuda and libcufile, so that the engine's cuFile backend and
its device-memory paths run on machines without a GPU.

``cuda_standin.c`` and ``cufile_standin.c`` are built by the tests (``build``)
into shared objects with the sonames ``libcuda.so.1`` and ``libcufile.so.0``.
A scenario runs in a child process (``run``) that loads both with ctypes
before gdscp touches CUDA. The engine's ``dlopen("libcuda.so.1")`` and
``dlopen("libcufile.so.0")`` then return the stand-ins: the dynamic loader
matches a name without a slash against the sonames of objects already loaded
before it searches the disk. Nothing in the engine knows about them. A child
process, because the engine loads each library once per process and keeps
the result.

In the child, ``standin.cuda`` and ``standin.cufile`` wrap the stand-ins'
own exports: the call logs, injected failures, gates, misuse counts, and the
"device memory" (``DeviceBuffer``: host memory that the libcuda stand-in
reports as device memory, with ``__cuda_array_interface__`` for gdscp and a
numpy view for the test).
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent

# Variants of the libcufile stand-in: the compiler defines each adds.
VARIANTS = {
    "default": [],
    "no_async": ["-DGDSCP_STANDIN_NO_ASYNC"],  # no cuFileReadAsync / cuFileWriteAsync
    "no_write": ["-DGDSCP_STANDIN_NO_WRITE"],  # no cuFileWrite
}

# gdscp_cuda_live kinds and gdscp_cuda_alloc flags (cuda_standin.c)
DEVICE, PINNED = 1, 2
ALLOC_NO_CONTEXT = 0x1

# standin_call.flags (standin.h)
DIRECT, PINNED_HOST, FD_OPEN, INJECTED, DEFERRED = 0x1, 0x2, 0x4, 0x8, 0x10


class Unavailable(Exception):
    """The stand-ins cannot be built here (no C compiler, or no cuda.h / cufile.h)."""


# --------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------
def find_compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise Unavailable("no C compiler (cc, gcc or clang) on PATH")


def header_dirs() -> list[str]:
    """Folders holding cuda.h and cufile.h, looked for where CMakeLists.txt
    looks: a CUDA toolkit, then the nvidia-cuda-runtime / nvidia-cufile wheels
    (the ``test`` extra installs them)."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
             "/usr/local/cuda-13.0", "/usr/local/cuda-12"]
    candidates = []
    for root in filter(None, roots):
        for sub in ("include", "targets/x86_64-linux/include", "targets/sbsa-linux/include"):
            candidates.append(os.path.join(root, sub))
    try:
        import nvidia  # namespace package of the nvidia-* wheels

        for root in getattr(nvidia, "__path__", []):
            for sub in ("cu13/include", "cu12/include", "cuda_runtime/include", "cufile/include"):
                candidates.append(os.path.join(root, sub))
    except ImportError:
        pass
    found = {}
    for header in ("cuda.h", "cufile.h"):
        for folder in candidates:
            if os.path.isfile(os.path.join(folder, header)):
                found[header] = folder
                break
    missing = [h for h in ("cuda.h", "cufile.h") if h not in found]
    if missing:
        raise Unavailable(
            f"{' and '.join(missing)} not found (pip install 'nvidia-cuda-runtime>=13,<14' nvidia-cufile, "
            "or set CUDA_HOME)")
    return list(dict.fromkeys(found.values()))


@dataclass(frozen=True)
class Build:
    cuda: str    # .../libcuda.so.1
    cufile: str  # .../libcufile.so.0
    variant: str


def build(out_dir: str | os.PathLike, variant: str = "default") -> Build:
    """Compiles both stand-ins into ``out_dir/variant``; raises Unavailable."""
    cc = find_compiler()
    includes = [f"-I{d}" for d in header_dirs()]
    folder = Path(out_dir) / variant
    folder.mkdir(parents=True, exist_ok=True)
    flags = ["-std=gnu11", "-O1", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra",
             # The stand-ins' prototypes must be exactly the headers' ones.
             "-Werror=incompatible-pointer-types", "-Werror=implicit-function-declaration",
             f"-I{HERE}", *includes]
    out = {}
    for lib, soname, source, extra in (
        ("cuda", "libcuda.so.1", "cuda_standin.c", []),
        ("cufile", "libcufile.so.0", "cufile_standin.c", VARIANTS[variant]),
    ):
        target = folder / soname
        cmd = [cc, *flags, *extra, f"-Wl,-soname,{soname}", str(HERE / source), "-o", str(target),
               "-lpthread", "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the {lib} stand-in failed:\n{' '.join(cmd)}\n{proc.stderr}")
        out[lib] = str(target)
    return Build(out["cuda"], out["cufile"], variant)


# --------------------------------------------------------------------------
# running a scenario in a child process
# --------------------------------------------------------------------------
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); import standin; standin._child_main(sys.argv[2:])"


def run(libs: Build, scenario: Callable[..., Any], *, devices: int = 1, timeout: float = 120,
        **kwargs: Any) -> str:
    """Runs ``scenario(**kwargs)`` (a module-level function of a test module)
    in a child process over the stand-ins; returns its output, raises
    AssertionError with the child's output if it failed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    env.update(GDSCP_STANDIN_CUDA=libs.cuda, GDSCP_STANDIN_CUFILE=libs.cufile,
               GDSCP_STANDIN_DEVICES=str(devices), GDSCP_STANDIN_TIMEOUT=str(timeout),
               PYTHONFAULTHANDLER="1")
    args = [sys.executable, "-c", _BOOT, str(TESTS), scenario.__module__, scenario.__name__, json.dumps(kwargs)]
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout + 10)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        raise AssertionError(f"{scenario.__name__} did not finish in {timeout} s\n{out}") from None
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"{scenario.__name__}({kwargs}) failed in the child process "
                             f"(exit {proc.returncode}):\n{output[-12000:]}")
    return output


# In the child: the loaded stand-ins.
cuda: "Cuda" = None  # type: ignore[assignment]
cufile: "CuFileLib" = None  # type: ignore[assignment]


def _child_main(argv: list[str]) -> None:
    global cuda, cufile
    module, name, kwargs = argv[0], argv[1], json.loads(argv[2])
    timeout = float(os.environ.get("GDSCP_STANDIN_TIMEOUT", "120"))
    faulthandler.dump_traceback_later(timeout, exit=True)
    # Before gdscp is imported: the engine's dlopen() calls find these.
    cuda = Cuda(os.environ["GDSCP_STANDIN_CUDA"])
    cufile = CuFileLib(os.environ["GDSCP_STANDIN_CUFILE"])
    if cuda.lib.gdscp_cuda_set_device_count(int(os.environ.get("GDSCP_STANDIN_DEVICES", "1"))) != 0:
        raise SystemExit("could not set the stand-in's device count")
    getattr(importlib.import_module(module), name)(**kwargs)
    check_clean()
    print(f"{name}: ok")


def check_clean() -> None:
    """What every scenario must leave behind: no call the real libraries
    would have refused, no stream work left unrun, every cuFile handle
    deregistered, every staging buffer back in the pool (and freed by
    trim_pools), every allocation of device memory freed, and the stand-ins
    really in use."""
    from gdscp import _core

    gc.collect()
    for lib in (cuda, cufile):
        count, text = lib.misuse()
        assert count == 0, f"{count} call(s) the real {lib.name} would refuse; the first: {text}"
    assert cuda.pending() == 0, f"{cuda.pending()} copies or stream I/O queued and never run"
    assert cufile.live_handles() == 0, f"{cufile.live_handles()} cuFile handle(s) never deregistered"
    _core.trim_pools()
    live, nbytes = cuda.live(PINNED)
    assert live == 0, f"{live} pinned buffer(s) ({nbytes} bytes) not returned to the pool"
    live, nbytes = cuda.driver_allocations()
    assert live == 0, f"{live} allocation(s) of device memory ({nbytes} bytes) from cuMemAlloc never freed"
    assert cuda.misuse()[0] == 0, cuda.misuse()[1]
    info = _core.cuda_info()
    if info["available"]:
        assert info["library"] == cuda.path, f"the engine loaded {info['library']}, not the stand-in"


# --------------------------------------------------------------------------
# the stand-ins' exports
# --------------------------------------------------------------------------
class Call(ctypes.Structure):
    """One logged call (standin_call in standin.h). In the libcufile
    stand-in's log, ``ctx`` is the device of the current context (-1: none)."""

    _fields_ = [
        ("_entry", ctypes.c_char * 48),
        ("_arg", ctypes.c_char * 64),
        ("handle", ctypes.c_uint64),
        ("ptr", ctypes.c_uint64),
        ("host", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("file_offset", ctypes.c_int64),
        ("buf_offset", ctypes.c_int64),
        ("result", ctypes.c_int64),
        ("tid", ctypes.c_int64),
        ("ctx", ctypes.c_int64),
        ("version", ctypes.c_int64),
        ("flags", ctypes.c_uint32),
        ("err", ctypes.c_int32),
    ]

    @property
    def entry(self) -> str:
        return self._entry.decode()

    @property
    def arg(self) -> str:
        return self._arg.decode()

    def __repr__(self) -> str:
        return (f"<{self.entry}{'(' + self.arg + ')' if self.arg else ''} handle={self.handle:#x} "
                f"ptr={self.ptr:#x} size={self.size} file_offset={self.file_offset} "
                f"buf_offset={self.buf_offset} result={self.result} tid={self.tid} flags={self.flags:#x}>")


class _Lib:
    name = ""
    prefix = ""

    def __init__(self, path: str):
        self.path = path
        self.lib = ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOW)
        p = self.prefix
        self._fn("log_count", ctypes.c_size_t, [])
        self._fn("log_read", ctypes.c_size_t, [ctypes.c_size_t, ctypes.POINTER(Call), ctypes.c_size_t])
        self._fn("record_size", ctypes.c_size_t, [])
        self._fn("misuse", ctypes.c_long, [ctypes.c_char_p, ctypes.c_size_t])
        self._fn("fail", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_long, ctypes.c_long])
        self._fn("gate", None, [ctypes.c_char_p, ctypes.c_long])
        self._fn("gate_wait", ctypes.c_int, [ctypes.c_long])
        self._fn("gate_release", None, [])
        self._fn("reset", None, [])
        size = getattr(self.lib, p + "record_size")()
        assert size == ctypes.sizeof(Call), f"standin_call is {size} bytes, Call {ctypes.sizeof(Call)}"

    def _fn(self, name: str, restype: Any, argtypes: list) -> Callable:
        fn = getattr(self.lib, self.prefix + name)
        fn.restype = restype
        fn.argtypes = argtypes
        return fn

    def calls(self, *entries: str) -> list[Call]:
        """The log so far (only calls of ``entries`` if given), in order."""
        n = getattr(self.lib, self.prefix + "log_count")()
        out = (Call * max(n, 1))()
        got = getattr(self.lib, self.prefix + "log_read")(0, out, n)
        calls = list(out[:got])
        return [c for c in calls if c.entry in entries] if entries else calls

    def count(self, *entries: str) -> int:
        return len(self.calls(*entries))

    def fail(self, entry: str, code: int, aux: int = 0, *, skip: int = 0, times: int = 1) -> None:
        """After ``skip`` more calls of ``entry``, the next ``times`` (all: -1)
        return ``code`` (``aux``: the errno of a -1, or the CUresult of
        CU_FILE_CUDA_DRIVER_ERROR)."""
        assert getattr(self.lib, self.prefix + "fail")(entry.encode(), code, aux, skip, times) == 0

    def gate(self, entry: str, skip: int = 0) -> None:
        """The call of ``entry`` after ``skip`` more waits until release()."""
        getattr(self.lib, self.prefix + "gate")(entry.encode(), skip)

    def gate_wait(self, seconds: float = 30) -> bool:
        """True once a call waits at the gate (False after ``seconds``)."""
        return bool(getattr(self.lib, self.prefix + "gate_wait")(int(seconds * 1000)))

    def release(self) -> None:
        getattr(self.lib, self.prefix + "gate_release")()

    def release_after(self, seconds: float) -> None:
        """release() ``seconds`` from now, from a thread that runs no Python."""
        assert getattr(self.lib, self.prefix + "gate_release_after")(ctypes.c_long(int(seconds * 1000))) == 0

    def misuse(self) -> tuple[int, str]:
        text = ctypes.create_string_buffer(1024)
        n = getattr(self.lib, self.prefix + "misuse")(text, len(text))
        return n, text.value.decode(errors="replace")

    def reset(self) -> None:
        """Forgets the log, injected failures, the gate and the misuse count."""
        getattr(self.lib, self.prefix + "reset")()


class Cuda(_Lib):
    name = "libcuda"
    prefix = "gdscp_cuda_"

    def __init__(self, path: str):
        super().__init__(path)
        self._fn("set_device_count", ctypes.c_int, [ctypes.c_int])
        self._fn("alloc", ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_int])
        self._fn("free", ctypes.c_int, [ctypes.c_void_p])
        self._fn("host_alloc", ctypes.c_void_p, [ctypes.c_size_t])
        self._fn("host_free", ctypes.c_int, [ctypes.c_void_p])
        self._fn("live", ctypes.c_long, [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)])
        self._fn("driver_allocations", ctypes.c_long, [ctypes.POINTER(ctypes.c_size_t)])
        self._fn("stream", ctypes.c_void_p, [ctypes.c_int, ctypes.c_uint])
        self._fn("fill_async", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t])
        self._fn("make_current", ctypes.c_int, [ctypes.c_int])
        self._fn("pending", ctypes.c_long, [])
        self._fn("primary_context", ctypes.c_void_p, [ctypes.c_int])
        self._fn("retains", ctypes.c_long, [ctypes.c_int])
        self._fn("initialized", ctypes.c_int, [])
        self._fn("set_peer", None, [ctypes.c_int])
        self._fn("break_device", None, [ctypes.c_int, ctypes.c_long])

    def alloc(self, nbytes: int, device: int = 0, *, context: bool = True) -> "DeviceBuffer":
        """``nbytes`` of "device memory" on ``device``, 4 KiB-aligned. Without
        ``context`` its CU_POINTER_ATTRIBUTE_CONTEXT is NULL (as for memory
        from CUDA's virtual memory API or memory pools)."""
        ptr = self.lib.gdscp_cuda_alloc(nbytes, device, 0 if context else ALLOC_NO_CONTEXT)
        assert ptr, f"gdscp_cuda_alloc({nbytes}, {device}) failed"
        return DeviceBuffer(ptr, nbytes, free=lambda p=ptr: self.lib.gdscp_cuda_free(p))

    def pinned(self, nbytes: int) -> "DeviceBuffer":
        """Pinned host memory (as from cuMemHostAlloc), offered through
        ``__cuda_array_interface__`` as libraries offer such memory."""
        ptr = self.lib.gdscp_cuda_host_alloc(nbytes)
        assert ptr
        return DeviceBuffer(ptr, nbytes, free=lambda p=ptr: self.lib.gdscp_cuda_host_free(p))

    def stream(self, device: int = 0, *, non_blocking: bool = False) -> int:
        stream = self.lib.gdscp_cuda_stream(device, 1 if non_blocking else 0)
        assert stream, f"gdscp_cuda_stream({device}) failed"
        return stream

    def fill_async(self, stream: int, buf: "DeviceBuffer", value: int) -> None:
        """Queues a fill of ``buf`` on ``stream`` (run when the stream is synchronised)."""
        assert self.lib.gdscp_cuda_fill_async(stream, buf.ptr, value, buf.nbytes) == 0

    def make_current(self, device: int = 0) -> None:
        """Makes ``device``'s primary context current on the calling thread (-1:
        none), as a GPU library leaves it."""
        assert self.lib.gdscp_cuda_make_current(device) == 0

    def pending(self) -> int:
        return self.lib.gdscp_cuda_pending()

    def live(self, kind: int) -> tuple[int, int]:
        nbytes = ctypes.c_size_t()
        return self.lib.gdscp_cuda_live(kind, ctypes.byref(nbytes)), nbytes.value

    def driver_allocations(self) -> tuple[int, int]:
        """Device memory the engine allocated with cuMemAlloc and has not freed: (count, bytes)."""
        nbytes = ctypes.c_size_t()
        return self.lib.gdscp_cuda_driver_allocations(ctypes.byref(nbytes)), nbytes.value

    def primary_context(self, device: int = 0) -> int:
        return self.lib.gdscp_cuda_primary_context(device) or 0

    def retains(self, device: int = 0) -> int:
        return self.lib.gdscp_cuda_retains(device)


class CuFileLib(_Lib):
    name = "libcufile"
    prefix = "gdscp_cufile_"

    def __init__(self, path: str):
        super().__init__(path)
        self._fn("limit", ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t])
        self._fn("live_handles", ctypes.c_long, [])
        self._fn("driver_opens", ctypes.c_int, [])
        self._fn("error_codes", ctypes.c_int,
                 [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
                  ctypes.c_int])

    def limit(self, entry: str, max_bytes: int) -> None:
        """Each cuFileRead (or cuFileWrite) moves at most ``max_bytes`` (0: no limit)."""
        assert self.lib.gdscp_cufile_limit(entry.encode(), max_bytes) == 0

    def live_handles(self) -> int:
        return self.lib.gdscp_cufile_live_handles()

    def driver_opens(self) -> int:
        return self.lib.gdscp_cufile_driver_opens()

    def error_codes(self) -> list[tuple[int, str, str]]:
        """Every CUfileOpError of cufile.h but CU_FILE_SUCCESS: (value, name, cufileop_status_error text)."""
        cap = 256
        codes = (ctypes.c_int * cap)()
        names = (ctypes.c_char_p * cap)()
        texts = (ctypes.c_char_p * cap)()
        n = self.lib.gdscp_cufile_error_codes(codes, names, texts, cap)
        assert 0 < n <= cap
        return [(codes[i], names[i].decode(), texts[i].decode()) for i in range(n) if codes[i] != 0]


# --------------------------------------------------------------------------
# "device" buffers
# --------------------------------------------------------------------------
class DeviceBuffer:
    """Stand-in device memory: gdscp sees it through ``__cuda_array_interface__``;
    the test reads and writes it through ``host``, a numpy view of the same bytes."""

    def __init__(self, ptr: int, nbytes: int, *, free: Optional[Callable[[], Any]] = None,
                 owner: Optional["DeviceBuffer"] = None, stream: Optional[int] = None):
        self.ptr = ptr
        self.nbytes = nbytes
        self._free = free
        self._owner = owner  # a view keeps its allocation alive
        self.stream = stream
        array = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
        self.host = np.ctypeslib.as_array(array)[:nbytes]

    @property
    def __cuda_array_interface__(self) -> dict:
        cai = {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3,
               "strides": None}
        if self.stream is not None:
            cai["stream"] = self.stream
        return cai

    def __len__(self) -> int:
        return self.nbytes

    def __getitem__(self, index: slice) -> "DeviceBuffer":
        start, stop, step = index.indices(self.nbytes)
        assert step == 1, "contiguous views only"
        return DeviceBuffer(self.ptr + start, max(stop - start, 0), owner=self)

    def with_stream(self, stream: int) -> "DeviceBuffer":
        """The same memory, its producer's stream named in the array interface."""
        return DeviceBuffer(self.ptr, self.nbytes, owner=self, stream=stream)

    def fill(self, value: int) -> "DeviceBuffer":
        self.host[:] = value
        return self

    def set(self, data: bytes) -> "DeviceBuffer":
        self.host[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        return self

    def bytes(self) -> bytes:
        return self.host.tobytes()

    def __del__(self) -> None:
        if self._free is not None:
            self._free()
            self._free = None


# --------------------------------------------------------------------------
# a folder whose filesystem takes O_DIRECT (cuFile registers only such files)
# --------------------------------------------------------------------------
def o_direct_works(folder: str) -> bool:
    probe = os.path.join(folder, ".o_direct_probe")
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def o_direct_folder(candidates: Iterable[str]) -> str:
    """A fresh folder under the first candidate whose filesystem takes O_DIRECT."""
    tried = []
    for base in candidates:
        if base and os.path.isdir(base) and os.access(base, os.W_OK) and o_direct_works(base):
            return tempfile.mkdtemp(prefix="gdscp-standin-", dir=base)
        tried.append(base)
    raise Unavailable(f"no folder whose filesystem accepts O_DIRECT among {tried}")
