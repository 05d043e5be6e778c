"""What a benchmark run measures, checked once, and the defaults chosen from the machine."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

from .. import defaults as gdscp_defaults
from .. import memory
from .files import available_memory, free_disk, memory_filesystem

__all__ = [
    "MODES",
    "DEFAULT_SIZE",
    "DEFAULT_IO_SIZES",
    "DEFAULT_RUNS",
    "DEFAULT_RANDOM_OPS",
    "BenchConfig",
    "Plan",
    "BenchConfigError",
    "default_threads",
    "usable_cores",
    "default_size",
    "resolve",
    "check_dir",
    "check_size",
    "check_task_size",
    "check_threads",
    "check_runs",
    "check_room",
]

MODES = ("read", "write", "randread")
DEFAULT_SIZE = 1 << 30
MIN_DEFAULT_SIZE = 16 << 20
MIN_SIZE = 4096
DEFAULT_IO_SIZES = (4 << 10, 64 << 10, 1 << 20)
DEFAULT_RUNS = 3
DEFAULT_RANDOM_OPS = 1000
MIN_TASK_SIZE = 4096
MAX_THREADS = 1024
MAX_RUNS = 1000
MIN_RANDOM_OPS = 100  # a p99 needs at least 100 samples
MAX_RANDOM_OPS = 1_000_000


class BenchConfigError(ValueError):
    """A bad benchmark setting. ``option`` names it as the command line does
    ("size", "threads", "io_size", ...); the message is one line."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


@dataclass
class BenchConfig:
    """The benchmark's inputs. ``None`` means "choose from the machine".

    ``memory``: "auto" (GPU ``device`` when one is usable, else host memory),
    "gpu" or "host". ``task_size`` None lets gdscp and KvikIO each use their
    own default (the record says which value that was). ``io_sizes`` None:
    those of ``DEFAULT_IO_SIZES`` that fit the file; sizes given are each
    measured, and one larger than the file is refused.
    """

    size: Optional[int] = None
    memory: str = "auto"
    device: int = 0
    modes: Sequence[str] = MODES
    threads: Optional[Sequence[int]] = None
    task_size: Optional[int] = None
    io_sizes: Optional[Sequence[int]] = None
    runs: int = DEFAULT_RUNS
    random_ops: int = DEFAULT_RANDOM_OPS
    drop_cache: bool = False
    dir: str = "."
    ceilings: bool = True
    baselines: bool = True
    seed: int = 0


@dataclass
class Plan:
    """A checked configuration with every default filled in."""

    size: int
    size_reason: str
    memory: str  # "gpu" or "host"
    memory_reason: str
    device: Optional[int]
    modes: list[str]
    threads: list[int]
    threads_reason: str
    task_size: Optional[int]
    io_sizes: list[int]
    runs: int
    random_ops: int
    drop_cache: bool
    dir: str
    ceilings: bool
    baselines: bool
    seed: int
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("warnings")
        return data


def usable_cores() -> int:
    """The cores this process may run on (its affinity), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads(cpus: Optional[int] = None) -> tuple[list[int], str]:
    """Thread counts to sweep: 1 (no parallelism), 4 (a few), gdscp's default
    (one per core, 4 to 32) and 16 where there are 16 cores (where KvikIO and
    gdscp peak on the reference H200)."""
    if cpus is None:
        cpus = usable_cores()
    counts = {1, 4, int(gdscp_defaults.get("num_threads"))}
    if cpus >= 16:
        counts.add(16)
    return sorted(counts), f"1, 4, gdscp's default num_threads and 16 if there are 16 cores ({cpus} usable cores)"


def human(n: int, exact: bool = False) -> str:
    """Bytes for a message: "4 KiB", "1.5 GiB", "100 bytes". ``exact``: a size
    that is not a whole number of tenths of its unit in bytes ("4095 bytes",
    not "4.0 KiB"), for a value compared with a limit."""
    for unit, scale in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            if value == int(value):
                return f"{value:.0f} {unit}"
            if not exact or n * 10 % scale == 0:
                return f"{value:.1f} {unit}"
            break
    return "1 byte" if n == 1 else f"{n} bytes"


def default_size(directory: str, memory_kind: str, device: Optional[int]) -> tuple[int, str]:
    """1 GiB, or less where a quarter of the free disk (the data file and the
    write target), of the available host memory (buffers plus page cache) or of
    the free GPU memory (the buffer plus the copy ``cupy.asarray`` makes) is smaller."""
    limits = [(DEFAULT_SIZE, "the default 1 GiB")]
    free = free_disk(directory)
    if free is not None:
        limits.append((free // 4, f"a quarter of the free disk in {directory}"))
    limits.append((available_memory() // 4, "a quarter of the available host memory"))
    if memory_kind == "gpu" and device is not None:
        limits.append((memory.device_memory(device)[0] // 4, f"a quarter of GPU {device}'s free memory"))
    size, reason = min(limits, key=lambda item: item[0])
    if size < MIN_DEFAULT_SIZE:  # said as it is, before the rounding below makes it a whole MiB
        raise BenchConfigError(
            "size",
            f"not enough room for a benchmark file ({reason} is {human(max(size, 0), exact=True)}; "
            f"needs {human(MIN_DEFAULT_SIZE)})",
        )
    return size - size % (1 << 20), reason


def _check(option: str, value: int, low: int, high: int, what: str, size: bool = False) -> int:
    """``value`` if it is an integer within ``low``..``high``; else a one-line error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BenchConfigError(option, f"{value!r} is not an integer")
    show = (lambda n: human(n, exact=True)) if size else str
    if value < low:
        raise BenchConfigError(option, f"{show(value)} is too small: {what} must be at least {show(low)}")
    if value > high:
        raise BenchConfigError(option, f"{show(value)} is too large: {what} must be at most {show(high)}")
    return value


