"""How a device read's workers divide a request into staging pieces
(PieceStream over ChunkQueue). The GPU path uses exactly this code; here its
claims are checked on the host, for many interleavings of the workers."""

import pytest

from gdscp import _core

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
STEP = 64 * KiB  # graded first pieces grow in steps of this


def claims(size, chunk, piece, workers, stagger, seed=0, offset=4095, ahead=False):
    """(worker, buf_offset, file_offset, size) of each piece in claim order,
    and with ``ahead`` what the piece asks of the disk after itself if cold."""
    return [
        c if ahead else c[:4]
        for c in _core.testing.plan_pieces(offset, size, chunk, piece, workers, stagger, seed)
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


def by_chunk(got, chunk):
    """Pieces grouped by the chunk they belong to, each in claim order."""
    out = {}
    for i, (w, buf, _, n) in enumerate(got):
        out.setdefault(buf // chunk, []).append((i, w, buf, n))
    return out


@pytest.mark.parametrize("workers", [3, 16])
@pytest.mark.parametrize("seed", [5, 6])
def test_each_chunk_is_read_in_order_by_one_worker(workers, seed):
    """A worker claims a whole chunk and reads its pieces one after another in
    file order, so the readahead of one piece feeds the next; chunks are
    claimed in file order, whichever worker asks."""
    size, chunk = 130 * MiB + 7, 16 * MiB
    got = claims(size, chunk, 4 * MiB, workers, True, seed=seed)
    chunks = by_chunk(got, chunk)
    assert sorted(chunks) == list(range(-(-size // chunk)))
    for pieces in chunks.values():
        assert len({w for _, w, _, _ in pieces}) == 1
        assert [b for _, _, b, _ in pieces] == sorted(b for _, _, b, _ in pieces)
        w = pieces[0][1]
        mine = [i for i, c in enumerate(got) if c[0] == w]
        at = mine.index(pieces[0][0])
        assert [i for i, *_ in pieces] == mine[at:at + len(pieces)]  # nothing else in between
    firsts = [chunks[k][0][0] for k in sorted(chunks)]
    assert firsts == sorted(firsts)


@pytest.mark.parametrize("size", [4 * MiB, 33 * MiB + 12345, 130 * MiB + 7])
@pytest.mark.parametrize("workers", [1, 3, 16])
def test_a_chunks_first_piece_asks_for_the_rest_of_it_and_the_next_chunk(size, workers):
    """Where it is cold, a chunk's first piece asks the disk for the rest of
    the chunk and for the chunk after it, never past the request; the other
    pieces ask for nothing more."""
    chunk = 16 * MiB
    for stagger in (True, False):
        got = claims(size, chunk, 4 * MiB, workers, stagger, seed=workers, ahead=True)
        pieces = by_chunk([c[:4] for c in got], chunk)
        for k, members in pieces.items():
            end = max(buf + n for _, _, buf, n in members)
            for j, (i, _, buf, n) in enumerate(members):
                want = end - (buf + n) + min(chunk, size - end) if j == 0 else 0
                assert got[i][4] == want, (k, j)


def test_unstaggered_pieces_are_whole_but_the_last_of_a_chunk():
    size, chunk, piece = 33 * MiB + 12345, 16 * MiB, 4 * MiB
    got = sorted(claims(size, chunk, piece, 3, False), key=lambda c: c[1])
    assert [n for *_, n in got] == [piece] * 8 + [MiB + 12345]


@pytest.mark.parametrize("workers", [3, 7, 16])
def test_first_pieces_are_graded_by_join_order(workers):
    """For a large read the k-th worker to start takes (k + 1) / workers of a
    piece first (rounded up to 64 KiB); every later piece is whole, or what is
    left of its chunk."""
    piece, chunk, size = 4 * MiB, 16 * MiB, 300 * MiB + 7  # a chunk or more for every worker
    got = claims(size, chunk, piece, workers, True, seed=workers)
    first, joined = {}, []
    for i, (w, _, _, n) in enumerate(got):
        if w not in first:
            first[w] = (i, n)
            joined.append(w)
    assert len(joined) == workers
    for k, w in enumerate(joined):
        want = min(piece, -(-(piece * (k + 1) // workers) // STEP) * STEP)
        assert first[w][1] == want
    firsts = {i for i, _ in first.values()}
    for i, (_, buf, _, n) in enumerate(got):
        if i not in firsts:
            left = min(size, (buf // chunk + 1) * chunk) - buf
            assert n == min(piece, left)


def test_small_reads_are_not_graded():
    """Below 2 x workers x piece every claim is a whole piece: medium reads keep
    their even split over the workers."""
    workers, piece = 16, 256 * KiB
    size = 2 * workers * piece - 1
    got = sorted(claims(size, piece, piece, workers, True), key=lambda c: c[1])
    assert [n for *_, n in got][:-1] == [piece] * (len(got) - 1)


def test_one_worker_reads_everything():
    got = claims(130 * MiB + 7, 16 * MiB, 4 * MiB, 1, True)
    assert {w for w, *_ in got} == {0}
    check_cover(got, 130 * MiB + 7, 4095)
    assert [c[1] for c in got] == sorted(c[1] for c in got)


# -- how a request is cut into chunks for the pool ---------------------------------
def dispatch(size, task=16 * MiB, min_task=256 * KiB, bounce=4 * MiB, threads=16, offset=4095):
    import gdscp

    with gdscp.defaults.set("num_threads", threads):
        return _core.testing.dispatch_chunks(offset, size, task, min_task, bounce)


@pytest.mark.parametrize("size", [1, 2 * MiB, 64 * MiB + 5, 256 * MiB, GiB + 4097, 4 * GiB])
@pytest.mark.parametrize("threads", [1, 4, 16])
def test_chunks_cover_the_request_once_and_taper_at_the_end(size, threads):
    tasks, chunk, chunks = dispatch(size, threads=threads)
    pos = 0
    for buf, fo, n in chunks:
        assert buf == pos and fo == 4095 + buf and 0 < n <= chunk
        pos += n
    assert pos == size
    sizes = [n for *_, n in chunks]
    assert sizes[:-1] == sorted(sizes[:-1], reverse=True)  # never grow
    if tasks > 1:
        tail = min(chunk, 4 * MiB)
        assert all(n >= tail for n in sizes[:-1])
        # Whatever remains when a chunk is claimed, that chunk is at most
        # 1/(2 * tasks) of it (rounded to pages) or a tail-sized one: the
        # workers run out of work together.
        left = size
        for n in sizes:
            assert n <= max(tail, -(-(left // (2 * tasks)) // 4096) * 4096)
            left -= n


def test_large_requests_keep_whole_task_sized_chunks_until_the_end():
    tasks, chunk, chunks = dispatch(4 * GiB)
    assert tasks == 16 and chunk == 16 * MiB
    sizes = [n for *_, n in chunks]
    whole = [n for n in sizes if n == chunk]
    assert sum(whole) >= 4 * GiB - 2 * 16 * 16 * MiB  # all but the last 2 * tasks chunks' worth
    assert sizes[-2] == 4 * MiB and len(sizes) < 4 * GiB // chunk + 100


def test_small_requests_are_one_chunk_on_the_calling_thread():
    assert dispatch(4096) == (1, 4096, [(0, 4095, 4096)])
