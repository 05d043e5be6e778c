"""``gdscp write``: fill GPU (or host) memory with a pattern and write it to
files. One file is written in pieces through ``CuFile`` (any size; devices and
FIFOs in place); several go as one bulk job (gdscp.bulk.write_files), all from
one buffer holding the pattern, since the bytes depend only on position."""

from __future__ import annotations

import collections
import enum
import errno
import os
import stat
import time
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from .. import CuFile, _core, memory
from .._interrupts import through_interrupts
from ..bulk import clean_temporaries
from ..page_cache import drop_file_page_cache as drop_cache
from . import options, ranks
from .atomic import DirectoryMoved, commit, discard, fsync_dir, keep_owner, make_temp, moved, signals_held
from .jobs import run_job
from .output import EXIT_FAILURE, Failure, Output, UsageError, describe, shown
from .progress import TransferProgress
from .special import (SequentialWriter, check_descriptor_room, check_room, own_descriptor, read_back,
                      writes_in_place)
from .units import byte_count, format_bytes, format_rate, format_seconds, gb_per_s, size_option

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["write", "drop_cache", "verify_pattern"]

_VERIFY_BLOCK = 4 << 20


class Pattern(str, enum.Enum):
    zeros = "zeros"
    random = "random"
    seq = "seq"


def verify_pattern(path: str, size: int, kind: str, seed: int, shown_as: Optional[str] = None) -> None:
    """Raise ``Failure`` unless ``path`` holds exactly ``size`` bytes of the
    pattern (a block device: at least ``size`` bytes, the first of them the
    pattern); messages name ``shown_as`` (the destination of a temporary file)."""
    fd = os.open(path, os.O_RDONLY)
    path = shown_as or path
    try:
        drop_cache(fd)
        if stat.S_ISBLK(os.fstat(fd).st_mode):  # its size is its length, which fstat does not give
            actual = os.lseek(fd, 0, os.SEEK_END)
            if actual < size:
                raise Failure(f"verify failed: '{path}' has {byte_count(actual)}, fewer than {size}")
        else:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise Failure(f"verify failed: '{path}' has {byte_count(actual)}, expected {size}")
        block = bytearray(min(_VERIFY_BLOCK, max(size, 1)))
        pos = 0
        while pos < size:
            n = min(len(block), size - pos)
            view = memoryview(block)[:n]
            got = os.preadv(fd, [view], pos)
            if got != n:
                raise Failure(f"verify failed: '{path}' ended at offset {pos + got}")
            where = memory.first_difference(view, memory.pattern(n, kind, seed, pos))
            if where is not None:
                raise Failure(f"verify failed: '{path}' differs from the {kind} pattern at offset {pos + where}")
            pos += n
    finally:
        os.close(fd)