def _check_list(option: str, values: Sequence[int], low: int, high: int, what: str, size: bool = False) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise BenchConfigError(option, f"expected a list of integers, got {values!r}")
    if not values:
        raise BenchConfigError(option, "the list is empty")
    out: list[int] = []
    for value in values:
        value = _check(option, value, low, high, what, size)
        if value not in out:
            out.append(value)
    return out


def _choose_memory(config: BenchConfig) -> tuple[str, Optional[int], str]:
    if config.memory not in ("auto", "gpu", "host"):
        raise BenchConfigError("device", f"unknown memory {config.memory!r} (expected auto, gpu or host)")
    if config.memory == "host":
        return "host", None, "host memory was asked for"
    device = _check("device", config.device, 0, 1 << 16, "a GPU index")
    status = memory.gpu_available()
    if config.memory == "gpu":
        try:
            memory.check_device(device)
        except memory.DeviceError as exc:
            raise BenchConfigError("device", str(exc)) from None
        return "gpu", device, f"GPU {device} was asked for"
    if not status:
        return "host", None, f"no usable GPU ({status.reason})"
    try:
        memory.check_device(device)
    except memory.DeviceError as exc:
        raise BenchConfigError("device", str(exc)) from None
    return "gpu", device, f"GPU {device} is usable"


