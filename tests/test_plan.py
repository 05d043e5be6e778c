"""How a device read's workers divide a request into staging pieces
(PieceStream over ChunkQueue::claim). The GPU path uses exactly this code; here
its claims are checked on the host, for many interleavings of the workers."""

import pytest

from gdscp import _core

KiB, MiB = 1 << 10, 1 << 20
STEP = 64 * KiB  # graded first pieces grow in steps of this


def claims(size, chunk, piece, workers, stagger, seed=0, offset=4095):
    return [
        (w, buf, fo, n)
        for w, buf, fo, n in _core._plan_pieces(offset, size, chunk, piece, workers, stagger, seed)
    ]


def check_cover(got, size, offset):
    """Every byte claimed exactly once, at the matching file offset."""
    pos = 0
    for _, buf, fo, n in sorted(got, key=lambda c: c[1]):
        assert buf == pos and fo == offset + buf and n > 0
        pos += n
    assert pos == size


SHAPES = [  # (chunk, piece): piece below, equal to and above the chunk size
    (16 * MiB, 4 * MiB),
    (2 * MiB, 256 * KiB),
    (2 * MiB, MiB + 4096),
    (256 * KiB, 4 * MiB),
]
SIZES = [1, 4095, 4 * MiB, 4 * MiB + 1, 33 * MiB + 12345, 130 * MiB + 7]


@pytest.mark.parametrize("chunk,piece", SHAPES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("workers", [1, 3, 16])
@pytest.mark.parametrize("stagger", [True, False])
def test_every_byte_claimed_once(chunk, piece, size, workers, stagger):
    for seed in range(3):
        got = claims(size, chunk, piece, workers, stagger, seed)
        check_cover(got, size, 4095)
        unit = min(piece, chunk)
        assert max(n for *_, n in got) <= unit


@pytest.mark.parametrize("workers", [3, 16])
def test_claims_follow_the_request_in_order(workers):
    """Claims are handed out in file order, whichever worker asks."""
    got = claims(130 * MiB + 7, 16 * MiB, 4 * MiB, workers, True, seed=5)
    assert [c[1] for c in got] == sorted(c[1] for c in got)


def test_unstaggered_pieces_are_whole_but_the_last():
    got = claims(33 * MiB + 12345, 16 * MiB, 4 * MiB, 3, False)
    sizes = [n for *_, n in got]
    assert sizes[:-1] == [4 * MiB] * (len(sizes) - 1) and sizes[-1] == (33 * MiB + 12345) % (4 * MiB)


@pytest.mark.parametrize("workers", [3, 7, 16])
def test_first_pieces_are_graded_by_join_order(workers):
    """For a large read the k-th worker to start claims (k + 1) / workers of a
    piece first (rounded up to 64 KiB), then whole pieces."""
    piece, size = 4 * MiB, 130 * MiB + 7
    got = claims(size, 16 * MiB, piece, workers, True, seed=workers)
    first, joined = {}, []
    for w, _, _, n in got:
        if w not in first:
            first[w] = n
            joined.append(w)
    assert len(joined) == workers
    for k, w in enumerate(joined):
        want = min(piece, -(-(piece * (k + 1) // workers) // STEP) * STEP)
        assert first[w] == want
    firsts = {min(i for i, c in enumerate(got) if c[0] == w) for w in joined}
    rest = [n for i, (*_, n) in enumerate(got[:-1]) if i not in firsts]
    assert rest and all(n == piece for n in rest)


def test_small_reads_are_not_graded():
    """Below 2 x workers x piece every claim is a whole piece: medium reads keep
    their even split over the workers."""
    workers, piece = 16, 256 * KiB
    size = 2 * workers * piece - 1
    got = claims(size, piece, piece, workers, True)
    assert [n for *_, n in got][:-1] == [piece] * (len(got) - 1)


def test_one_worker_reads_everything():
    got = claims(130 * MiB + 7, 16 * MiB, 4 * MiB, 1, True)
    assert {w for w, *_ in got} == {0}
    check_cover(got, 130 * MiB + 7, 4095)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_tail_is_shared(seed):
    """The pieces of the request's last chunk go to whichever workers are free,
    not all to the one worker that claimed the chunk (as when whole chunks were
    claimed): no worker is left reading a chunk's pieces one after another
    while the others have finished."""
    size, chunk = 256 * MiB, 16 * MiB
    got = claims(size, chunk, 4 * MiB, 16, True, seed=seed)
    last_chunk = [w for w, buf, _, _ in got if buf >= size - chunk]
    assert len(set(last_chunk)) > 1
