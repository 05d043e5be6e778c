"""Many files at once: read files into buffers, write buffers to files, copy
files to files, all in one job over the engine's worker pool.

``read_files``, ``write_files`` and ``copy_files`` start a job and return a
``BulkJob`` at once. Workers take whole small files, so their per-file costs
overlap; a large file is cut into chunks that idle workers join. Copies move
through staging memory of a bounded size (GPU memory with ``device=N``, host
memory otherwise), whatever the number of files. A destination name only ever
shows a complete, durable file (docs/durability.md).

``devices=[0, 1]`` (or ``"all"``) spreads a job over several GPUs: each has
its own workers, staging and streams; files are shared out by bytes and a
large file's chunks among all of them. ``replicate`` (or ``read_files(...,
replicate=True)``) reads a file once into every GPU named (docs/multi-gpu.md).

    job = gdscp.copy_files([("a.bin", "/mnt/a.bin"), ("b.bin", "/mnt/b.bin")], device=0)
    job.wait()                        # Ctrl-C while waiting cancels the job
    for r in job.results():
        print(r.destination, r.status, r.bytes, r.seconds, r.error)
"""

from __future__ import annotations

import atexit
import bisect
import functools
import math
import numbers
import os
import stat
import time
from typing import Any, Iterable, NamedTuple, Optional, Sequence, Union

from . import _args, _buffers, _core, _gpus, _libs, defaults
from ._interrupts import ended_by_uncaught_exception, through_interrupts

__all__ = [
    "BulkJob",
    "BulkProgress",
    "FileResult",
    "TEMPORARY_SUFFIX",
    "clean_temporaries",
    "copy_files",
    "create_temporary",
    "read_files",
    "replicate",
    "stop_running_jobs",
    "stream_files",
    "write_files",
]

PathLike = Union[str, "os.PathLike[str]"]

#: Every temporary file's name ends with this (``.NAME.XXXXXXXX.gdscp-tmp``).
TEMPORARY_SUFFIX: str = _core.TEMPORARY_SUFFIX

# The engine's BulkStatus, by value.
_STATUS = ("pending", "running", "done", "failed", "skipped", "cancelled")
_READ, _WRITE, _COPY = 0, 1, 2
_DEFAULT_STAGING = _core.BulkOptions().staging_size
_WAIT_SLICE = 0.1  # seconds per wait, so that Ctrl-C is seen


class FileResult(NamedTuple):
    """One file of a job. ``status``: "done", "failed", "skipped" (an existing
    destination under ``no_clobber``), "cancelled", or "pending"/"running"
    while the job runs. ``seconds``: the file's own transfer time (opening,
    moving, its own fsync), not time spent waiting for a worker."""

    index: int
    source: Optional[str]
    destination: Optional[str]
    status: str
    bytes: int
    seconds: float
    error: Optional[str]  # what failed, where and why
    errno: Optional[int]  # the OS error number of an OS failure
    read_backend: Optional[str]  # "posix" or "cufile"
    write_backend: Optional[str]
    backend_reason: Optional[str]  # why device memory took that backend; how a host copy moved its bytes
    note: Optional[str]  # why a file was skipped: "exists", or "appeared" during the copy


class BulkProgress(NamedTuple):
    bytes_done: int
    bytes_total: int  # each file's size as given until it opens, then as found (0 if it never moves)
    files_done: int  # done or skipped
    files_failed: int
    files_total: int
    finished: bool


def stop_running_jobs() -> None:
    """Cancel every job of this process that is still running and wait for
    each to stop (its temporary files removed): for a program that leaves on
    an exception from somewhere no job's own wait would see. The engine knows
    each job from before its workers start, so this finds one whose
    ``BulkJob`` an interrupt kept from ever being made or held."""
    through_interrupts(_core.stop_running_jobs)  # the files stop within a second: wait for them


def _stop_on_uncaught_exception() -> None:
    """At the exit of a program that an exception nothing caught ends (Ctrl-C
    in a loop that polls ``progress()`` or ``done()``, outside any wait):
    its running jobs cancelled, as their own wait would have cancelled them.
    Otherwise the interpreter's release of each job waits for its last file,
    deaf to another Ctrl-C: minutes for a large job, for ever for a FIFO
    nobody writes. A program that ends normally, or the interactive prompt,
    leaves its jobs to finish as before."""
    if ended_by_uncaught_exception():
        stop_running_jobs()


atexit.register(_stop_on_uncaught_exception)