def check_dir(path: "str | os.PathLike[str]") -> str:
    """``path`` as an absolute path, if it is a directory this process may
    create files in; else ``BenchConfigError`` naming ``dir``."""
    try:
        directory = os.path.abspath(os.fspath(path))
    except OSError as exc:
        # A relative path from a working directory that has been removed
        # (getcwd fails): nothing can be created there.
        raise BenchConfigError("dir", f"{os.fspath(path)}: cannot find the current working directory "
                                      f"({exc.strerror})") from None
    if not os.path.exists(directory):
        raise BenchConfigError("dir", f"{os.fspath(path)}: no such directory")
    if not os.path.isdir(directory):
        raise BenchConfigError("dir", f"{os.fspath(path)}: not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise BenchConfigError("dir", f"{os.fspath(path)}: not writable")
    return directory


def check_size(size: int) -> int:
    """A test file's size, if within MIN_SIZE..1 PiB."""
    return _check("size", size, MIN_SIZE, 1 << 50, "the file size", size=True)


def check_task_size(task_size: int) -> int:
    """A task size given for gdscp's transfers, if within MIN_TASK_SIZE..1 TiB:
    the bounds of every workload's --task-size."""
    return _check("task_size", task_size, MIN_TASK_SIZE, 1 << 40, "the task size", size=True)


def check_threads(counts: Sequence[int]) -> list[int]:
    """The thread counts asked for, each once, each within 1..MAX_THREADS."""
    return _check_list("threads", counts, 1, MAX_THREADS, "a thread count")


def check_runs(runs: int) -> int:
    """The runs of each measurement, if within 3..MAX_RUNS."""
    return _check("runs", runs, 3, MAX_RUNS, "the number of runs (a median with a min and a max needs 3)")


def check_room(size: int, directory: str, *, disk: int, disk_why: str, host: int, host_why: str = "",
               devices: Sequence[int] = (), gpu: int = 0, gpu_why: str = "") -> list[str]:
    """Files of ``size`` bytes refused (``BenchConfigError`` naming ``size``)
    where what they need is more than ``directory``'s free disk (``disk``
    bytes), than 80% of the available host memory (``host``) or than any of
    ``devices``' free memory (``gpu`` each); the warnings for a run that fits
    but whose files may not stay in the page cache."""
    free = free_disk(directory)
    if free is not None and disk > free:
        raise BenchConfigError("size", f"{human(size)} needs {human(disk)} of disk ({disk_why}); "
                                       f"{directory} has {human(free)} free")
    available = available_memory()
    why = f" ({host_why})" if host_why else ""
    if host > available * 0.8:
        raise BenchConfigError("size", f"{human(size)} needs {human(host)} of host memory{why}; "
                                       f"{human(available)} is available")
    for device in devices:
        free = memory.device_memory(device)[0]
        if gpu > free:
            raise BenchConfigError("size", f"{human(size)} needs {human(gpu)} of GPU memory ({gpu_why}); "
                                           f"GPU {device} has {human(free)} free")
    if host + size > available:
        return [f"the {human(size)} file may not stay in the page cache ({human(available)} of memory available): "
                "hot reads may touch the disk"]
    return []


def resolve(config: BenchConfig) -> Plan:
    """Check ``config`` and fill in its defaults; ``BenchConfigError`` names the
    first bad setting."""
    directory = check_dir(config.dir)

    if isinstance(config.modes, (str, bytes)):
        raise BenchConfigError("mode", "modes must be a list such as ['read', 'write']")
    modes: list[str] = []
    for mode in config.modes:
        if mode not in MODES:
            raise BenchConfigError("mode", f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
        if mode not in modes:
            modes.append(mode)
    if not modes:
        raise BenchConfigError("mode", f"needs at least one mode ({', '.join(MODES)})")
    in_memory = memory_filesystem(directory) if config.drop_cache and {"read", "randread"} & set(modes) else None
    if in_memory:
        raise BenchConfigError("drop_cache", f"{directory} is on {in_memory}, which keeps its files in memory only: "
                                             "no read from it is cold (choose a directory on a disk)")

    if config.threads is None:
        threads, threads_reason = default_threads()
    else:
        threads = sorted(check_threads(config.threads))
        threads_reason = "given"

    task_size = None if config.task_size is None else check_task_size(config.task_size)

    runs = check_runs(config.runs)
    random_ops = _check(
        "random_ops", config.random_ops, MIN_RANDOM_OPS, MAX_RANDOM_OPS, "the random reads per run (a p99 needs 100)"
    )
    given_io_sizes = config.io_sizes is not None
    io_sizes = _check_list("io_size", config.io_sizes if given_io_sizes else DEFAULT_IO_SIZES, 1, 1 << 34,
                           "an I/O size", size=True)

    kind, device, memory_reason = _choose_memory(config)

    warnings: list[str] = []
    if config.size is None:
        size, size_reason = default_size(directory, kind, device)
    else:
        size = check_size(config.size)
        size_reason = "given"
        # A GPU run keeps a host copy of the buffer; a host run reading also a
        # fresh buffer beside the touched one.
        warnings += check_room(
            size, directory, disk=2 * size, disk_why="a data file and a write target",
            host=size * (2 if kind == "gpu" or "read" in modes else 1),
            devices=[device] if kind == "gpu" and device is not None else [],
            gpu=2 * size, gpu_why="buffer and cupy.asarray's copy",
        )
    too_big = [s for s in io_sizes if s > size]
    if too_big and "randread" in modes:
        if given_io_sizes:
            raise BenchConfigError("io_size", f"{human(too_big[0])} is larger than the file ({human(size)})")
        # The default sizes, for a small file: those that fit it (4 KiB always does).
        io_sizes = [s for s in io_sizes if s <= size]

    return Plan(
        size=size,
        size_reason=size_reason,
        memory=kind,
        memory_reason=memory_reason,
        device=device,
        modes=modes,
        threads=threads,
        threads_reason=threads_reason,
        task_size=task_size,
        io_sizes=sorted(io_sizes),
        runs=runs,
        random_ops=random_ops,
        drop_cache=bool(config.drop_cache),
        dir=directory,
        ceilings=bool(config.ceilings),
        baselines=bool(config.baselines),
        seed=int(config.seed),
        warnings=warnings,
    )
