"""``gdscp read``: load files into GPU (or host) memory and report the speed.

The files go in one bulk job (gdscp.bulk.stream_files) through staging
memory on the GPU (or in host memory): many in flight at once, large ones
split among the workers, the bytes dropped once they have landed (and, with
--verify, been compared with a plain read of the file). With --devices the
job is spread over several GPUs, each with its own staging; with
--replicate each file is loaded whole into every GPU named (gdscp.replicate:
read once, copied GPU to GPU), and dropped once measured (docs/multi-gpu.md)."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ..bulk import FileResult, _sizeless_filesystems, read_files, stream_files
from . import options, ranks
from .jobs import run_job
from .output import EXIT_FAILURE, Failure, Output, UsageError, shown
from .progress import TransferProgress
from .units import byte_count, format_bytes, format_rate, format_seconds, gb_per_s, size_option

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["read", "file_size", "ready_gpus"]

_HOST_REASON = "host memory always takes the POSIX path"


def file_size(path: str) -> Optional[int]:
    """Bytes in ``path``: a regular file's size, or a block device's length; None
    for what is read front to back until its end (character devices, FIFOs, and
    files whose size the kernel reports as 0, which in procfs and sysfs still
    have content). Raises ``Failure`` naming the path when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise Failure(f"cannot read '{path}': {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise Failure(f"cannot read '{path}': Is a directory")
    if stat.S_ISSOCK(st.st_mode):
        raise Failure(f"cannot read '{path}': it is a socket")
    if stat.S_ISREG(st.st_mode):
        if not os.access(path, os.R_OK):
            raise Failure(f"cannot read '{path}': Permission denied")
        if st.st_dev in _sizeless_filesystems():  # sysfs says 4096 (or 0) whatever a file holds
            return None
        return st.st_size or None
    if not stat.S_ISBLK(st.st_mode):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise Failure(f"cannot read '{path}': {exc.strerror}") from None
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


@dataclass
class _File:
    path: str
    offset: int
    length: Optional[int]  # None: until the end of a file read front to back
    stream: bool = False  # read front to back with read(2), not in parallel

    def result(self, r: FileResult, device: Optional[int], verified: bool) -> dict[str, Any]:
        if device is None or self.stream:
            backend, reason = "posix", r.backend_reason if self.stream else _HOST_REASON
        else:
            backend, reason = r.read_backend or "posix", r.backend_reason or ""
        return {
            "path": self.path,
            "offset": self.offset,
            "bytes": r.bytes,
            "seconds": r.seconds,
            "gb_per_s": gb_per_s(r.bytes, r.seconds),
            "backend": backend,
            "backend_reason": reason,
            "verified": verified and r.status == "done",
            "status": r.status,
            "error": r.error,
        }


def _plan(paths: list[str], offset: int, length: Optional[int], verify: bool,
          unusable: Optional[list[tuple[int, str, str]]] = None) -> list[_File]:
    """The files to read. ``unusable``: where to put (index, path, why) for a
    file that cannot be read (missing, unreadable, too short for the range),
    so that the others are read; without it, such a file ends the command."""
    files = []
    for i, p in enumerate(paths):
        path = options.check_path(p, "FILE")
        if unusable is not None:
            try:
                files.extend(_plan([path], offset, length, verify))
            except Failure as exc:
                unusable.append((i, path, str(exc)))
            continue
        size = file_size(path)
        if size is None:
            if offset and stat.S_ISREG(os.stat(path).st_mode):
                raise Failure(f"--offset {offset} is past the end of '{path}' (0 bytes; a procfs or sysfs file "
                              "that reports 0 bytes is read front to back, from its start)")
            if offset:
                raise UsageError(f"--offset needs a regular file or block device; '{path}' is read front to back")
            if verify and not stat.S_ISREG(os.stat(path).st_mode):
                raise UsageError(f"--verify needs a regular file or block device; '{path}' cannot be read twice")
            files.append(_File(path, 0, length, stream=True))
            continue
        if offset > size:
            raise Failure(f"--offset {offset} is past the end of '{path}' ({size} bytes)")
        want = size - offset if length is None else length
        if offset + want > size:
            raise Failure(
                f"'{path}' has {byte_count(size - offset)} from offset {offset}; --length asks for {want}"
            )
        files.append(_File(path, offset, want))
    return files


def read(
    files: Annotated[
        list[str],
        typer.Argument(
            metavar="FILE...",
            help="Files (or devices) to read; devices, FIFOs and procfs files are read front to back.",
            show_default=False,
        ),
    ],
    offset: Annotated[
        Optional[int],
        typer.Option("--offset", parser=size_option, metavar="SIZE", help="Start this far into each file."),
    ] = None,
    length: Annotated[
        Optional[int],
        typer.Option(
            "--length",
            parser=size_option,
            metavar="SIZE",
            help="Read this many bytes of each file (default: to the end).",
        ),
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Compare the bytes loaded with a plain read of each file.")
    ] = False,
    device: options.Device = None,
    devices: options.Devices = None,
    replicate: Annotated[
        bool,
        typer.Option(
            "--replicate",
            help="With --devices: load each whole file into every GPU named, read from storage once and copied "
            "GPU to GPU (each needs the file's size free on every GPU).",
            rich_help_panel="Memory",
        ),
    ] = False,
    host: options.Host = False,
    chunk_size: options.ChunkSize = None,
    threads: options.Threads = None,
    task_size: options.TaskSize = None,
    compat_mode: options.CompatModeOpt = None,
    json: options.Json = False,
    quiet: options.Quiet = False,
    debug: options.Debug = False,
) -> None:
    """Load FILEs (or a range of each) into GPU memory and report bytes, seconds, GB/s and the backend.

    The files move together (many in flight, large ones split among the
    workers, through buffers of --chunk-size each) under one progress bar;
    one that fails does not stop the others. Without a
    GPU, or with --host, the files are read into host memory instead.

    With --devices 0,1 (or all) the files and large files' chunks are
    shared out among the GPUs by bytes, each GPU with its own staging and
    streams; the table shows what each GPU moved. With --replicate each file
    is loaded whole into every GPU named, read from storage once.

    Example: gdscp read /data/shard-*.bin --device 1 --verify
    """
    out = Output("read", json=json, quiet=quiet, debug=debug)
    with out.guard(), options.settings(threads, task_size, compat_mode):
        world = ranks.join(out, threads)
        if world is not None:  # one rank of an MPI job: the files are shared among the ranks
            ranks.refuse_options(world, out, {"--devices": devices is not None, "--replicate": replicate})
        # Several files: one that cannot be read is a failed file, not the end of the command.
        unusable: Optional[list[tuple[int, str, str]]] = [] if len(files) > 1 else None
        if world is not None:
            with ranks.protocol(world):
                ranks.read(world, out, lambda: _plan(files, offset or 0, length, verify, unusable), host=host,
                            device=device, chunk_size=chunk_size, verify=verify, report=report,
                            unusable=unusable, range_offset=offset or 0)
            return
        plan = _plan(files, offset or 0, length, verify, unusable)
        for _, _, why in unusable or []:
            out.error(why)
        spread = options.choose_devices(host, device, devices)
        if replicate:
            if spread is None:
                raise UsageError("--replicate needs --devices: the GPUs to load each file into")
            if offset or length is not None:
                raise UsageError("--replicate loads whole files; it cannot be used with --offset or --length")
            if chunk_size is not None:
                raise UsageError("--replicate copies whole files GPU to GPU, through no buffer of --chunk-size; "
                                 "it cannot be used with --chunk-size")
            for f in plan:
                if f.stream or not stat.S_ISREG(os.stat(f.path).st_mode):
                    raise UsageError(f"--replicate needs regular files; '{f.path}' is not one")
        where = options.choose_memory(out, host, device) if spread is None else spread[0]
        total = sum(f.length or 0 for f in plan)
        known = None if any(f.length is None for f in plan) else total
        largest = None if known is None else max((f.length for f in plan), default=0)
        staging_size = options.staging_size(chunk_size, len(spread) if spread else 1, largest)
        if not replicate:  # which moves whole files GPU to GPU, through no staging
            options.check_staging(staging_size, spread or ([] if where is None else [where]))

        def failed(r: FileResult) -> None:
            path = plan[r.index].path
            out.error(f"cannot read '{path}': {r.error}" if r.errno is not None else r.error)

        setup = time.perf_counter()
        ready = ready_gpus(spread if spread is not None else ([] if where is None else [where]), known)
        setup_seconds = time.perf_counter() - setup
        with TransferProgress(out, total, len(plan), "read", enabled=out.show_progress) as progress:
            start = time.perf_counter()
            if not plan:
                job = None
            elif replicate:
                job = read_files([f.path for f in plan], devices=spread, replicate=True, verify=verify)
            else:
                job = stream_files(
                    [f.path for f in plan],
                    ranges=[(f.offset, f.length) for f in plan],
                    device=None if spread else where,
                    devices=spread,
                    verify=verify,
                    staging_size=staging_size,
                )
            results = run_job(job, progress, failed) if job is not None else []
            seconds = time.perf_counter() - start
            per_device = job.device_bytes() if job is not None else {}
            del job, ready  # the replicas' GPU memory
        put_back(plan, results, unusable, offset or 0)

        report(out, plan, results, where, verify, seconds, {"setup_seconds": setup_seconds}, spread=spread,
               replicate=replicate, device_bytes=per_device if spread else None)


def put_back(plan: list[_File], results: list[FileResult], unusable: Optional[list[tuple[int, str, str]]],
             offset: int) -> None:
    """The files that could not be read, as failed files in their places."""
    for i, path, why in unusable or []:
        plan.insert(i, _File(path, offset, 0))
        results.insert(i, FileResult(i, path, None, "failed", 0, 0.0, why, None, None, None, None, None))


def ready_gpus(gpus: list[int], nbytes: Optional[int] = None) -> list[Any]:
    """A byte of memory on each GPU, to keep until the files are read, and
    the workers' streams and pinned staging for it (gdscp.prepare): made
    before the clock starts. That costs a few hundred milliseconds once per
    process (the GPU's context most of it), is not the loading of the files,
    and is reported apart from it (``setup_seconds``). Each GPU gets its share
    of the workers' staging, or no more than ``nbytes`` (the job's bytes, when
    known) fill: a small job pins little."""
    from .. import defaults, memory  # noqa: PLC0415
    from ..buffer import prepare  # noqa: PLC0415

    held = [memory.allocate(1, d) for d in gpus]
    if not gpus or defaults.get("compat_mode") == defaults.CompatMode.OFF:
        return held  # cuFile only: no staging of gdscp's own
    share = -(-int(defaults.get("num_threads")) // len(gpus))
    if nbytes is not None:
        per_worker = int(defaults.get("bounce_buffer_size")) * int(defaults.get("pipeline_depth"))
        share = min(share, max(1, -(-nbytes // (len(gpus) * per_worker))))
    for d in gpus:
        prepare(d, share)
    return held


def report(out: Output, plan: list[_File], results: list[FileResult], where: Optional[int], verify: bool,
           seconds: float, extra: Optional[dict[str, Any]] = None, *, spread: Optional[list[int]] = None,
           replicate: bool = False, device_bytes: Optional[dict[int, int]] = None) -> None:
    """The table, or the JSON document; exit code 1 if any file failed.
    ``spread``: the GPUs a job spread over (``replicate``: each file loaded
    into every one), and ``device_bytes`` each one's share."""
    ok = all(r.status == "done" for r in results)
    nbytes = sum(r.bytes for r in results)
    data = {
        "command": "read",
        "ok": ok,
        "memory": "host" if where is None else "gpu",
        "device": where,
        "devices": spread,
        "replicate": replicate,
        "device_bytes": {str(d): n for d, n in device_bytes.items()} if device_bytes else None,
        "files": [f.result(r, where, verify) for f, r in zip(plan, results)],
        "bytes": nbytes,
        "seconds": seconds,
        "gb_per_s": gb_per_s(nbytes, seconds),
        "verified": verify and ok,  # every file was read twice and matched
        **(extra or {}),
    }

    def render() -> Table:
        on_ranks = f" on each of {data['ranks']} ranks" if data.get("ranks") else ""
        name = options.memory_name(where) if spread is None else options.devices_name(spread)
        from rich.table import Table  # noqa: PLC0415 - only for a table shown

        table = Table(title=f"{'replicated' if replicate else 'read'} into {name}{on_ranks}", title_justify="left")
        for name in ("file", "bytes", "time", "rate", "backend"):
            table.add_column(name, justify="right" if name in ("bytes", "time", "rate") else "left")
        for f in data["files"]:
            table.add_row(shown(f["path"]), format_bytes(f["bytes"]), format_seconds(f["seconds"]),
                          format_rate(f["bytes"], f["seconds"]), f["backend"] if f["status"] == "done" else "failed")
        if len(plan) > 1:
            table.add_row("total", format_bytes(nbytes), format_seconds(seconds), format_rate(nbytes, seconds), "",
                          style="bold")
        captions = []
        if spread and len(spread) > 1 and not replicate and device_bytes:
            captions.append("per GPU: " + ", ".join(f"{d}: {format_bytes(n)}" for d, n in device_bytes.items()))
        if verify and ok:
            captions.append("verified: every byte matches a plain read")
        if data.get("setup_seconds") and where is not None:
            captions.append(f"GPU setup before the clock started: {format_seconds(data['setup_seconds'])}")
        table.caption = "; ".join(captions) or None
        return table

    out.result(data, render)
    if not ok:
        raise typer.Exit(EXIT_FAILURE)