class BulkJob:
    """A running job. ``wait(timeout)`` (Ctrl-C cancels), ``cancel()``,
    ``progress()``, ``failures()`` while it runs; ``results()`` per file.
    As a context manager it waits on exit, and cancels first when the block
    raised. ``arrays``: the buffers ``read_files`` made, in order.

    While it runs the job holds the buffers given to it (a bytearray cannot
    be resized meanwhile). Once ``wait()``, ``done()``, ``progress()`` or
    ``results()`` has seen it finished it holds none of them: a bytearray
    can be resized, and a buffer its owner drops is freed (``arrays`` stay)."""

    def __init__(self, items: list[tuple], options: Any, keep: Any = None, arrays: Optional[list] = None,
                 replicas: Optional[list[tuple[int, list[int]]]] = None,
                 source_ids: Optional[list[tuple[int, int, int]]] = None):
        self._items = items
        self.arrays = arrays
        self.devices: Optional[list[int]] = list(options.devices) or None
        # The engine's job holds `keep` (the buffers and staging) while its
        # workers may use it, even when this object is dropped while it runs,
        # and lets it go once a call here sees the job finished.
        self._job = _core.BulkJob(items, options, defaults._settings, replicas or [], keep, source_ids or [])

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until every file has ended (or ``timeout`` seconds); True once
        finished. An exception while waiting (Ctrl-C) cancels the job, waits
        for the files in flight to stop, and propagates."""
        job = self._job
        if timeout is not None and not isinstance(timeout, numbers.Real):
            raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
        if timeout is not None and not timeout == timeout:
            raise ValueError("timeout must be a number of seconds or None, not NaN")
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                left = _WAIT_SLICE if deadline is None else min(_WAIT_SLICE, deadline - time.monotonic())
                if job.wait(max(left, 0.0)):
                    return True
                if deadline is not None and time.monotonic() >= deadline:
                    return False
        except BaseException:
            self._stop()
            raise

    def _stop(self) -> None:
        """Cancel, then wait until the files in flight have stopped and their
        temporary files are gone, even through more interrupts meanwhile (a
        second Ctrl-C must not leave the job running behind the exception)."""
        self._job.cancel()
        through_interrupts(lambda: self._job.wait(-1.0))  # the files stop within a second: wait for them

    def done(self) -> bool:
        return self._job.done()

    def cancel(self) -> None:
        """Files not started are cancelled; those in flight stop at their next
        chunk, and their temporary files are removed. ``wait()`` still waits."""
        self._job.cancel()

    def progress(self) -> BulkProgress:
        return BulkProgress(*self._job.progress())

    def results(self) -> list[FileResult]:
        """Every file's result, in the order given (waits for the job first)."""
        self.wait()
        return self._job.file_results(FileResult, self._items, _STATUS)

    def failures(self) -> list[FileResult]:
        """The files that failed so far, in the order they failed."""
        return self._job.file_failures(FileResult, self._items, _STATUS)

    def device_bytes(self) -> dict[int, int]:
        """Bytes moved so far by each GPU's workers, for a job over ``devices``
        (empty for a job without them)."""
        if not self.devices:
            return {}
        return dict(zip(self.devices, self._job.group_bytes()))

    def __enter__(self) -> "BulkJob":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._stop()
        else:
            self.wait()


def _options(
    *,
    fsync: bool = True,
    atomic: bool = True,
    no_clobber: bool = False,
    fail_fast: bool = False,
    verify: bool = False,
    preserve: bool = False,
    staging: int = 0,
    staging_size: Optional[int] = None,
) -> Any:
    options = _core.BulkOptions()
    options.sync = _core.BulkSync.auto if fsync else _core.BulkSync.none
    options.atomic = atomic
    options.no_clobber = no_clobber
    options.fail_fast = fail_fast
    options.verify = verify
    options.preserve = preserve
    options.staging = staging
    if staging_size is not None:
        options.staging_size = _staging_size(staging_size)
    if not defaults.is_compat_mode_preferred():
        options.cufile_library = _libs.cufile_wheel_library()
    return options


def device_list(devices: Any) -> list[int]:
    """The GPUs a job spreads over: ``"all"``, or ordinals (an int, or a
    sequence of them, each at most once); every one checked usable."""
    if isinstance(devices, str):
        if devices.strip().lower() != "all":
            raise ValueError(f"devices must be 'all' or GPU numbers, not {devices!r}")
        status = _gpus.gpu_available()
        if not status:
            raise _gpus.DeviceError(f"devices='all' needs a GPU: {status.reason}")
        return list(range(status.count))
    if isinstance(devices, int) or hasattr(devices, "__index__"):
        devices = [devices]
    out = [_args.integer(d, "device") for d in devices]
    if not out:
        raise ValueError("devices must name at least one GPU")
    for d in out:
        if out.count(d) > 1:
            raise ValueError(f"GPU {d} is named twice in devices")
        _gpus.check_device(d)
    return out


def _devices(device: Optional[int], devices: Any) -> Optional[list[int]]:
    """``devices`` as a list, or None for a job on ``device`` alone (or host memory)."""
    if devices is None:
        return None
    if device is not None:
        raise ValueError("give device or devices, not both")
    return device_list(devices)


