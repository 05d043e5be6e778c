"""How a job's files are shared among ranks: by bytes, as mpiFileUtils'
``dcp`` does. The files, in the planner's order, are laid end to end; each
rank's share is an equal stretch of that line (the Exscan of the byte
counts), where every file also weighs ``file_cost`` bytes so that empty and
small files spread by number too. A file that falls in one rank's stretch is
that rank's whole; a larger one is cut on ``chunk`` boundaries, each rank
taking the chunks whose middle falls in its stretch (chunks of 1-64 MiB,
about a sixteenth of a stretch), so that a rank's part of
a file is one contiguous range. Pure: no MPI, no I/O; every rank computes
the same answer from the same list."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

__all__ = ["Piece", "split_by_bytes", "DEFAULT_CHUNK", "DEFAULT_FILE_COST", "MIN_CHUNK"]

DEFAULT_CHUNK = 64 << 20  # a large file is shared in pieces of at most this many bytes,
MIN_CHUNK = 1 << 20  # and at least this many: each rank's stretch is about 16 of them
DEFAULT_FILE_COST = 256 << 10  # what opening, syncing and renaming a file costs, in bytes moved


class Piece(NamedTuple):
    index: int  # the file, in the list given
    offset: int
    length: int
    whole: bool  # the whole file: this rank alone writes it (and renames it into place)


def _owner(point: int, total: int, ranks: int) -> int:
    return min(ranks - 1, point * ranks // total) if total else 0


def split_by_bytes(
    sizes: Sequence[int], ranks: int, *, chunk: Optional[int] = None, file_cost: int = DEFAULT_FILE_COST
) -> list[list[Piece]]:
    """Each rank's pieces of the files of ``sizes`` (in order), for ``ranks``
    ranks. ``chunk``: the piece size large files are cut in (default: a
    sixteenth of a rank's stretch, within MIN_CHUNK..DEFAULT_CHUNK)."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1 (got {ranks})")
    shares: list[list[Piece]] = [[] for _ in range(ranks)]
    total = sum(int(s) for s in sizes) + file_cost * len(sizes)
    if chunk is None:
        chunk = min(DEFAULT_CHUNK, max(MIN_CHUNK, total // (16 * ranks) // 4096 * 4096))
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 byte (got {chunk})")
    start = 0  # where the current file begins on the line
    for index, size in enumerate(sizes):
        size = int(size)
        if size < 0:
            raise ValueError(f"file {index} has a negative size ({size})")
        weight = size + file_cost
        if size <= chunk:
            shares[_owner(start + weight // 2, total, ranks)].append(Piece(index, 0, size, True))
        else:
            # Chunk k covers [k*chunk, ...) of the file; the file's cost rides on its first chunk.
            owners: list[tuple[int, int, int]] = []  # (rank, offset, length), merged
            for offset in range(0, size, chunk):
                length = min(chunk, size - offset)
                middle = start + file_cost + offset + length // 2
                rank = _owner(middle, total, ranks)
                if owners and owners[-1][0] == rank:
                    r, o, n = owners[-1]
                    owners[-1] = (r, o, n + length)
                else:
                    owners.append((rank, offset, length))
            whole = len(owners) == 1
            for rank, offset, length in owners:
                shares[rank].append(Piece(index, offset, length, whole))
        start += weight
    return shares
