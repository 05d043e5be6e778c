"""Options shared by the commands, declared once, and what they turn into:
engine settings for the duration of a command, and the memory to use."""

from __future__ import annotations

import contextlib
import enum
from typing import Annotated, Any, ContextManager, Optional

import typer

from .. import defaults
from .._sizes import parse_integer
from .output import Output, UsageError
from .units import format_bytes, size_option, size_option_at_least

__all__ = [
    "CompatModeChoice",
    "Threads",
    "TaskSize",
    "CompatModeOpt",
    "Device",
    "Devices",
    "Host",
    "ChunkSize",
    "Json",
    "Quiet",
    "Debug",
    "settings",
    "choose_memory",
    "choose_devices",
    "devices_name",
    "memory_name",
    "chunk_size",
    "staging_size",
    "check_staging",
    "check_path",
    "count_option",
    "whole_number",
    "sources_and_destination",
]

_TUNING = "Tuning"
_MEMORY = "Memory"
_OUTPUT = "Output"


class CompatModeChoice(str, enum.Enum):
    on = "on"
    off = "off"
    auto = "auto"


def whole_number(text: str) -> int:
    """Typer ``parser=`` for whole-number options: bad input is a usage error
    naming it. ASCII digits, as ``GDSCP_*`` variables take them (``int()``,
    and so Typer's ``int`` options, also take other scripts' digits and "1_0")."""
    try:
        return parse_integer(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def count_option(minimum: int, maximum: Optional[int] = None):
    """``whole_number`` that also refuses a number below ``minimum`` or above ``maximum``."""

    def parse(text: str) -> int:
        value = whole_number(text)
        if value < minimum:
            raise typer.BadParameter(f"{value} is below the minimum of {minimum}")
        if maximum is not None and value > maximum:
            raise typer.BadParameter(f"{value} is above the maximum of {maximum}")
        return value

    return parse


MAX_THREADS = defaults.MAX_NUM_THREADS

Threads = Annotated[
    Optional[int],
    typer.Option(
        "--threads",
        parser=count_option(1, MAX_THREADS),
        metavar="N",
        help="Worker threads (default: GDSCP_NUM_THREADS, else one per core, 4 to 32).",
        rich_help_panel=_TUNING,
    ),
]
TaskSize = Annotated[
    Optional[int],
    typer.Option(
        "--task-size",
        parser=size_option,
        metavar="SIZE",
        help="Largest chunk of a transfer one worker claims at a time (default: GDSCP_TASK_SIZE, else 16MiB).",
        rich_help_panel=_TUNING,
    ),
]
CompatModeOpt = Annotated[
    Optional[CompatModeChoice],
    typer.Option(
        "--compat-mode",
        case_sensitive=False,
        help="on: never use cuFile; off: cuFile or fail; auto: cuFile where GPUDirect Storage works "
        "(default: GDSCP_COMPAT_MODE, else auto).",
        rich_help_panel=_TUNING,
    ),
]
def _device_option(help: str) -> Any:
    """``--device N``, with the command's own help."""
    return Annotated[
        Optional[int],
        typer.Option("--device", parser=count_option(0), metavar="N", help=help, rich_help_panel=_MEMORY),
    ]


def _host_option(help: str) -> Any:
    """``--host``, with the command's own help."""
    return Annotated[bool, typer.Option("--host", help=help, rich_help_panel=_MEMORY)]


Device = _device_option("GPU to use (default: GPU 0, or host memory when there is no usable GPU).")
# copy goes through a GPU only when asked: its own help for --device and --host.
CopyDevice = _device_option("Copy through this GPU's memory (storage -> GPU -> storage; default: no GPU).")


def devices_option(text: str) -> str:
    """Typer ``parser=`` for --devices: "all", or GPU numbers separated by commas."""
    text = str(text).strip()
    if text.lower() == "all":
        return "all"
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not (p.isascii() and p.isdigit()) for p in parts):
        raise typer.BadParameter(f"{text!r} is not 'all' or GPU numbers separated by commas (0,1)")
    try:
        numbers = [parse_integer(p) for p in parts]
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    for n in numbers:
        if numbers.count(n) > 1:
            raise typer.BadParameter(f"GPU {n} is named twice")
    return ",".join(str(n) for n in numbers)