def _spread_staging(devices: list[int], staging_size: Optional[int], options: Any) -> list:
    """Staging of ``staging_size`` bytes on each GPU, set on ``options``; what keeps it alive."""
    per_gpu = [_staging(d, staging_size) for d in devices]
    options.devices = devices
    options.stagings = [address for address, _, _ in per_gpu]
    options.staging_size = per_gpu[0][2]
    return [keep for _, keep, _ in per_gpu]


def _staging_size(staging_size: Any) -> int:
    """``staging_size`` as a byte count the engine takes (a size_t): a
    ValueError for 0, an OverflowError for a negative or too large number,
    a TypeError for one that is not an integer (as ``_args`` checks sizes)."""
    size = _args.size(staging_size, "staging_size")
    if size < 1:
        raise ValueError(f"staging_size must be positive (got {size})")
    return size


def _job_staging(device: Optional[int], devices: Any, staging_size: Optional[int],
                 staging: Any) -> tuple[Optional[list[int]], int, Any, int]:
    """(spread, address, keep, size) for a job through staging memory: the
    GPUs it spreads over (None: one GPU or host memory), and ``_staging``'s
    answer for one GPU (host staging where the job spreads: each GPU's own is
    set by ``_spread_staging``)."""
    if staging_size is not None:
        _staging_size(staging_size)
    spread = _devices(device, devices)
    if spread is not None and staging is not None:
        raise ValueError("staging is one buffer; with devices each GPU gets staging of its own")
    return (spread, *_staging(None if spread else device, staging_size, staging))