def write(
    files: Annotated[
        list[str],
        typer.Argument(
            metavar="FILE...",
            help="Files to create or overwrite (one FILE may also be a device, written in place).",
            show_default=False,
        ),
    ],
    size: Annotated[
        int,
        typer.Option(
            "--size", "-s", parser=size_option, metavar="SIZE", help="Bytes to write (4096, 4K, 1M, 1.5GiB...)."
        ),
    ],
    pattern: Annotated[
        Pattern,
        typer.Option(
            "--pattern",
            case_sensitive=False,
            help="zeros; random (splitmix64 of --seed and position); seq (each 8-byte word holds its offset).",
        ),
    ] = Pattern.zeros,
    seed: Annotated[
        int, typer.Option("--seed", parser=options.count_option(0), metavar="N", help="Seed of the random pattern.")
    ] = 0,
    fsync: Annotated[
        bool, typer.Option("--fsync/--no-fsync", help="fsync before reporting (the time includes it).")
    ] = True,
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Read the file back and check every byte (past the page cache, once fsynced)."),
    ] = False,
    fail_fast: Annotated[
        bool, typer.Option("--fail-fast", help="With several FILEs: stop at the first that fails.")
    ] = False,
    device: options.Device = None,
    devices: options.Devices = None,
    host: options.Host = False,
    chunk_size: options.ChunkSize = None,
    threads: options.Threads = None,
    task_size: options.TaskSize = None,
    compat_mode: options.CompatModeOpt = None,
    json: options.Json = False,
    quiet: options.Quiet = False,
    debug: options.Debug = False,
) -> None:
    """Fill GPU memory with a pattern and write SIZE bytes of it to each FILE, like dd.

    FILE is created or replaced: the bytes go to a temporary file beside it,
    renamed over FILE once all are written (and fsynced), so an interrupted
    write leaves the old FILE intact (a device is written in place). Sizes larger than the buffer are written in
    chunks, the next chunk filled while the previous one is written; the bytes
    depend only on pattern, seed and position, so they are the same however the
    file was written. Without a GPU, or with --host, host memory is used.
    With --devices 0,1 (or all) the pieces are filled and written from the
    GPUs in turn, two buffers on each.

    Several FILEs (regular files) are written at once, as one bulk job from
    one buffer of SIZE bytes holding the pattern: a file that fails is
    reported and the others are still written (unless --fail-fast); the exit
    code is then 1.

    Example: gdscp write /data/test.bin --size 10G --pattern random --seed 7 --verify
    """
    out = Output("write", json=json, quiet=quiet, debug=debug)
    with out.guard(), options.settings(threads, task_size, compat_mode):
        paths = [options.check_path(f, "FILE") for f in files]
        out.writes_data_to(paths)
        if seed >= 1 << 64:
            raise UsageError(f"--seed {seed} does not fit in 64 bits")
        if len(paths) > 1:
            if chunk_size is not None:
                raise UsageError("--chunk-size cannot be used with several FILEs: they are written from one buffer "
                                 "of SIZE bytes")
            _write_many(out, paths, size, kind=pattern.value, seed=seed, fsync=fsync, verify=verify,
                        fail_fast=fail_fast, host=host, device=device, devices=devices, threads=threads)
            return
        # One of this process's descriptors (/dev/stdout, /dev/fd/N) is
        # written through, whatever it refers to (see gdscp.cli.special).
        descriptor = own_descriptor(paths[0])
        path = paths[0] if descriptor is not None else _through_link(paths[0])
        directory = _names_a_directory(path)
        if directory:
            raise Failure(f"cannot write '{path}': {directory}")
        # A device or FIFO is written in place; a regular file (or a new one)
        # beside its final name, renamed into place once complete, so that an
        # interrupted or failed write never leaves a partial FILE where a good one was.
        special = writes_in_place(path) if descriptor is None else os.fstat(descriptor)
        if descriptor is None and special is not None and stat.S_ISSOCK(special.st_mode):
            raise Failure(f"cannot write to '{path}': it is a socket")
        readable = special is None or stat.S_ISBLK(special.st_mode) or (
            descriptor is not None and stat.S_ISREG(special.st_mode))
        if verify and not readable:
            raise UsageError(f"--verify cannot read '{path}' back: it is not a regular file or block device")
        if special is None:  # (a descriptor's is its fstat)
            if _core.is_temporary_name(os.path.basename(path)):
                raise Failure(f"will not write '{path}': its name is that of a gdscp temporary file, which the "
                              "next run into its directory would remove as a dead run's")
            # Dead runs' leftovers, as bulk jobs remove them (only those no live
            # writer holds locked): before the space is counted, which they hold.
            clean_temporaries(os.path.dirname(os.path.abspath(path)))
        if descriptor is None:
            check_room(path, size, special)
        else:
            check_descriptor_room(path, descriptor, size)
        world = ranks.join(out, threads)
        if world is not None:  # one rank of an MPI job: each rank writes its range of one temporary file
            irregular = f"'{path}' is not a regular file: under MPI only regular files are written"
            if descriptor is not None:
                irregular = f"'{path}' is a descriptor of this process: under MPI only regular files are written"
            ranks.refuse_options(world, out, {"--devices": devices is not None},
                                 irregular if special is not None else None)
            with ranks.protocol(world):
                _write_across(world, out, path, size, kind=pattern.value, seed=seed, fsync=fsync, verify=verify,
                              host=host, device=device, chunk_size=chunk_size)
            return
        # fsync means nothing to a character device or FIFO.
        synced = fsync and (special is None or stat.S_ISBLK(special.st_mode)
                            or (descriptor is not None and stat.S_ISREG(special.st_mode)))
        spread = options.choose_devices(host, device, devices)
        where = options.choose_memory(out, host, device) if spread is None else spread[0]
        gpus = spread or [where]
        chunk = options.chunk_size(chunk_size, size, where, 2 * len(gpus))
        npieces = -(-size // chunk)
        nslots = min(2 * len(gpus), npieces)
        if spread is None:
            buffer = memory.allocate(chunk * nslots, where)
            slots = [buffer[i * chunk : (i + 1) * chunk] for i in range(nslots)]
        else:
            # Slot i on GPU gpus[i % n]: consecutive pieces come from the GPUs in turn.
            slots = [memory.allocate(chunk, gpus[i % len(gpus)]) for i in range(nslots)]
        kind = pattern.value
        filled = [False] * nslots

        def fill(slot: int, pos: int, n: int) -> None:
            if kind == "zeros" and filled[slot]:
                return  # zeros do not depend on the position
            memory.fill(slots[slot][:n], kind, seed, pos)
            filled[slot] = True

        if special is None:
            try:
                target = make_temp(path)
            except OSError as exc:
                if exc.errno == errno.EACCES and os.path.lexists(path) and not _may_write(path):
                    raise Failure(f"cannot overwrite '{path}': {exc.strerror}") from None  # FILE's own mode
                if os.path.lexists(path):  # FILE is there: it is its directory that refuses
                    raise Failure(f"cannot write '{path}': no temporary file can be made beside it, to be renamed "
                                  f"over it once complete ({exc.strerror})") from None
                raise Failure(f"cannot create '{path}': {exc.strerror}") from None
        else:
            target = path
        try:
            if descriptor is not None:
                sink: Any = SequentialWriter(path, descriptor)
                backend, reason = "posix", f"written through descriptor {descriptor}, front to back"
            elif special is None or stat.S_ISBLK(special.st_mode):
                sink = CuFile(target, "w" if special is None else "r+")
                backend = "posix" if where is None else sink.backend
                reason = "host memory always takes the POSIX path" if where is None else sink.backend_reason
            else:
                sink = SequentialWriter(target)
                backend, reason = "posix", "a character device or FIFO is written front to back"
            with sink:
                if npieces:
                    fill(0, 0, min(chunk, size))  # before the clock starts: the first fill is not a write
                with TransferProgress(out, size, 1, "write", enabled=out.show_progress) as progress:
                    start = time.perf_counter()
                    write_range(sink, slots, fill, chunk, 0, size, progress, path)
                    if synced:
                        try:
                            os.fsync(sink.fileno())
                        except OSError as exc:
                            raise Failure(f"cannot fsync '{path}': {exc.strerror}") from None
                    seconds = time.perf_counter() - start
                    progress.file_done()

            if special is None:
                if verify:  # before the name: a file that fails it never replaces the old one
                    verify_pattern(target, size, kind, seed, shown_as=path)
                keep_owner(target, path)
                os.chmod(target, _new_file_mode(path))
                # Once renamed, the name is made durable before an interrupt
                # can end the command: FILE is then the complete, durable file.
                with signals_held():
                    try:
                        commit(target, path)
                    except DirectoryMoved:
                        raise
                    except OSError as exc:  # it names the temporary file, removed on the way out
                        raise Failure(f"cannot rename the new file into place at '{path}': {exc.strerror}") from None
                    if fsync:
                        fsync_dir(os.path.dirname(os.path.abspath(path)))
        except OSError as exc:
            # FILE's directory moved (or removed) while it was written: the
            # temporary file went with it, and its path leads nowhere.
            if special is None and (isinstance(exc, DirectoryMoved) or moved(target, path)):
                folder = os.path.dirname(path) or "."
                raise Failure(f"cannot write '{path}': the destination directory '{folder}' was moved or removed "
                              "during the write") from None
            # The engine names the file it wrote, here the temporary one, gone
            # by the time the error is read: said with FILE, as several are.
            if special is None and f"'{path}'" not in str(exc):
                raise Failure(f"cannot write '{path}': {describe(exc)[0]}") from exc
            raise
        finally:
            if special is None:
                discard(target)  # removed wherever its directory went (nothing to do once renamed)

        if verify and descriptor is not None:  # the bytes just written through it, wherever they began
            read_back(path, descriptor, size, lambda pos, n: memory.pattern(n, kind, seed, pos), f"the {kind} pattern")
        elif verify and special is not None:  # a device, written in place
            verify_pattern(path, size, kind, seed)
        data = {
            "command": "write",
            "ok": True,
            "path": path,
            "bytes": size,
            "seconds": seconds,
            "gb_per_s": gb_per_s(size, seconds),
            "pattern": kind,
            "seed": seed,
            "fsync": synced,
            "memory": "host" if where is None else "gpu",
            "device": where,
            "devices": spread,
            "backend": backend,
            "backend_reason": reason,
            "verified": verify,
        }

        def render() -> Table:
            notes = _pattern_notes(kind, seed, synced) + (["verified"] if verify else [])
            return _table(where, spread, "backend", [(path, size, seconds, backend)], notes)

        out.result(data, render)


def _write_many(out: Output, paths: list[str], size: int, *, kind: str, seed: int, fsync: bool, verify: bool,
                fail_fast: bool, host: bool, device: Any, devices: Any, threads: Any) -> None:
    """Several regular files, one bulk job: each a temporary file beside it,
    renamed into place once complete (and fsynced), all from one buffer. A
    file that cannot be written (no such directory, a full disk) fails alone."""
    from ..bulk import write_files  # noqa: PLC0415

    seen: dict[str, int] = {}
    for i, p in enumerate(paths):
        first = seen.setdefault(os.path.realpath(p), i)
        if first != i:
            same = paths[first]
            raise UsageError(f"'{p}' is named twice" if same == p else f"'{same}' and '{p}' name the same file")
        if own_descriptor(p) is not None:
            raise UsageError(f"'{p}' is a descriptor of this process, written through it, front to back: several "
                             "FILEs must all be regular files named as such (write it alone)")
        if writes_in_place(p) is not None or _names_a_directory(p):
            raise UsageError(f"'{p}' is not a regular file: several FILEs must all be regular files")
    world = ranks.join(out, threads)
    if world is not None:
        ranks.refuse_options(world, out, {},
                             "under MPI, gdscp write writes one FILE (its ranges shared among the ranks)")
    spread = options.choose_devices(host, device, devices)
    where = options.choose_memory(out, host, device) if spread is None else spread[0]
    gpus = spread or [where]
    if size > memory.available_bytes(where):
        raise UsageError(
            f"several FILEs are written from one buffer of SIZE bytes, and {format_bytes(size)} does not fit in "
            f"{options.memory_name(where)}: write them one at a time"
        )
    # One buffer per GPU (each GPU's workers write from their own), filled
    # before the clock starts: filling is not writing.
    buffers = {g: memory.allocate(size, g) for g in gpus}
    for b in buffers.values():
        memory.fill(b, kind, seed, 0)
    owner = [gpus[i % len(gpus)] for i in range(len(paths))]

    def failed(r: Any) -> None:
        # An error that names FILE is said as it is; one that names only the
        # temporary file (".FILE.XXXXXXXX.gdscp-tmp", which holds FILE's name)
        # is said with FILE first.
        path = paths[r.index]
        out.error(r.error if f"'{path}'" in (r.error or "") else f"cannot write '{path}': {r.error}")

    with TransferProgress(out, size * len(paths), len(paths), "write", enabled=out.show_progress) as progress:
        start = time.perf_counter()
        job = write_files([buffers[g] for g in owner], paths, fsync=fsync, fail_fast=fail_fast, devices=spread,
                          verify=verify)
        results = run_job(job, progress, failed)
        seconds = time.perf_counter() - start
    del job, buffers
    # Each file's (status, error); --verify read each back before its rename.
    # A file cancelled by --fail-fast was never written: it says so, and has
    # no backend.
    cancelled = "not written: an earlier file failed (--fail-fast)"
    outcome = [(r.status, r.error or (cancelled if r.status == "cancelled" else None)) for r in results]
    ok = all(status == "done" for status, _ in outcome)
    backend = next((r.write_backend for r in results if r.write_backend), "posix")
    nbytes = sum(r.bytes for r in results)
    data = {
        "command": "write",
        "ok": ok,
        "paths": paths,
        "files": [
            {
                "path": paths[r.index],
                "status": status,
                "bytes": r.bytes,
                "seconds": r.seconds,
                "error": error,
                "backend": None if status == "cancelled" else r.write_backend,
            }
            for r, (status, error) in zip(results, outcome)
        ],
        "bytes": nbytes,
        "seconds": seconds,
        "gb_per_s": gb_per_s(nbytes, seconds),
        "pattern": kind,
        "seed": seed,
        "fsync": fsync,
        "memory": "host" if where is None else "gpu",
        "device": where,
        "devices": spread,
        "backend": backend,
        "verified": verify and ok,
    }

    def render() -> Table:
        notes = [f"{len(paths)} files, {format_bytes(nbytes)} in {format_seconds(seconds)} "
                 f"({format_rate(nbytes, seconds)})", *_pattern_notes(kind, seed, fsync)]
        if verify:
            notes.append("verified" if ok else "verify failed")
        rows = [(f["path"], f["bytes"], f["seconds"], f["status"]) for f in data["files"]]
        return _table(where, spread, "status", rows, notes)

    out.result(data, render)
    if not ok:
        raise typer.Exit(EXIT_FAILURE)


def _through_link(path: str) -> str:
    """Where writing ``path`` goes: a symbolic link's target, as ``copy`` and
    ``dd`` write through one; a dangling link is refused, as GNU cp refuses it."""
    if not os.path.islink(path):
        return path
    try:
        target = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise Failure(f"not writing through dangling symbolic link '{path}'") from None
        raise Failure(f"cannot write '{path}': {exc.strerror}") from None
    if not (stat.S_ISREG(target.st_mode) or stat.S_ISDIR(target.st_mode)):
        # A pipe or a device (/dev/stdout, /dev/fd/N): opened through the link,
        # since what it points at may have no name to open (pipe:[...]).
        return path
    return os.path.realpath(path)


def _may_write(path: str) -> bool:
    """Whether this process may write ``path`` (as its effective user)."""
    return os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)