Devices = Annotated[
    Optional[str],
    typer.Option(
        "--devices",
        parser=devices_option,
        metavar="LIST",
        help="Spread the work over these GPUs (0,1 or all), each with its own staging and streams.",
        rich_help_panel=_MEMORY,
    ),
]
Host = _host_option("Use host memory instead of a GPU.")
CopyHost = _host_option(
    "No GPU (the default): regular files are copied inside the kernel, as cp does, others through host memory."
)
# Each chunk costs a system call (and a cudaMemcpy through a GPU): below a
# page that cost is all there is (at one byte a chunk, 10MiB take most of a
# minute). A page is also the least that O_DIRECT and cuFile move aligned.
# Most likely such a size is a slip ("1" for "1G"): said, not taken.
MIN_CHUNK_SIZE = 4096

ChunkSize = Annotated[
    Optional[int],
    typer.Option(
        "--chunk-size",
        parser=size_option_at_least(MIN_CHUNK_SIZE),
        metavar="SIZE",
        help="Buffer per transfer, at least 4KiB; larger files move through in chunks of this size "
        "(default: copy and read 64MiB shared by the workers; write up to 1GiB, at most an eighth of the memory "
        "available).",
        rich_help_panel=_MEMORY,
    ),
]
Json = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document on stdout instead of a table.", rich_help_panel=_OUTPUT),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Print nothing on success (errors still show; --json still prints).", rich_help_panel=_OUTPUT
    ),
]
Debug = Annotated[
    bool,
    typer.Option("--debug", help="Show the traceback of an error.", rich_help_panel=_OUTPUT),
]


def settings(
    threads: Optional[int] = None,
    task_size: Optional[int] = None,
    compat_mode: Optional[CompatModeChoice] = None,
) -> ContextManager[None]:
    """The engine settings named on the command line, in force inside ``with``."""
    changes: dict[str, object] = {}
    if threads is not None:
        changes["num_threads"] = threads
    if task_size is not None:
        if task_size == 0:
            raise UsageError("--task-size must be at least 1 byte")
        changes["task_size"] = task_size
    if compat_mode is not None:
        changes["compat_mode"] = compat_mode.value
    if not changes:
        return contextlib.nullcontext()
    return defaults.set(changes)


def choose_memory(out: Output, host: bool, device: Optional[int]) -> Optional[int]:
    """The GPU to use, or None for host memory. Without --device and without a
    usable GPU this falls back to host memory and says so; an explicit
    --device that cannot be used is a usage error, and so is compat mode OFF
    (cuFile or nothing) when the memory would be host memory."""
    cufile_only = defaults.get("compat_mode") == defaults.CompatMode.OFF
    if host:
        if device is not None:
            raise UsageError("--host and --device exclude each other")
        if cufile_only:
            raise UsageError("compat mode OFF (cuFile only) needs GPU memory; it cannot be used with --host")
        return None
    from .. import _gpus  # noqa: PLC0415 - the GPU probe, only for commands that may use a GPU

    if device is not None:
        _gpus.check_device(device)
        return device
    status = _gpus.gpu_available()
    if status:
        return 0
    if cufile_only:
        raise UsageError(f"compat mode OFF (cuFile only) needs a GPU, and there is no usable one: {status.reason}")
    out.warn(f"no usable GPU ({status.reason}); using host memory instead")
    return None


def copy_memory(out: Output, host: bool, device: Optional[int]) -> Optional[int]:
    """``copy``'s memory: a GPU only where one is asked for (``--device``, or
    compat mode OFF, which is cuFile or nothing), else None. A copy needs no
    memory of its own: regular files go inside the kernel (``copy_file_range``,
    as ``cp`` copies them) and other files through host memory, which beats a
    round trip through a GPU and needs no GPU driver or context."""
    if not host and device is None and defaults.get("compat_mode") != defaults.CompatMode.OFF:
        return None
    return choose_memory(out, host, device)


def choose_devices(host: bool, device: Optional[int], devices: Optional[str]) -> Optional[list[int]]:
    """The GPUs that --devices names (None without it), each checked usable;
    a usage error with --host or --device, or for a GPU that cannot be used."""
    if devices is None:
        return None
    if host:
        raise UsageError("--host and --devices exclude each other")
    if device is not None:
        raise UsageError("--device and --devices exclude each other")
    from .. import _gpus  # noqa: PLC0415
    from ..bulk import device_list  # noqa: PLC0415

    try:
        return device_list("all" if devices == "all" else [int(d) for d in devices.split(",")])
    except (ValueError, _gpus.DeviceError) as exc:
        raise UsageError(f"--devices {devices}: {exc}") from None