def _paths(paths: Iterable[PathLike], what: str = "paths") -> list[str]:
    """Each path as a str. One path where several are expected is a
    TypeError (a str would be taken as paths of one character each), an
    empty one a ValueError naming its item."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError(f"{what} must be several paths (a list), not one {type(paths).__name__}")
    out = [_args.path(p) for p in paths]
    for i, p in enumerate(out):
        if not p:
            raise ValueError(f"{what}[{i}] is an empty path")
    return out


def _pairs(pairs: Iterable[Any]) -> list[tuple[str, str]]:
    """Each ``(src, dst)`` as a pair of str (see ``_paths``)."""
    if isinstance(pairs, (str, bytes, os.PathLike)):
        raise TypeError(f"pairs must be (src, dst) pairs (a list), not one {type(pairs).__name__}")
    out = []
    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes, os.PathLike)) or len(pair) != 2:
            raise TypeError(f"pairs[{i}] must be a (src, dst) pair, not {pair!r}")
        src, dst = _paths(pair, f"pairs[{i}]")
        out.append((src, dst))
    return out


def _range(part: Any, src: str) -> tuple[int, Optional[int]]:
    """A range of ``src`` given as ``(offset, length)``, as ints (length None:
    to the end): TypeError for another shape or a number that is not an
    integer, OverflowError if either is negative or the range ends past
    2**63-1 (as ``_args`` checks a file offset)."""
    if isinstance(part, (str, bytes)) or len(part) != 2:
        raise TypeError(f"a range of '{src}' must be (offset, length), not {part!r}")
    offset, length = part
    start = _args.integer(offset, "range offset")
    count = None if length is None else _args.integer(length, "range length")
    where = f"range ({_args.shown(start)}, {_args.shown(count)}) of '{src}'"
    if start < 0 or (count is not None and count < 0):
        raise OverflowError(f"{where} must not be negative")
    if start + (count or 0) > _args.MAX_OFFSET:
        raise OverflowError(f"{where} ends past 2**63-1")
    return start, count


def _copied_range(part: Any, src: str) -> tuple[int, int]:
    """``_range``, whose length a copied range needs."""
    offset, length = _range(part, src)
    if length is None:
        raise ValueError(f"range ({offset}, None) of '{src}': a copied range needs its length")
    return offset, length


def _distinct_destinations(paths: Iterable[tuple[int, str]], *, in_place: bool = False,
                           shared: Iterable[int] = ()) -> None:
    """ValueError, naming both, if two items would write the same file: both
    would report "done" while only one's bytes remained (or, written in
    place, their bytes would interleave). A name is its directory, as the
    filesystem knows it (device and inode, so "a/../b" and a symbolic link to
    a directory are found), and its last component; an existing symbolic link
    is also what a write through it replaces; a FIFO or device, and with
    ``in_place`` any existing file, is also the file itself (two names of it
    written in place). One lookup per name, before anything is written.
    ``shared``: the items that may share a file with each other (ranges of
    it, which ``_ranges_apart`` checks), though not with any other item."""
    numbered = list(paths)
    names = [p for _, p in numbered]
    shared = set(shared)
    if shared:
        # The first item that shares a file with an earlier one it may not share it with.
        clashes = []
        for group in _same_files(names, in_place):
            others = [k for k in group if numbered[k][0] not in shared]
            if others:
                clashes.append((group[0], group[1] if others[0] == group[0] else others[0]))
        clashes.sort(key=lambda pair: (pair[1], pair[0]))
    else:
        clashes = _core.same_destinations(names, [], in_place)
    if clashes:
        (i, first), (j, later) = numbered[clashes[0][0]], numbered[clashes[0][1]]
        if first == later:
            raise ValueError(f"destination '{later}' is given twice (items {i} and {j})")
        raise ValueError(f"destinations '{first}' (item {i}) and '{later}' (item {j}) name the same file")


def _same_files(paths: list[str], in_place: bool) -> list[list[int]]:
    """The indices of ``paths`` that name one file, as ``_distinct_destinations``
    compares names, in groups of two or more, each in order and the groups in
    the order of their first index."""
    parent = list(range(len(paths)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for a, b in _core.same_destinations(paths, [], in_place):
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for k in range(len(paths)):
        groups.setdefault(root(k), []).append(k)
    return [group for _, group in sorted(groups.items()) if len(group) > 1]


def _sources_not_replaced(pairs: list[tuple[str, str]], whole: list[int]) -> None:
    """ValueError, naming both items, if a source of the copy is a file that
    another item replaces (``whole``: the items that replace their
    destination). The job reads sources while it puts copies in place (a job
    of a few files each copy as it ends, one of many batch by batch), so a
    later source can be read after an earlier copy took its name, and a swap
    of two files named in one job would lose one of them. Names
    are compared as ``_distinct_destinations`` compares them (a source read
    through a symbolic link is the file it points at); a hard link to a
    destination is another name, which the replacement leaves as it was."""
    dsts = [pairs[i][1] for i in whole]
    # (item replacing, item reading); one source read twice is no harm, and
    # two destinations are refused before.
    found = [(whole[first], later - len(dsts))
             for first, later in _core.same_destinations(dsts + [src for src, _ in pairs], [], False)
             if first < len(dsts) <= later]
    onto_itself = {i for i, j in found if i == j}  # fails on its own, saying so, and replaces nothing
    for i, j in found:
        if i != j and i not in onto_itself and not _character_device(pairs[j][0]):
            raise ValueError(f"source '{pairs[j][0]}' (item {j}) is the destination '{pairs[i][1]}' of item {i}: "
                             f"whether item {j} copies it before or after item {i} replaces it depends on timing; "
                             "copy them in two jobs")


def _ranges_apart(pairs: list[tuple[str, str]], parts: list[Optional[tuple[int, int]]]) -> None:
    """ValueError, naming both items, if a range that one item writes in place
    (``parts[i]``, an ``(offset, length)`` of ``pairs[i][1]``) overlaps a range
    that another item writes into the same file, or that another item reads
    (the whole source, or its range): which bytes remain, or which bytes the
    reader copies, would depend on timing. Ranges of one file that do not
    overlap may share their destination (a file copied in parts). Files are
    compared as written in place: by name, and an existing file by device and
    inode, so a hard link to it is the same file. A character device
    (/dev/null) is no file whose bytes the items share."""
    writers = [i for i, part in enumerate(parts) if part is not None and part[1] > 0]
    if not writers:
        return
    names = [pairs[i][1] for i in writers] + [src for src, _ in pairs]
    for group in _same_files(names, True):
        spans = []  # (start, end, writes, item)
        for k in group:
            if k < len(writers):
                offset, length = parts[writers[k]]
                spans.append((offset, offset + length, True, writers[k]))
            else:
                j = k - len(writers)
                start, end = (0, math.inf) if parts[j] is None else (parts[j][0], parts[j][0] + parts[j][1])
                if end > start:
                    spans.append((start, end, False, j))
        clash = _overlapping(spans)
        if clash is None or _character_device(names[group[0]]):
            continue
        (i, writes_too), j = clash
        if writes_too:
            i, j = min(i, j), max(i, j)
            (first, later), timing = (pairs[i][1], pairs[j][1]), "whose bytes remain there depends on timing"
            if first == later:
                raise ValueError(f"destination '{first}' takes overlapping ranges {parts[i]} (item {i}) and "
                                 f"{parts[j]} (item {j}): {timing}")
            raise ValueError(f"destinations '{first}' (item {i}) and '{later}' (item {j}) name the same file and "
                             f"take overlapping ranges {parts[i]} and {parts[j]}: {timing}")
        raise ValueError(f"source '{pairs[i][0]}' (item {i}) is the destination '{pairs[j][1]}' of item {j}, which "
                         f"writes its range {parts[j]}: whether item {i} copies those bytes before or after item "
                         f"{j} writes them depends on timing; copy them in two jobs")


def _overlapping(spans: list[tuple[int, Any, bool, int]]) -> Optional[tuple[tuple[int, bool], int]]:
    """Among ``(start, end, writes, item)`` spans of one file: a written span
    and another item's span (written or read) that overlap, as ((the other
    item, whether it writes), the writing item); None if there are none."""
    # Per kind, the two items whose spans reach furthest, each at most once:
    # one of them is another item's wherever another's reaches that far.
    furthest: dict[bool, list[list]] = {True: [], False: []}
    for start, end, writes, item in sorted(spans, key=lambda span: span[0]):
        for kind in ((True, False) if writes else (True,)):
            for other_end, other in furthest[kind]:
                if other != item and other_end > start:
                    return ((other, kind), item) if writes else ((item, False), other)
        reach = furthest[writes]
        mine = next((entry for entry in reach if entry[1] == item), None)
        if mine is None:
            reach.append([end, item])
        else:
            mine[0] = max(mine[0], end)
        reach.sort(key=lambda entry: entry[0], reverse=True)
        del reach[2:]
    return None


def _not_mapped_elsewhere(items: list[tuple]) -> None:
    """ValueError naming the item if a host buffer written in place is a
    mapping of its own destination (an ``np.memmap`` of the file, sliced)
    whose bytes come from other offsets than they go to, where the ranges
    overlap: the file's chunks are written at once, so a chunk could read
    bytes that another had already overwritten. A mapping at the offsets it
    is written to (a memmap written back to its file) is fine. Mappings are
    known from /proc/self/maps, their files by device and inode, or by path
    where the filesystem shows the mapping under another device (btrfs,
    overlayfs)."""
    host = [(k, item[3], item[5]) for k, item in enumerate(items) if not item[4] and item[5] > 0]
    if not host:
        return
    try:
        with open("/proc/self/maps", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    maps = []  # (start, end, file offset, device, inode, path) of each file mapping
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[4] == b"0":
            continue
        start, end = (int(x, 16) for x in fields[0].split(b"-"))
        major, minor = (int(x, 16) for x in fields[3].split(b":"))
        maps.append((start, end, int(fields[2], 16), os.makedev(major, minor), int(fields[4]), fields[5]))
    if not maps:
        return
    starts = [m[0] for m in maps]
    for k, ptr, nbytes in host:
        at = max(bisect.bisect_right(starts, ptr) - 1, 0)
        found = None
        for start, end, offset, dev, ino, name in maps[at:]:
            if start >= ptr + nbytes:
                break
            if end <= ptr:
                continue
            shift = offset - start + ptr  # the file offset of the buffer's first byte
            first = offset + max(ptr, start) - start
            last = offset + min(ptr + nbytes, end) - start
            if shift != 0 and first < nbytes and last > 0:  # bytes read from the range the buffer is written to
                if found is None:
                    try:
                        st = os.stat(items[k][2])
                        found = (st.st_dev, st.st_ino, os.fsencode(os.path.realpath(items[k][2])))
                    except OSError:
                        break
                if (dev, ino) == found[:2] or name == found[2]:
                    raise ValueError(f"buffers[{k}] maps bytes [{first}, {last}) of '{items[k][2]}', which it writes "
                                     f"to [{first - shift}, {last - shift}): in place (atomic=False) the "
                                     "chunks written at once would read bytes already overwritten; write it with "
                                     "atomic=True, or from a copy")


def _character_device(path: str) -> bool:
    """Whether ``path`` is a character device (/dev/null, /dev/zero): one item
    may read it while another writes it, neither seeing the other's bytes."""
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _size_to_allocate(path: str) -> int:
    """The bytes of a new buffer for ``path``: its size, where the kernel tells
    it. A FIFO or device has none, and procfs and sysfs report 0 bytes for
    files with content: a buffer sized by them would silently get nothing."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"cannot size a buffer for '{path}': it is not a regular file; pass a buffer for it")
    if st.st_size == 0 and st.st_dev in _sizeless_filesystems():
        raise ValueError(f"cannot size a buffer for '{path}': files of /proc and /sys report 0 bytes; "
                         "pass a buffer for it")
    return st.st_size


@functools.lru_cache(maxsize=1)
def _sizeless_filesystems() -> frozenset[int]:
    """The devices of /proc and /sys, whose files report a size of 0."""
    found = set()
    for root in ("/proc", "/sys"):
        try:
            found.add(os.stat(root).st_dev)
        except OSError:
            pass
    return frozenset(found)


def _balanced(sizes: list[int], devices: list[int]) -> list[int]:
    """A GPU for each of ``sizes``: the largest first, each to the GPU with the
    fewest bytes so far (ties: the first)."""
    load = {d: 0 for d in devices}
    where = [devices[0]] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        d = min(devices, key=lambda d: load[d])
        where[i] = d
        load[d] += sizes[i]
    return where


def _staging(device: Optional[int], staging_size: Optional[int], staging: Any = None) -> tuple[int, Any, int]:
    """(address, keep, size) of the device staging memory: ``staging`` (a
    device buffer) if given, else new memory on GPU ``device``; (0, None, size)
    for host staging, which the engine allocates."""
    if staging is not None:
        b = _buffers.resolve(staging, writable=True)
        if not b.device:
            raise ValueError("staging must be device memory (host staging is the engine's own)")
        return b.ptr, b.keep, b.nbytes
    size = _DEFAULT_STAGING if staging_size is None else int(staging_size)
    if device is None:
        return 0, None, size
    _gpus.check_device(device)
    # The engine's own allocation, not memory.allocate: nothing but the engine
    # touches staging, and CuPy would cost its import and its context set-up
    # (a quarter of a second on a GPU machine) for no use.
    array = _core.DeviceBuffer(size, device)
    b = _buffers.resolve(array, writable=True)
    return b.ptr, (array, b.keep), size


def _resolved(buf: Any, writable: bool, name: str, path: str) -> Any:
    """``_buffers.resolve(buf)``, its error (of the same type) naming the
    item: ``name`` (``buffers[3]``) and the file it is for."""
    try:
        return _buffers.resolve(buf, writable=writable)
    except (TypeError, ValueError, BufferError) as exc:
        raise type(exc)(f"{name} (for '{path}'): {exc}") from None


def _buffer_items(kind: int, paths: list[str], buffers: Sequence[Any]) -> tuple[list[tuple], list]:
    """The engine's items for reads into (or writes from) ``buffers``, and what keeps the memory alive."""
    if len(buffers) != len(paths):
        raise ValueError(f"{len(paths)} paths but {len(buffers)} buffers")
    plain = _core.plain_buffer_items(kind, paths, buffers)  # the common buffers, in C++
    if plain is not None:
        return plain
    items, keep = [], []
    for i, (path, buf) in enumerate(zip(paths, buffers)):
        b = _resolved(buf, kind == _READ, f"buffers[{i}]", path)
        keep.append(b.keep)
        src, dst = (path, "") if kind == _READ else ("", path)
        items.append((kind, src, dst, b.ptr, b.device, b.nbytes, 0, False, -1, True, False, 0, 0, False))
    return items, keep