def _names_a_directory(path: str) -> str:
    """Why ``path`` names a directory (an existing one, or a name ending in
    the separator), or "" where it does not."""
    if os.path.isdir(path):
        return "it is a directory"
    if path.endswith(os.sep):
        return f"a name ending in '{os.sep}' names a directory"
    return ""


def _pattern_notes(kind: str, seed: int, fsynced: bool) -> list[str]:
    return [f"pattern {kind}" + (f", seed {seed}" if kind == "random" else ""), "fsynced" if fsynced else "not fsynced"]


def _table(where: Any, spread: Any, last: str, rows: list[tuple], notes: list[str]) -> Table:
    """The result table: a row (file, bytes, seconds, ``last``) per file."""
    name = options.memory_name(where) if spread is None else options.devices_name(spread)
    from rich.table import Table  # noqa: PLC0415 - only for a table shown

    table = Table(title=f"write from {name}", title_justify="left")
    for col in ("file", "bytes", "time", "rate", last):
        table.add_column(col, justify="right" if col in ("bytes", "time", "rate") else "left")
    for path, nbytes, seconds, tail in rows:
        table.add_row(shown(path), format_bytes(nbytes), format_seconds(seconds), format_rate(nbytes, seconds), tail)
    table.caption = "; ".join(notes)
    return table