def devices_name(devices: list[int]) -> str:
    """"GPUs 0, 1", for messages."""
    return "GPU " + str(devices[0]) if len(devices) == 1 else "GPUs " + ", ".join(str(d) for d in devices)


def memory_name(device: Optional[int]) -> str:
    """"GPU 0" or "host memory", for messages."""
    return "host memory" if device is None else f"GPU {device}"


def chunk_size(requested: Optional[int], largest: int, device: Optional[int], buffers: int) -> int:
    """Bytes per buffer when ``buffers`` buffers move files of up to ``largest`` bytes:
    ``requested`` if given (a usage error where the buffers of host memory it
    makes are more than is available), else enough for the largest file, but
    at most 1GiB and an eighth of the memory available
    (``memory.available_bytes``: free GPU memory, or host RAM available
    without swapping) divided among the buffers."""
    from .. import memory  # noqa: PLC0415

    if requested is not None:
        chunk = max(1, min(requested, largest)) if largest else 1
        if device is None:
            # Host memory may be granted past what there is (overcommit), and
            # the buffers are filled whole: past the memory available they
            # would end in the OOM killer, not in an error.
            need = chunk * min(buffers, -(-largest // chunk))
            available = memory.available_bytes(None)
            if need > available:
                count = need // chunk
                raise UsageError(f"--chunk-size: {count} buffer{'s' if count != 1 else ''} of {format_bytes(chunk)} "
                                 f"need{'s' if count == 1 else ''} {format_bytes(need)} of host memory; "
                                 f"{format_bytes(available)} is available")
        return chunk
    cap = min(1 << 30, max(memory.available_bytes(device) // (8 * buffers), 16 << 20))
    cap -= cap % memory.PAGE_SIZE
    return max(1, min(largest, cap))


def staging_size(requested: Optional[int], gpus: int = 1, largest: Optional[int] = None) -> Optional[int]:
    """A bulk job's staging memory for ``--chunk-size``, per GPU when spread
    over ``gpus``: one chunk per worker of a GPU's share of the threads (None
    without the option: the job's default). ``largest``: the most bytes one
    file of the job moves, where each file's is known; no chunk is larger
    (GPU staging is allocated whole before the job starts: a chunk past the
    largest file would only hold GPU memory that nothing uses, "--chunk-size
    1T" for a 10MiB file 4TiB of it)."""
    if requested is None:
        return None
    if largest is not None:
        requested = min(requested, max(largest, MIN_CHUNK_SIZE))
    return requested * max(1, int(defaults.get("num_threads")) // gpus)


def check_staging(staging: Optional[int], gpus: list[int]) -> None:
    """A usage error where the staging of ``--chunk-size`` (``staging_size``'s
    answer, one chunk per worker) is more than one of ``gpus`` has free: said
    before anything is written, naming the option, where the GPU's own refusal
    would name only a cuMemAlloc of that many bytes."""
    if staging is None or not gpus:
        return
    from .._gpus import device_memory  # noqa: PLC0415  (not gdscp.memory, which imports numpy: copy needs none)

    workers = max(1, int(defaults.get("num_threads")) // len(gpus))
    for d in gpus:
        free = device_memory(d)[0]
        if staging > free:
            raise UsageError(f"--chunk-size: a chunk of {format_bytes(staging // workers)} for each of {workers} "
                             f"workers needs {format_bytes(staging)} of GPU {d}'s memory; {format_bytes(free)} "
                             "is free")


def check_path(path: str, what: str = "path") -> str:
    """``path`` if the OS can take it; a usage error naming it otherwise (an embedded
    NUL byte would silently cut the name short)."""
    if "\0" in path:
        raise UsageError(f"{what} '{path}' contains a NUL byte")
    if not path:
        raise UsageError(f"{what} must not be empty")
    return path


def sources_and_destination(paths: list[str]) -> tuple[list[str], str]:
    """``SRC... DST`` as cp takes them: at least one source, then the destination."""
    if not paths:
        raise UsageError("missing file operand: give SRC... DST")
    if len(paths) == 1:
        raise UsageError(f"missing destination operand after '{paths[0]}'")
    for p in paths:
        check_path(p)
    return paths[:-1], paths[-1]