def read_files(
    paths: Iterable[PathLike],
    buffers: Optional[Sequence[Any]] = None,
    *,
    device: Optional[int] = None,
    devices: Any = None,
    replicate: bool = False,
    fail_fast: bool = False,
    verify: bool = False,
) -> BulkJob:
    """Read each file into its buffer (host or device memory; a file longer
    than its buffer fills it, a shorter one leaves the rest as it was and its
    result says how many bytes came). Without ``buffers``: new arrays of each
    file's size, on GPU ``device`` or (None) in host memory, as ``job.arrays``
    (a file that has no size to go by, a FIFO, device or procfs file, is a
    ``ValueError``: give it a buffer; one whose size cannot be looked up (missing,
    or in a folder that cannot be searched) raises its ``OSError`` before the
    job starts, since its array cannot be made).
    ``devices``: GPUs (or "all") to spread the files over, balanced by bytes,
    each GPU's files read by its own workers. ``replicate`` (with ``devices``):
    every file into every GPU named, read from storage once; ``job.arrays[i]``
    is then the list of file i's arrays, one per GPU in ``devices`` order (with
    ``buffers``, ``buffers[i]`` is such a list). ``verify``: compare what landed
    with a plain read of each file."""
    paths = _paths(paths)
    spread = _devices(device, devices)
    if replicate and spread is None:
        raise ValueError("replicate needs devices: the GPUs to read each file into")
    from . import memory  # noqa: PLC0415

    arrays = None
    replicas: list[tuple[int, list[int]]] = []
    keep_more: list = []
    if replicate:
        assert spread is not None
        if buffers is None:
            arrays = [[memory.allocate(n, d) for d in spread] for n in map(_size_to_allocate, paths)]
            buffers = arrays
        if len(buffers) != len(paths):
            raise ValueError(f"{len(paths)} paths but {len(buffers)} buffers")
        firsts = []
        for i, group in enumerate(buffers):
            group = list(group)
            if len(group) != len(spread):
                raise ValueError(f"replicate: file {i} has {len(group)} buffers for {len(spread)} devices")
            resolved = [_resolved(b, True, f"buffers[{i}][{j}]", paths[i]) for j, b in enumerate(group)]
            if any(not b.device for b in resolved):
                raise ValueError("replicate: every buffer must be device memory")
            if len({b.nbytes for b in resolved}) != 1:
                raise ValueError(f"replicate: file {i}'s buffers differ in size")
            keep_more.append([b.keep for b in resolved])
            firsts.append(group[0])
            if len(group) > 1 and resolved[0].nbytes:
                replicas.append((i, [b.ptr for b in resolved[1:]]))
        buffers = firsts
    elif buffers is None:
        if spread is None:
            arrays = [memory.allocate(_size_to_allocate(p), device) for p in paths]
        else:
            sizes = [_size_to_allocate(p) for p in paths]
            arrays = [memory.allocate(n, d) for n, d in zip(sizes, _balanced(sizes, spread))]
        buffers = arrays
    items, keep = _buffer_items(_READ, paths, buffers)
    options = _options(fail_fast=fail_fast, verify=verify)
    if spread is not None:
        options.devices = spread
    return BulkJob(items, options, (keep, keep_more), arrays, replicas)