def _write_across(world: Any, out: Output, path: str, size: int, *, kind: str, seed: int, fsync: bool,
                  verify: bool, host: bool, device: Any, chunk_size: Any) -> None:
    """``gdscp write`` on every rank of an MPI job: rank 0 makes the temporary
    file, each rank writes (and fsyncs) its range of the pattern, and rank 0
    renames the file into place once every range is durable (gdscp.cli.ranks)."""
    from ..mpi.split import split_by_bytes  # noqa: PLC0415

    def setup() -> tuple[Any, Any]:
        where = ranks.choose_memory(out, host, device)
        tmp = None
        if world.root:
            try:
                tmp = make_temp(path)
                ranks.reserve(tmp, size)
            except OSError as exc:
                raise Failure(f"cannot create '{path}': {exc.strerror}") from None
        return where, tmp

    where, tmp = ranks.phase(world, out, setup)  # on failure, rank 0's guard removes the temporary file
    tmp = world.bcast(tmp)
    piece = ([p for p in split_by_bytes([size], world.size)[world.rank]] or [None])[0]

    def write_share() -> str:
        if piece is None or piece.length == 0:
            return "posix"
        chunk = options.chunk_size(chunk_size, piece.length, where, 2)
        nslots = min(2, -(-piece.length // chunk))
        buffer = memory.allocate(chunk * nslots, where)
        slots = [buffer[i * chunk : (i + 1) * chunk] for i in range(nslots)]

        def fill(slot: int, pos: int, n: int) -> None:
            memory.fill(slots[slot][:n], kind, seed, pos)

        fill(0, piece.offset, min(chunk, piece.length))
        try:
            opened = CuFile(tmp, "r+")
        except FileNotFoundError:
            if world.root:
                raise
            # The only file a rank opens is the one rank 0 made, under a fresh
            # name: a rank that does not find it sees another directory (one
            # of its node's own), and the name is one the user never gave.
            folder = os.path.dirname(path) or "."
            raise Failure(f"cannot write '{path}': rank {world.rank} sees another '{folder}' than rank 0 (rank 0's "
                          "temporary file is not in it)") from None
        with opened as sink, TransferProgress(
            out.stderr, piece.length, 1, f"write (rank 0 of {world.size})", enabled=world.root and out.show_progress
        ) as progress:
            write_range(sink, slots, fill, chunk, piece.offset, piece.offset + piece.length, progress, path)
            if fsync:
                os.fsync(sink.fileno())
            return "posix" if where is None else sink.backend

    world.barrier()
    start = time.perf_counter()
    code, messages, backend = ranks.run(world, write_share)
    everyone = world.agree(code, messages)
    seconds = time.perf_counter() - start

    def conclude(ok: bool) -> None:
        if not ok:  # a range is missing: no file takes the name
            discard(tmp)
            return
        if verify:  # before the name: a file that fails it never replaces the old one
            try:
                verify_pattern(tmp, size, kind, seed, shown_as=path)
            except Failure:
                discard(tmp)
                raise
        try:
            keep_owner(tmp, path)
            os.chmod(tmp, _new_file_mode(path))
            commit(tmp, path)
        except OSError as exc:
            if isinstance(exc, DirectoryMoved) or moved(tmp, path):  # removed by rank 0's guard, wherever it went
                raise Failure(f"cannot write '{path}': the destination directory '{os.path.dirname(path) or '.'}' "
                              "was moved or removed during the write") from None
            raise
        if fsync:
            fsync_dir(os.path.dirname(os.path.abspath(path)))
        data = {
            "command": "write", "ok": True, "path": path, "bytes": size, "seconds": seconds,
            "gb_per_s": gb_per_s(size, seconds), "pattern": kind, "seed": seed, "fsync": fsync,
            "memory": "host" if where is None else "gpu", "device": where, "backend": backend,
            "verified": verify, "ranks": world.size,
        }
        out.result(data, lambda: f"wrote {format_bytes(size)} to {path} in {format_seconds(seconds)} "
                                 f"({format_rate(size, seconds)}) from {world.size} ranks"
                                 + ("; verified" if verify else ""))

    ranks.conclude(world, out, conclude, everyone)


def _new_file_mode(path: str) -> int:
    """The mode `open(path, "w")` would leave: an existing file's, else 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_range(sink: Any, slots: list, fill: Any, chunk: int, start: int, end: int, progress: TransferProgress,
                path: str) -> None:
    """Bytes [start, end) of the pattern into ``sink`` (CuFile) in pieces of
    ``chunk``, the slots used in turn, each refilled while the others are
    written; the first piece's slot 0 is filled by the caller."""
    pending: collections.deque = collections.deque()
    try:
        for k in range(-(-(end - start) // chunk)):
            pos = start + k * chunk
            n = min(chunk, end - pos)
            slot = k % len(slots)
            if len(pending) == len(slots):
                _finish(progress, pending.popleft(), path)
            if k:
                fill(slot, pos, n)
            pending.append((sink.pwrite(slots[slot][:n], n, pos), pos, n))
        while pending:
            _finish(progress, pending.popleft(), path)
    finally:
        _stop_all(pending)


def _stop_all(pending: collections.deque) -> None:
    """Cancel the writes in flight and wait for each to end, through any
    interrupt meanwhile (raised once they have): the file must not close,
    nor the slots go, under a transfer."""

    def cancel_all() -> None:  # (cancelling twice is harmless)
        for future, _pos, _n in pending:
            future.cancel()

    def wait_all() -> None:
        while pending:
            try:
                pending[0][0].get()
            except Exception:  # noqa: BLE001, S110 - the first error is the one reported
                pass
            pending.popleft()

    cancelled, waited = through_interrupts(cancel_all), through_interrupts(wait_all)
    if cancelled or waited:
        raise cancelled or waited


def _finish(progress: TransferProgress, item, path: str) -> None:
    future, pos, n = item
    moved = progress.wait(future)
    if moved != n:
        raise Failure(f"short write to '{path}' at offset {pos + moved}")