def replicate(path: PathLike, devices: Any = "all", *, verify: bool = False) -> list:
    """The file at ``path`` in every GPU of ``devices`` (ordinals or "all"),
    read from storage once and copied GPU to GPU (over NVLink where there is
    one; through host memory where the GPUs cannot reach each other): one array
    per GPU, in ``devices`` order. Raises ``OSError`` (or ``RuntimeError``)
    naming the file if it fails, and ``gdscp.memory.DeviceError`` (a
    ``ValueError``) for a GPU that cannot be used."""
    job = read_files([path], devices=devices, replicate=True, verify=verify)
    result = job.results()[0]
    if result.status != "done":
        if result.errno is not None:
            raise OSError(result.errno, result.error, result.source)
        raise RuntimeError(result.error or f"reading '{result.source}' was {result.status}")
    return job.arrays[0]


def stream_files(
    paths: Iterable[PathLike],
    *,
    ranges: Optional[Sequence[tuple[int, Optional[int]]]] = None,
    device: Optional[int] = None,
    devices: Any = None,
    verify: bool = False,
    fail_fast: bool = False,
    staging_size: Optional[int] = None,
    staging: Any = None,
) -> BulkJob:
    """Read each file through staging memory (GPU ``device``'s, or host
    memory) without keeping the bytes: how fast files load, as ``gdscp read``
    measures it. ``ranges``: ``(offset, length)`` per file, length None for the
    rest of it; a file that ends before its length, or before its offset,
    fails (a range that starts at its end is empty). Files without a size
    (devices, FIFOs, procfs) are read front to back to their end. ``staging``:
    a device buffer to use instead of new memory on ``device``. ``devices``:
    GPUs (or "all") to spread the files and their chunks over, each with
    ``staging_size`` bytes of staging of its own."""
    paths = _paths(paths)
    if ranges is not None and len(ranges) != len(paths):
        raise ValueError(f"{len(paths)} paths but {len(ranges)} ranges")
    spread, address, keep, size = _job_staging(device, devices, staging_size, staging)
    items = []
    for i, path in enumerate(paths):
        offset, length = (0, None) if ranges is None else _range(ranges[i], path)
        exact = length is not None
        items.append((_READ, path, "", 0, False, -1 if length is None else length, offset, exact, -1,
                      True, False, 0, 0, False))
    options = _options(fail_fast=fail_fast, verify=verify, staging=address, staging_size=size)
    if spread is not None:
        keep = _spread_staging(spread, staging_size, options)
    return BulkJob(items, options, keep)


def write_files(
    buffers: Sequence[Any],
    paths: Iterable[PathLike],
    *,
    fsync: bool = True,
    atomic: bool = True,
    no_clobber: bool = False,
    fail_fast: bool = False,
    devices: Any = None,
    verify: bool = False,
) -> BulkJob:
    """Write each buffer (host or device memory) to its file. ``atomic``: a
    temporary file beside each, renamed into place once complete (and, with
    ``fsync``, durable); an existing file keeps its mode, a new one gets 0666
    less the umask. ``no_clobber``: an existing file is left alone ("skipped").
    ``verify``: each file, fsynced and read back from storage, is compared
    with its buffer before it takes the name (a mismatch fails the file).
    ``devices``: the GPUs (or "all") whose buffers these are; each GPU's
    files are written by its own workers, through staging near it. Without
    ``atomic`` a buffer that maps its own destination at other offsets than
    it is written to, overlapping them, is a ValueError (docs/durability.md)."""
    paths = _paths(paths)
    _distinct_destinations(enumerate(paths), in_place=not atomic)
    items, keep = _buffer_items(_WRITE, paths, buffers)
    if not atomic:
        _not_mapped_elsewhere(items)
    options = _options(fsync=fsync, atomic=atomic, no_clobber=no_clobber, fail_fast=fail_fast, verify=verify)
    if devices is not None:
        options.devices = device_list(devices)
    return BulkJob(items, options, keep)


def copy_files(
    pairs: Iterable[tuple[PathLike, PathLike]],
    *,
    device: Optional[int] = None,
    devices: Any = None,
    fsync: bool = True,
    no_clobber: bool = False,
    preserve: bool = False,
    verify: bool = False,
    fail_fast: bool = False,
    staging_size: Optional[int] = None,
    sizes: Optional[Sequence[int]] = None,
    staging: Any = None,
    ranges: Optional[Sequence[Optional[tuple[int, int]]]] = None,
    clean: bool = True,
    _source_ids: Optional[Sequence[Optional[tuple[int, int]]]] = None,
) -> BulkJob:
    """Copy each ``(src, dst)`` file, through GPU ``device``'s memory (storage
    -> GPU -> storage) or, with None, host memory; ``staging_size`` bytes of
    it in all. Without a GPU, regular files are copied inside the kernel
    (``copy_file_range``, as cp does; the result's ``backend_reason`` says
    so) and a sparse file's holes are kept, through host memory where the
    kernel cannot or O_DIRECT was asked for (``direct_io="on"``). Each
    destination appears only complete and (with ``fsync``) durable; an
    existing one keeps its mode (``preserve``: the source's mode and times);
    ``no_clobber`` never replaces one; ``verify`` compares each copy, read
    from storage, with its source before it takes the name.
    ``sizes``: the sources' sizes if known, for ``progress()``'s total from
    the start (without them it counts each file's size once it is opened).
    ``staging``: a device buffer to copy through instead of new memory on
    ``device``. ``devices``: GPUs (or "all") to spread the files and their
    chunks over, each with ``staging_size`` bytes of staging of its own.
    ``ranges``: per pair, None (the whole file) or ``(offset, length)``: those
    bytes of ``src`` (which must hold them all: a range that starts at its end
    is empty) written at the same offset into ``dst``, an existing file
    (a temporary file made with ``create_temporary``, often by another
    process) that is written in place, never renamed, its range fsynced;
    several processes copying a large file share one temporary file this way
    (gdscp.mpi). Ranges of one job share a destination where they do not
    overlap; two that overlap in one file, a range another item reads, or a
    destination also copied whole is a ValueError naming both items before
    anything is written, as is a destination given twice. ``clean``: remove dead runs' temporary files from each
    destination directory first."""
    # _source_ids (gdscp copy -r): per pair, None or the (st_dev, st_ino) of
    # the regular file its walk's lstat found: opened without following a
    # link, a source that is no longer that file fails its pair, "'src' was
    # replaced while being copied", as cp's does (with no_clobber, one whose
    # destination exists is skipped: nothing would have been written).
    pairs = _pairs(pairs)
    if sizes is not None and len(sizes) != len(pairs):
        raise ValueError(f"{len(pairs)} pairs but {len(sizes)} sizes")
    if ranges is not None and len(ranges) != len(pairs):
        raise ValueError(f"{len(pairs)} pairs but {len(ranges)} ranges")
    if _source_ids is not None and len(_source_ids) != len(pairs):
        raise ValueError(f"{len(pairs)} pairs but {len(_source_ids)} source ids")
    ids = [(i, found[0], found[1]) for i, found in enumerate(_source_ids or ()) if found is not None]
    parts = [None if ranges is None or ranges[i] is None else _copied_range(ranges[i], src)
             for i, (src, _) in enumerate(pairs)]
    # Ranges may share their destination where they do not overlap; whole files may not.
    whole = [i for i, part in enumerate(parts) if part is None]
    _distinct_destinations(enumerate(dst for _, dst in pairs), shared=set(range(len(pairs))) - set(whole))
    _sources_not_replaced(pairs, whole)
    _ranges_apart(pairs, parts)
    spread, address, keep, size = _job_staging(device, devices, staging_size, staging)
    items = []
    for i, (src, dst) in enumerate(pairs):
        part = parts[i]
        if part is None:
            known = -1 if sizes is None else _args.offset(sizes[i], f"sizes[{i}]")
            items.append((_COPY, src, dst, 0, False, known, 0, False, -1, not preserve, False, 0, 0, False))
        else:
            offset, length = part
            items.append((_COPY, src, dst, 0, False, length, offset, True, -1, True, False, 0, 0, True))
    options = _options(
        fsync=fsync,
        no_clobber=no_clobber,
        fail_fast=fail_fast,
        verify=verify,
        preserve=preserve,
        staging=address,
        staging_size=size,
    )
    options.clean = clean
    if spread is not None:
        keep = _spread_staging(spread, staging_size, options)
    return BulkJob(items, options, keep, source_ids=ids)


def clean_temporaries(directory: PathLike, keep: Iterable[PathLike] = ()) -> int:
    """Remove the temporary files that dead runs left in ``directory`` (those
    no live writer holds locked), but not the files that ``keep`` names
    (sources about to be read, however their paths are spelled); the number
    removed. Jobs do this by themselves for each directory they write into,
    leaving their own sources."""
    return _core.clean_temporaries(_args.path(directory), [_args.path(p) for p in keep])


def create_temporary(dst: PathLike, *, directory: bool = False) -> tuple[int, str] | tuple[int, str, int]:
    """A new, empty temporary file beside ``dst``, locked for as long as the
    returned descriptor is open: ``(fd, path)``. Close the descriptor after
    renaming or removing the file. With ``directory``: ``(fd, path, dir_fd)``,
    ``dir_fd`` a descriptor (``O_PATH``) of the directory the file was made
    in, to remove and rename it through (``os.unlink(name, dir_fd=dir_fd)``)
    wherever that directory is moved meanwhile; close it too."""
    return _core.create_temporary(_args.path(dst), directory=directory)
