"""The ``gdscp`` command line on the host path (and, marked ``gpu``, through GPU memory).

Commands run in-process through ``gdscp.cli.app.run`` (fast, and engine fault
injection reaches them); a few run as real processes to check the console
script, ``python -m gdscp``, shell completion and resource limits.
"""

from __future__ import annotations

import errno
import importlib
import io
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import gdscp
import standin
from gdscp import _core, memory
from gdscp.bench.tree import make_tree as make_file_tree
from gdscp.bulk import BulkJob
from gdscp.cli import output, units
from gdscp.cli.app import run
from gdscp.cli.progress import TransferProgress
from test_cufile_standin import file_bytes, folder, go, new_file, settings, standin_build, without_cupy

__all__ = ["folder", "go", "standin_build"]  # fixtures, imported for the tests over the stand-ins

KiB = 1024
MiB = 1 << 20


def cli(capsys, *args: object) -> tuple[int, str, str]:
    """Run ``gdscp ARGS`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = run([os.fspath(a) if isinstance(a, Path) else str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_json(capsys, *args: object) -> tuple[int, dict, str]:
    code, out, err = cli(capsys, *args, "--json")
    return code, json.loads(out), err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if ": error: " in line]


def random_file(path: Path, size: int, seed: int = 1) -> bytes:
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return data


def temp_files(directory: Path) -> list[str]:
    return [p.name for p in directory.rglob("*") if p.name.endswith(".gdscp-tmp")]


def tree(root: Path) -> dict[str, object]:
    """Relative path -> file bytes, ("dir",) or ("link", target), for comparing trees."""
    found: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                found[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                found[rel] = ("dir",)
            else:
                found[rel] = p.read_bytes()
    return found


def splitmix64(seed: int, index: int) -> int:
    """Reference splitmix64 output ``index`` for ``seed``, written independently of gdscp.memory."""
    mask = (1 << 64) - 1
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


# -- units -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4096", 4096),
        ("4K", 4096),
        ("4k", 4096),
        ("64KiB", 65536),
        ("2Ki", 2048),
        ("1M", MiB),
        ("10G", 10 << 30),
        ("1.5GiB", 3 << 29),
        ("0.5K", 512),
        ("1KB", 1000),
        ("3MB", 3_000_000),
        ("7B", 7),
        (" 2 T ", 2 << 40),
        ("0", 0),
    ],
)
def test_parse_size(text, expected):
    assert units.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "x", "-1", "1.5", "0.1K", "1Q", "1iB", "1e3", "K", "1 0"])
def test_parse_size_rejects_and_names_the_value(text):
    with pytest.raises(ValueError) as info:
        units.parse_size(text)
    assert repr(text) in str(info.value)


def test_formatting():
    assert units.format_bytes(512) == "512 B"
    assert units.format_bytes(1536) == "1.50 KiB"
    assert units.format_bytes(3 << 30) == "3.00 GiB"
    assert units.format_rate(3_000_000_000, 1.0) == "3.00 GB/s"
    assert units.format_rate(2_500_000, 1.0) == "2.50 MB/s"
    assert units.format_rate(10, 0.0) == "-"
    assert units.gb_per_s(2_000_000_000, 2.0) == 1.0
    assert units.format_seconds(0.25) == "0.250 s"
    assert units.format_seconds(300) == "5m 00s"


# -- memory ----------------------------------------------------------------------------


def test_host_buffers_are_page_aligned():
    for n in (0, 1, 4096, 12345):
        buf = memory.allocate(n)
        assert buf.size == n and buf.dtype == np.uint8
        assert n == 0 or buf.ctypes.data % memory.PAGE_SIZE == 0


def test_seq_pattern_holds_offsets():
    data = memory.pattern(64, "seq")
    assert list(data.view("<u8")) == [0, 8, 16, 24, 32, 40, 48, 56]


def test_random_pattern_is_splitmix64_of_seed_and_position():
    data = memory.pattern(40, "random", seed=99)
    assert list(data.view("<u8")) == [splitmix64(99, i) for i in range(5)]
    assert memory.pattern(40, "random", seed=100).tobytes() != data.tobytes()


@pytest.mark.parametrize("kind", ["random", "seq", "zeros"])
@pytest.mark.parametrize("offset", [0, 3, 8, 4099])
def test_pattern_depends_only_on_position(kind, offset):
    whole = memory.pattern(10_000, kind, seed=5)
    part = memory.pattern(3001, kind, seed=5, offset=offset)
    assert part.tobytes() == whole[offset : offset + 3001].tobytes()


def test_patterns_and_copies_follow_memory_order():
    """The helpers see an array's bytes in memory order, as the engine reads
    and writes them (a Fortran-order array too); an array whose bytes are
    not one block is refused rather than filled through a temporary copy."""
    data = bytes(range(64))
    f = np.zeros((8, 8), np.uint8, order="F")
    memory.fill(f, "random", seed=3)
    assert f.ravel(order="K").tobytes() == memory.pattern(64, "random", 3).tobytes()
    memory.copy_from_host(f, data)
    assert f.ravel(order="K").tobytes() == data and memory.equal(f, data)
    assert memory.to_host(f).tobytes() == data
    strided = np.zeros((4, 8), np.uint8)[:, :4]
    with pytest.raises(ValueError, match="not contiguous"):
        memory.fill(strided, "random")
    with pytest.raises(ValueError, match="not contiguous"):
        memory.copy_from_host(strided, data[:16])
    with pytest.raises(TypeError):
        memory.allocate(1.7)


def test_memory_helpers_name_the_argument_that_is_wrong():
    """A seed or offset that is no integer, a buffer too small for the copy:
    the error names the argument (and both sizes), and nothing is written."""
    buf = np.full(64, 7, np.uint8)
    for kwargs, name in (({"offset": 1.0}, "offset"), ({"seed": 1.5}, "seed"), ({"seed": "1"}, "seed")):
        for kind in ("seq", "random", "zeros"):
            with pytest.raises(TypeError, match=f"{name} must be an integer, not"):
                memory.fill(buf, kind, **kwargs)
    assert (buf == 7).all()
    memory.fill(buf, "random", seed=np.uint64(2**64 - 1), offset=np.int64(8))
    assert buf.tobytes() == memory.pattern(64, "random", 2**64 - 1, 8).tobytes()
    small, out = np.zeros(8, np.uint8), np.full(16, 7, np.uint8)
    with pytest.raises(ValueError, match="src holds 8 bytes, fewer than the 16 bytes of out"):
        memory.download(small, out)
    with pytest.raises(ValueError, match="dst holds 8 bytes, fewer than the 16 bytes of src"):
        memory.copy_from_host(small, bytes(range(16)))
    assert (out == 7).all() and not small.any()
    memory.download(np.arange(32, dtype=np.uint8), out)
    memory.copy_from_host(out, bytes(range(100, 108)))
    assert out.tobytes() == bytes(range(100, 108)) + bytes(range(8, 16))


def fake_meminfo(tmp_path, monkeypatch, free: int, available: int | None) -> None:
    """Point gdscp's reading of host memory at a file saying ``free`` and ``available`` bytes."""
    lines = ["MemTotal:       67108864 kB", f"MemFree:        {free // 1024} kB"]
    if available is not None:
        lines.append(f"MemAvailable:   {available // 1024} kB")
    lines += ["Buffers:            1024 kB", "HugePages_Total:       0"]
    (tmp_path / "meminfo").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(memory, "MEMINFO", str(tmp_path / "meminfo"))


def test_host_memory_available_counts_what_the_kernel_can_reclaim(capsys, tmp_path, monkeypatch):
    """Available host memory is MemAvailable (free pages and the page cache
    the kernel can take back), not the free pages alone: a buffer that fits
    only with the cache counted is accepted, one past MemAvailable refused,
    and the default chunk of a host write is sized from MemAvailable too."""
    from gdscp.bench import files
    from gdscp.cli import options

    fake_meminfo(tmp_path, monkeypatch, free=4 * MiB, available=256 * MiB)
    assert memory.available_bytes(None) == 256 * MiB
    assert memory.host_memory() == (256 * MiB, 64 << 30)
    assert files.available_memory() == 256 * MiB and files.total_memory() == 64 << 30
    assert options.chunk_size(None, 1 << 30, None, 1) == 32 * MiB  # an eighth of 256MiB
    names = [tmp_path / "wa.bin", tmp_path / "wb.bin"]
    code, _, err = cli(capsys, "write", "--host", "-s", "8M", "--pattern", "seq", *names)
    assert code == 0, err
    for p in names:
        assert p.read_bytes() == memory.pattern(8 * MiB, "seq").tobytes()

    fake_meminfo(tmp_path, monkeypatch, free=64 * MiB, available=4 * MiB)
    assert memory.available_bytes(None) == 4 * MiB
    names = [tmp_path / "xa.bin", tmp_path / "xb.bin"]
    code, _, err = cli(capsys, "write", "--host", "-s", "8M", *names)
    assert code == 2
    (line,) = error_lines(err)
    assert "8.00 MiB does not fit in host memory" in line
    assert not any(p.exists() for p in names)


def test_host_memory_without_memavailable_counts_free_pages(tmp_path, monkeypatch):
    """A kernel that reports no MemAvailable (or no /proc/meminfo at all):
    the free pages sysconf counts."""
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PHYS_PAGES": 5000}
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: pages.get(name) or real(name))
    fake_meminfo(tmp_path, monkeypatch, free=64 * MiB, available=None)
    assert memory.host_memory() == (1000 * memory.PAGE_SIZE, 64 << 30)
    monkeypatch.setattr(memory, "MEMINFO", str(tmp_path / "missing"))
    assert memory.host_memory() == (1000 * memory.PAGE_SIZE, 5000 * memory.PAGE_SIZE)


def test_info_shows_names_as_they_are_and_accounts_for_every_path(capsys, tmp_path, monkeypatch):
    """A path whose name looks like Rich markup is shown as it is; with --json
    a path that cannot be checked is in the document with its error; a
    cufile.json whose "properties" is not an object is an error in its
    entry, not the end of the report."""
    odd = tmp_path / "a[" / "]b"  # "...a[/]b": a closing tag to Rich
    odd.parent.mkdir()
    odd.write_bytes(b"x")
    code, out, err = cli(capsys, "info", str(odd))
    assert code == 0, err
    assert f"path {odd}" in out
    code, doc, err = cli_json(capsys, "info", str(odd), str(tmp_path / "missing"))
    assert code == 1 and doc["ok"] is False
    assert [p["path"] for p in doc["paths"]] == [str(odd), str(tmp_path / "missing")]
    assert doc["paths"][1]["error"] == "No such file or directory"
    bad = tmp_path / "cufile.json"
    bad.write_text('{"properties": [1, 2]}')
    monkeypatch.setenv("CUFILE_ENV_PATH_JSON", str(bad))
    code, doc, err = cli_json(capsys, "info")
    assert code == 0, err
    assert "not an object" in doc["cufile_json"]["error"]


def test_info_shows_a_path_name_escaped_as_error_lines_do(capsys, tmp_path):
    """A line break or a byte that is not UTF-8 in a PATH is written as an
    escape in its table's title, as error lines write names (not a broken
    line, and not U+FFFD); the JSON document keeps the name exact."""
    for name, escaped in ((b"a\nb", "a\\nb"), (b"a\nb\xff", "a\\nb\\xff")):
        odd = tmp_path / os.fsdecode(name)
        odd.mkdir()
        code, out, err = cli(capsys, "info", odd)
        assert code == 0, err
        assert f"path {tmp_path}/{escaped}" in [line.rstrip() for line in out.splitlines()], out
        assert "\ufffd" not in out
        code, doc, err = cli_json(capsys, "info", odd)
        assert code == 0 and doc["paths"][0]["path"] == os.fspath(odd)


def test_info_says_why_when_its_reader_has_gone(tmp_path):
    """A table for a reader that has gone (a closed pipe) is a failure said on
    stderr, exit status 1, as the JSON document's is."""
    for extra in ([], ["--json"]):
        proc = subprocess.Popen([sys.executable, "-m", "gdscp", "info", *extra], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 1, err
        assert "cannot write the result to standard output: Broken pipe" in err, err


def test_copy_into_a_tree_does_not_follow_a_link_inside_it(capsys, tmp_path):
    """A symbolic link to a directory inside DST, where the tree has a
    directory: as cp, not followed (the copy would land wherever it points),
    and that directory's contents are not copied; DST named as a link is."""
    (tmp_path / "s" / "sub").mkdir(parents=True)
    (tmp_path / "s" / "sub" / "victim").write_bytes(b"new")
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (outside / "victim").write_bytes(b"precious")
    (tmp_path / "d" / "s").mkdir(parents=True)
    (tmp_path / "d" / "s" / "sub").symlink_to(outside)
    code, _, err = cli(capsys, "copy", "-rp", str(tmp_path / "s"), str(tmp_path / "d"))
    assert code == 1 and "cannot overwrite non-directory" in err, err
    assert (outside / "victim").read_bytes() == b"precious" and stat.S_IMODE(outside.stat().st_mode) == 0o700
    (tmp_path / "named").symlink_to(outside)
    code, _, err = cli(capsys, "copy", "-r", str(tmp_path / "s") + "/.", str(tmp_path / "named"))
    assert code == 0, err
    assert (outside / "sub" / "victim").read_bytes() == b"new"


@pytest.mark.parametrize("swapped", ["link", "fifo", "file"])
def test_copy_r_does_not_read_what_replaced_a_file_after_it_was_planned(capsys, tmp_path, monkeypatch, swapped):
    """A file of the tree swapped, once the tree is walked, for a symbolic
    link to a file outside it, a FIFO or another file: as cp, that file
    fails, named as replaced (the link's target is not copied, the FIFO not
    waited on), and the command exits 1; the other files are copied, and no
    temporary file is left."""
    from gdscp.cli import copy as copy_command

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"outside the tree")
    data = {name: random_file(src / name, size, seed) for seed, (name, size) in
            enumerate([("a", 5000), ("b", 2 * MiB), ("c", 3 * MiB + 1)])}
    real_run = copy_command._Copier.run

    def swap_then_run(self, jobs, progress):
        os.rename(src / "b", tmp_path / "b.moved")
        if swapped == "link":
            (src / "b").symlink_to(secret)
        elif swapped == "fifo":
            os.mkfifo(src / "b")
        else:
            (src / "b").write_bytes(secret.read_bytes())
        return real_run(self, jobs, progress)

    monkeypatch.setattr(copy_command._Copier, "run", swap_then_run)
    result: list = []
    runner = threading.Thread(target=lambda: result.append(cli(capsys, "copy", "-r", src, dst)), daemon=True)
    runner.start()
    runner.join(20)
    if runner.is_alive():  # a writer come and gone lets the read end, and the command with it
        os.close(os.open(src / "b", os.O_WRONLY | os.O_NONBLOCK))
        runner.join(60)
        pytest.fail("the copy waited on the FIFO")
    code, _, err = result[0]
    assert code == 1, err
    assert error_lines(err) and all(f"'{src / 'b'}' was replaced while being copied" in line
                                    for line in error_lines(err)), err
    assert not (dst / "b").exists() and temp_files(dst) == []
    assert (dst / "a").read_bytes() == data["a"] and (dst / "c").read_bytes() == data["c"]


@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("swapped", ["link", "fifo", "file"])
def test_copy_rn_skips_a_replaced_file_whose_destination_exists(capsys, tmp_path, monkeypatch, swapped, missing):
    """With -n, a file of the tree replaced after the walk whose destination
    exists is skipped as any file whose destination exists is (nothing would
    have been written): the same record, the same note, exit 0. One whose
    destination does not exist still fails as replaced (exit 1)."""
    from gdscp.cli import copy as copy_command

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (dst / "src").mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_bytes(b"outside the tree")
    data = {name: random_file(src / name, 5000, seed) for seed, name in enumerate("abcd")}
    (dst / "src" / "a").write_bytes(b"old a")  # kept, its source as the walk found it
    (dst / "src" / "b").write_bytes(b"old b")  # kept, its source replaced
    swapped_names = ["b", "c"] if missing else ["b"]  # c: replaced, with no destination
    real_run = copy_command._Copier.run

    def swap_then_run(self, jobs, progress):
        for name in swapped_names:
            os.rename(src / name, tmp_path / f"{name}.moved")
            if swapped == "link":
                (src / name).symlink_to(secret)
            elif swapped == "fifo":
                os.mkfifo(src / name)
            else:
                (src / name).write_bytes(secret.read_bytes())
        return real_run(self, jobs, progress)

    monkeypatch.setattr(copy_command._Copier, "run", swap_then_run)
    result: list = []
    runner = threading.Thread(target=lambda: result.append(cli(capsys, "copy", "-rn", src, dst, "--json")),
                              daemon=True)
    runner.start()
    runner.join(20)
    if runner.is_alive():  # a writer come and gone lets the read end, and the command with it
        for name in swapped_names:
            os.close(os.open(src / name, os.O_WRONLY | os.O_NONBLOCK))
        runner.join(60)
        pytest.fail("the copy waited on the FIFO")
    code, out, err = result[0]
    doc = json.loads(out)
    records = {os.path.basename(r["source"]): r for r in doc["files"]}
    kept = {name: {k: v for k, v in records[name].items() if k not in ("source", "destination", "seconds")}
            for name in "ab"}
    assert kept["a"]["status"] == "skipped" and kept["b"] == kept["a"], records
    notes = sorted(line for line in err.splitlines() if "not replacing" in line)
    assert notes == [f"gdscp copy: not replacing '{dst / 'src' / name}' (it exists; --no-clobber)"
                     for name in "ab"], err
    assert (dst / "src" / "a").read_bytes() == b"old a" and (dst / "src" / "b").read_bytes() == b"old b"
    assert (dst / "src" / "d").read_bytes() == data["d"] and temp_files(dst) == []
    if missing:
        assert code == 1 and doc["failed"] == 1 and doc["skipped"] == 2, err
        assert records["c"]["status"] == "failed" and not (dst / "src" / "c").exists()
        assert error_lines(err) and all(f"'{src / 'c'}' was replaced while being copied" in line
                                        for line in error_lines(err)), err
    else:
        assert code == 0 and doc["ok"] is True and (doc["copied"], doc["skipped"], doc["failed"]) == (2, 2, 0), err
        assert error_lines(err) == [] and (dst / "src" / "c").read_bytes() == data["c"]


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/comm"), reason="no /proc/thread-self")
def test_copy_r_copies_a_file_of_proc_whose_name_is_another_file_on_each_thread(capsys, tmp_path):
    """/proc/thread-self names another file on each thread: the walk's file
    and the worker's are not the same inode, and nothing was replaced. With
    -r it is copied as without: a thread's name, a line."""
    code, doc, err = cli_json(capsys, "copy", "-r", "/proc/thread-self/comm", str(tmp_path / "comm"))
    assert code == 0 and doc["copied"] == 1, err
    copied = (tmp_path / "comm").read_bytes()
    assert copied.endswith(b"\n") and 1 < len(copied) <= 16


@pytest.mark.parametrize("target", ["/", ".."])
def test_a_directory_that_cannot_be_made_takes_only_its_own_contents(capsys, tmp_path, target):
    """A link in DST where the tree has a directory, pointing at / or at an
    ancestor: that directory fails alone; the rest of the tree, which lies
    under where the link points, is still copied."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    (src / "a" / "x").write_bytes(b"x")
    for i in range(3):
        (src / "b" / f"f{i}").write_bytes(b"%d" % i)
    (src / "z").write_bytes(b"z")
    (dst / "src").mkdir(parents=True)
    (dst / "src" / "a").symlink_to(target)
    code, doc, err = cli_json(capsys, "copy", "-r", str(src), str(dst))
    assert code == 1 and doc["copied"] == 4 and doc["failed"] == 1, err
    assert [f["status"] for f in doc["files"] if f["source"] == str(src / "a")] == ["failed"]
    assert {p.name: p.read_bytes() for p in (dst / "src" / "b").iterdir()} == {"f0": b"0", "f1": b"1", "f2": b"2"}
    assert (dst / "src" / "z").read_bytes() == b"z"
    assert os.readlink(dst / "src" / "a") == target


def test_a_directory_another_copy_makes_first_is_merged_into(capsys, tmp_path, monkeypatch):
    """Two copies into one tree at once: a directory that the other one makes
    between this one's look and its mkdir is merged into, as one that was
    there before, not a failure."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "f").write_bytes(b"f")
    (src / "g").write_bytes(b"g")
    real = os.mkdir

    def raced(path, mode=0o777, *args, **kwargs):
        if str(path).startswith(str(dst)) and not os.path.lexists(path):
            real(path, 0o755)  # the other copy, first
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", raced)
    code, _, err = cli(capsys, "copy", "-r", src, dst)
    assert code == 0, err
    assert (dst / "a" / "b" / "f").read_bytes() == b"f" and (dst / "g").read_bytes() == b"g"


def test_copy_makes_the_names_of_new_directories_and_links_durable(capsys, tmp_path, monkeypatch):
    """A tree of directories and links alone (no file: no job to sync) still
    has the directory holding each new name fsynced."""
    from gdscp.cli import copy as copy_command

    (tmp_path / "s" / "a" / "b").mkdir(parents=True)
    (tmp_path / "s" / "a" / "link").symlink_to("b")
    synced = []
    monkeypatch.setattr(copy_command, "fsync_dir", synced.append)
    code, _, err = cli(capsys, "copy", "-r", str(tmp_path / "s"), str(tmp_path / "d"))
    assert code == 0, err
    assert sorted(synced) == sorted({str(tmp_path), str(tmp_path / "d"), str(tmp_path / "d" / "a")})


def test_copy_fail_fast_stops_at_a_directory_it_cannot_make(capsys, tmp_path):
    (tmp_path / "s" / "a").mkdir(parents=True)
    (tmp_path / "s" / "z").mkdir()
    (tmp_path / "s" / "a" / "f").write_bytes(b"1")
    (tmp_path / "s" / "z" / "g").write_bytes(b"2")
    (tmp_path / "d" / "s").mkdir(parents=True)
    (tmp_path / "d" / "s" / "a").write_bytes(b"in the way")
    code, doc, err = cli_json(capsys, "copy", "-r", "--fail-fast", str(tmp_path / "s"), str(tmp_path / "d"))
    assert code == 1 and doc["copied"] == 0, err
    assert not (tmp_path / "d" / "s" / "z" / "g").exists()
    assert sorted(f["status"] for f in doc["files"]) == ["cancelled", "cancelled", "failed"]


def _mode_tree(root: Path, modes: dict[str, int]) -> None:
    """Directories of ``root`` at ``modes``, each with a file in it."""
    for name in modes:
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "f").write_bytes(name.encode() + b" bytes")
    for name in sorted(modes, key=len, reverse=True):
        os.chmod(root / name, modes[name])


def _modes(root: Path, names) -> dict[str, int]:
    return {name: stat.S_IMODE((root / name).stat().st_mode) for name in names}


def test_copy_killed_leaves_its_directories_usable(capsys, tmp_path):
    """copy -r killed (SIGKILL) once its directories are made, before any file
    is in: as cp makes them, they already have the source's read and search
    bits (less the umask), with no write permission for the group or others
    (a 0775 source gives 0755) and nothing for them with --preserve, not 0700
    for everyone. A later run fills them in and, as cp, leaves the modes of
    the directories it merges into alone; with --preserve it gives them
    theirs."""
    src = tmp_path / "s"
    modes = {".": 0o755, "open": 0o775, "group": 0o750, "ro": 0o555, "ro/private": 0o700, "x": 0o711}
    _mode_tree(src, modes)
    script = (
        "import os, signal, sys\n"
        "import gdscp.cli.copy as copy\n"
        "from gdscp.cli.app import run\n"
        "os.umask(0o022)\n"
        "copy.copy_files = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "run(sys.argv[1:])\n"
    )
    try:
        for extra, killed in (([], {".": 0o755, "open": 0o755, "group": 0o750, "ro": 0o755, "ro/private": 0o700,
                                    "x": 0o711}),
                              (["--preserve"], dict.fromkeys(modes, 0o700))):
            into = tmp_path / ("dp" if extra else "d")
            into.mkdir()
            dst = into / "s"  # copied into a directory, as the run after copies it
            proc = subprocess.run([sys.executable, "-c", script, "copy", "-r", *extra, str(src), str(into)],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == -signal.SIGKILL, proc.stderr
            assert _modes(dst, modes) == killed
            assert not any(files for _, _, files in os.walk(dst))  # killed before any file was in
            old = os.umask(0o022)
            try:
                code, _, err = cli(capsys, "copy", "-r", *extra, src, into)
            finally:
                os.umask(old)
            assert code == 0, err
            assert {name: (dst / name / "f").read_bytes() for name in modes} == {
                name: name.encode() + b" bytes" for name in modes}
            assert _modes(dst, modes) == (modes if extra else killed)
    finally:
        for root in (src, tmp_path / "d", tmp_path / "dp"):
            for folder, _, _ in os.walk(root):
                os.chmod(folder, 0o755)


@pytest.mark.parametrize("preserve", [False, True])
def test_copy_gives_directories_their_final_modes(capsys, tmp_path, preserve):
    """A finished copy -r gives each directory it made its source's mode, less
    the umask (with --preserve, all of it), whatever it was made with."""
    src = tmp_path / "s"
    modes = {".": 0o755, "a": 0o750, "a/ro": 0o555, "b": 0o775, "b/private": 0o700}
    _mode_tree(src, modes)
    old = os.umask(0o027)
    try:
        code, _, err = cli(capsys, "copy", "-r", *(["--preserve"] if preserve else []), src, tmp_path / "d")
    finally:
        os.umask(old)
        for folder, _, _ in os.walk(src):
            os.chmod(folder, 0o755)
    assert code == 0, err
    assert _modes(tmp_path / "d", modes) == (modes if preserve else {name: mode & ~0o027 for name, mode in modes.items()})
    assert (tmp_path / "d" / "a" / "ro" / "f").read_bytes() == b"a/ro bytes"
    for folder, _, _ in os.walk(tmp_path / "d"):
        os.chmod(folder, 0o755)


def test_copy_gives_an_unreadable_directory_its_mode(capsys, tmp_path, monkeypatch):
    """A source directory that cannot be listed is made, reported, and still
    given its mode (not left at the 0700 it is made with)."""
    src = tmp_path / "s"
    src.mkdir()
    os.chmod(src, 0o750)
    real = os.scandir

    def refused(path="."):
        if not isinstance(path, int) and os.fspath(path) == str(src):
            raise PermissionError(13, "Permission denied", str(src))
        return real(path)

    monkeypatch.setattr(os, "scandir", refused)
    code, _, err = cli(capsys, "copy", "-r", str(src), str(tmp_path / "d"))
    assert code == 1 and "cannot read directory" in err, err
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o750 & ~mask


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file another user's ownership: root only")
def test_copy_preserve_keeps_the_owner_or_drops_set_id_bits(capsys, tmp_path, monkeypatch):
    """-p keeps the source's owner and group, as cp -p; where they cannot be
    given, the set-user-ID and set-group-ID bits go (kept, a user's program
    would run as root)."""
    src = tmp_path / "suid"
    src.write_bytes(b"#!/bin/sh\n")
    os.chown(src, 1000, 1000)
    os.chmod(src, 0o6755)
    code, _, err = cli(capsys, "copy", "-p", str(src), str(tmp_path / "kept"))
    assert code == 0, err
    kept = (tmp_path / "kept").stat()
    assert (kept.st_uid, kept.st_gid, stat.S_IMODE(kept.st_mode)) == (1000, 1000, 0o6755)
    from gdscp.cli import atomic

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")


    (tmp_path / "tree").mkdir()
    os.chown(tmp_path / "tree", 1000, 1000)
    os.chmod(tmp_path / "tree", 0o2755)
    with monkeypatch.context() as patch:
        patch.setattr(atomic.os, "chown", refused)  # as for a user other than root (directories, links)
        code, _, err = cli(capsys, "copy", "-rp", str(tmp_path / "tree"), str(tmp_path / "tree2"))
    assert code == 0, err
    assert stat.S_IMODE((tmp_path / "tree2").stat().st_mode) == 0o755


def test_a_filesystem_glibc_does_not_know_may_hold_files_past_2_gib(tmp_path, monkeypatch):
    """32 file-size bits is also glibc's answer for a filesystem it does not
    know (tmpfs, parallel filesystems): no reason to refuse a large write."""
    from gdscp.cli import special

    monkeypatch.setattr(special.os, "pathconf", lambda path, name: 32)
    special.check_room(str(tmp_path / "big"), 2**31 + 4096, None)  # no Failure
    monkeypatch.setattr(special.os, "pathconf", lambda path, name: 40)
    with pytest.raises(output.Failure, match="larger than the largest file"):
        special.check_room(str(tmp_path / "big"), 2**40, None)


def test_a_filesystem_that_reports_no_size_is_written_all_the_same(capsys, tmp_path, monkeypatch):
    """A filesystem that reports no blocks at all (a FUSE filesystem without
    statfs, whose answer is all zeros; procfs, sysfs) has unknown free space,
    not none: the write goes ahead (a full disk is said by the write itself).
    One that reports its size and has too little free is still refused."""
    from gdscp.cli import special

    def statvfs(blocks, free):
        return lambda path: os.statvfs_result((4096, 4096, blocks, free, free, 0, 0, 0, 0, 255))

    monkeypatch.setattr(special.os, "statvfs", statvfs(0, 0))
    code, doc, err = cli_json(capsys, "write", "--host", tmp_path / "f", "--size", "1M", "--pattern", "seq")
    assert code == 0, err
    assert (tmp_path / "f").read_bytes() == memory.pattern(MiB, "seq").tobytes()
    monkeypatch.setattr(special.os, "statvfs", statvfs(1000, 10))
    code, doc, err = cli_json(capsys, "write", "--host", tmp_path / "g", "--size", "1M")
    monkeypatch.undo()
    assert code == 1 and doc["error"].startswith("not enough space for "), doc
    assert not (tmp_path / "g").exists()


def test_a_json_failure_whose_stdout_is_gone_says_both_once(tmp_path):
    """--json, a failure, and no stdout to write its document to: both are
    said on stderr, no traceback, exit status 1."""
    proc = subprocess.run([sys.executable, "-m", "gdscp", "read", "--host", str(tmp_path / "missing"), "--json"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 1, proc.stderr
    assert "No such file or directory" in proc.stderr and "standard output" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_a_closed_stderr_loses_lines_not_results(tmp_path):
    """With stderr closed (``2>&-``) a command's warnings and errors are lost,
    as cp's are, and nothing else: a failure still gives its JSON document
    and exit status 1, a usage error 2, a write its file; the descriptor is
    held on /dev/null, so no file of the command's takes its number."""

    def gdscp(*args: object) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gdscp", *map(str, args)], capture_output=True, text=True,
                              timeout=60, preexec_fn=lambda: os.close(2))

    proc = gdscp("copy", "--host", tmp_path / "missing", tmp_path / "out", "--json")
    assert proc.returncode == 1, proc.stdout
    doc = json.loads(proc.stdout)
    assert not doc["ok"] and "No such file or directory" in doc["files"][0]["error"]
    proc = gdscp("copy", "--no-such-option", tmp_path / "missing", tmp_path / "out")
    assert proc.returncode == 2 and proc.stdout == ""
    data = random_file(tmp_path / "src", 5000)
    proc = gdscp("copy", tmp_path / "src", tmp_path / "copied", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"]
    assert (tmp_path / "copied").read_bytes() == data
    proc = subprocess.run([sys.executable, "-c", "from gdscp.cli.main import _hold_standard_descriptors as hold; "
                           "hold(); import os, sys; print(os.readlink('/proc/self/fd/2'), sys.stderr.fileno())"],
                          capture_output=True, text=True, timeout=60, preexec_fn=lambda: os.close(2))
    assert proc.stdout.split() == [os.devnull, "2"], proc


def test_a_line_rich_fails_to_print_still_reaches_stderr(capfd, tmp_path, monkeypatch):
    """Rich's print failing on its own (an import refused a descriptor:
    EMFILE) does not lose stderr: that line goes out plain, and the later
    ones too. A stderr that is gone (EPIPE) loses its lines from there on,
    the command going on to its result."""
    failures = [OSError(errno.EMFILE, os.strerror(errno.EMFILE))]
    real = Console.print

    def print_failing(self, *args, **kwargs):
        if failures and self.stderr:
            raise failures.pop(0)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Console, "print", print_failing)
    random_file(tmp_path / "src", 100)
    missing = [tmp_path / "missing1", tmp_path / "missing2"]
    (tmp_path / "dst").mkdir()
    capfd.readouterr()
    code = run(["copy", "--host", str(missing[0]), str(missing[1]), str(tmp_path / "src"), str(tmp_path / "dst")])
    out, err = capfd.readouterr()
    assert code == 1 and not failures
    assert err.splitlines() == [f"gdscp copy: error: cannot stat '{m}': No such file or directory" for m in missing]
    assert "failed" in out and (tmp_path / "dst" / "src").read_bytes() == (tmp_path / "src").read_bytes()

    saved = os.dup(2)
    try:
        failures.append(BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)))
        code = run(["copy", "--host", str(missing[0]), str(missing[1]), str(tmp_path / "dst")])
        out, err = capfd.readouterr()
        assert code == 1 and not failures and err == "" and "failed" in out
    finally:
        os.dup2(saved, 2)  # the lost stderr was put on /dev/null
        os.close(saved)


def test_stderr_stays_live_when_rich_cannot_open_what_it_imports():
    """In a real process with every descriptor it may have in use, Rich
    cannot import its console: the lines still reach stderr, by write(2)."""
    script = (
        "import os, resource, sys\n"
        "from gdscp.cli.output import Output\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "held = []\n"
        "try:\n"
        "    while True:\n"
        "        held.append(os.open(os.devnull, os.O_RDONLY))\n"
        "except OSError:\n"
        "    pass\n"
        "out = Output('copy')\n"
        "out.error('first')\n"
        "out.warn('second')\n"
        "print('rich' in ' '.join(sys.modules), flush=True)\n"
        "for fd in held:\n"
        "    os.close(fd)\n"
        "out.error('third')\n"
    )
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "False\n"  # Rich's console could not be imported before the descriptors were freed
        assert proc.stderr == "gdscp copy: error: first\ngdscp copy: warning: second\ngdscp copy: error: third\n"


def test_data_written_to_stdout_is_all_that_stdout_gets(tmp_path):
    """copy or write to /dev/stdout (a pipe here): stdout carries the data
    and nothing else, the table going to stderr, as dd's figures do; --json,
    whose document would land among the data, is a usage error before
    anything is written, said on stderr alone: no document, the failure's
    neither. A character device (/dev/null) keeps nothing to mix up: its
    table stays on stdout."""

    def gdscp(*args: object) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gdscp", *map(str, args)], capture_output=True, timeout=60)

    data = random_file(tmp_path / "src", 3 * MiB + 5)
    proc = gdscp("copy", "--host", tmp_path / "src", "/dev/stdout")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == data and b"copied" in proc.stderr
    proc = gdscp("write", "--host", "/dev/stdout", "--size", "64K", "--pattern", "seq")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == memory.pattern(64 * KiB, "seq", 0).tobytes() and b"/dev/stdout" in proc.stderr
    for args in (("copy", "--host", tmp_path / "src", "/dev/stdout"), ("write", "--host", "/dev/stdout", "-s", "1K")):
        proc = gdscp(*args, "--json")
        assert proc.returncode == 2
        assert proc.stdout == b"" and proc.stderr == (
            f"gdscp {args[0]}: error: --json: '/dev/stdout' is standard output, where the document would land "
            "among the data written to it\n").encode()
    for extra in ((), ("--json",)):  # stdout on /dev/null, a copy to /dev/null: the table is not moved to stderr
        proc = subprocess.run([sys.executable, "-m", "gdscp", "copy", "--host", str(tmp_path / "src"), "/dev/null",
                               *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
        assert proc.returncode == 0 and b"copied" not in proc.stderr, proc.stderr


def test_a_destination_that_is_stdout_gets_no_json_document(tmp_path):
    """stdout appended to a file that the command also writes (``>> k``, by
    its name or as /dev/stdout): --json is the usage error, and the file
    keeps its bytes, the failure's document landing nowhere in it."""
    random_file(tmp_path / "src", 5000)
    kept = b"keep\n"
    for args in (("copy", "--host", tmp_path / "src", tmp_path / "k"), ("copy", "--host", tmp_path / "src",
                 "/dev/stdout"), ("write", "--host", "/dev/stdout", "--size", "4K"),
                 ("write", "--host", tmp_path / "k", "--size", "4K")):
        (tmp_path / "k").write_bytes(kept)
        with open(tmp_path / "k", "ab") as stdout:
            proc = subprocess.run([sys.executable, "-m", "gdscp", *map(str, args), "--json"], stdout=stdout,
                                  stderr=subprocess.PIPE, timeout=60)
        named = args[3] if args[0] == "copy" else args[2]
        assert proc.returncode == 2 and proc.stderr == (
            f"gdscp {args[0]}: error: --json: '{named}' is standard output, where the document would land among "
            "the data written to it\n").encode()
        assert (tmp_path / "k").read_bytes() == kept, args
    assert temp_files(tmp_path) == []


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"), reason="no such sysfs file")
def test_read_takes_a_sysfs_file_whatever_size_it_reports(capsys):
    """sysfs says 4096 bytes for a file of a few: read to its end, not to a length it does not have."""
    path = "/sys/kernel/mm/transparent_hugepage/enabled"
    with open(path, "rb") as f:
        size = len(f.read())
    code, doc, err = cli_json(capsys, "read", "--host", path)
    assert code == 0, err
    assert doc["bytes"] == size


def test_write_verify_of_a_block_device_reads_the_length_it_wrote(tmp_path, monkeypatch):
    """A block device's fstat size is 0: its length is what it holds, at least
    the bytes written (it is longer than them, as a rule)."""
    from gdscp.cli import write as write_command

    path = tmp_path / "dev"
    path.write_bytes(memory.pattern(8192, "seq", 0).tobytes() + b"rest of the device")
    real_fstat = os.fstat

    def as_block_device(fd):
        st = real_fstat(fd)
        return os.stat_result((stat.S_IFBLK | 0o660, *st[1:6], 0, *st[7:]))

    monkeypatch.setattr(write_command.os, "fstat", as_block_device)
    write_command.verify_pattern(str(path), 8192, "seq", 0)  # no Failure
    with pytest.raises(output.Failure, match="fewer than"):
        write_command.verify_pattern(str(path), 1 << 20, "seq", 0)


def test_copy_verify_onto_a_block_device_reads_back_what_it_wrote(capsys, tmp_path, loop_device):
    """copy --verify onto a block device (written in place, as cp does) reads
    the device back from its start as far as the source goes, as write
    --verify does; the rest of the device is not the copy's to check or touch.
    A FIFO or character device still cannot be read back."""
    data = random_file(tmp_path / "src", 3 * MiB + 17)
    code, doc, err = cli_json(capsys, "copy", "--host", "--verify", tmp_path / "src", loop_device)
    assert code == 0, err
    assert doc["verified"] and doc["files"][0]["status"] == "copied"
    with open(loop_device, "rb") as f:
        assert f.read(len(data)) == data
        assert f.read() == b"\xee" * (16 * MiB - len(data))
    _core.testing.arm_fault("land", 0, 1, 1)  # the first bytes read back are wrong
    try:
        code, _, err = cli(capsys, "copy", "--host", "--verify", "-q", tmp_path / "src", loop_device)
    finally:
        _core.testing.disarm_fault()
    (line,) = error_lines(err)
    assert code == 1 and "verify failed" in line and "at offset 0" in line and "was not changed" not in line
    bufs = [np.frombuffer(random_file(tmp_path / "other", 5000, seed=2), np.uint8)]
    (result,) = gdscp.write_files(bufs, [loop_device], verify=True).results()
    assert result.status == "done", result.error
    with open(loop_device, "rb") as f:
        assert f.read(5000) == bufs[0].tobytes() and f.read(len(data) - 5000) == data[5000:]
    code, _, err = cli(capsys, "copy", "--host", "--verify", "-q", tmp_path / "src", "/dev/null")
    (line,) = error_lines(err)
    assert code == 1 and "a FIFO or character device cannot be read back" in line


def test_unknown_pattern():
    with pytest.raises(ValueError, match="ones"):
        memory.fill(memory.allocate(8), "ones")


def test_first_difference():
    a = memory.pattern(10 * MiB, "random", seed=1)
    b = a.copy()
    assert memory.first_difference(a, b) is None and memory.equal(a, b)
    b[7 * MiB + 3] ^= 0x10
    assert memory.first_difference(a, b) == 7 * MiB + 3
    assert memory.first_difference(b"abc", bytearray(b"ab")) == 2
    assert memory.first_difference(b"", b"") is None


def test_gpu_status_gives_a_reason():
    status = memory.gpu_available()
    assert bool(status) == status.available
    assert status.reason
    if not status:
        with pytest.raises(memory.DeviceError, match="GPU 0"):
            memory.check_device(0)


# -- the app ---------------------------------------------------------------------------


def test_version(capsys):
    import gdscp

    code, out, _ = cli(capsys, "--version")
    assert code == 0 and out.strip() == f"gdscp {gdscp.__version__}"
    # As cp: a version nobody can read is an error, with stdout closed or full.
    closed = subprocess.run([sys.executable, "-m", "gdscp", "--version"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, timeout=60, preexec_fn=lambda: os.close(1))
    assert closed.returncode == 1 and "cannot write the version" in closed.stderr
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", "gdscp", "--version"], stdout=full, stderr=subprocess.PIPE,
                                  text=True, timeout=60)
        assert done.returncode == 1 and "cannot write the version" in done.stderr


@pytest.mark.parametrize("args, code", [(["--help"], 1), (["copy", "--help"], 1), (["read", "-h"], 1), ([], 2)])
def test_help_that_cannot_be_written_is_one_line(args, code):
    """As cp: help nobody can read, stdout closed, full or a pipe whose reader
    has gone (| head), is a failure said in one line (a bare `gdscp`, whose
    help comes with its usage error, keeps exit 2), never a traceback, nor a
    silent success or failure."""
    command = [sys.executable, "-m", "gdscp", *args]
    closed = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60,
                            preexec_fn=lambda: os.close(1))
    assert (closed.returncode, closed.stderr) == (code, "gdscp: error: cannot write the help: standard output is "
                                                        "closed\n")
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            done = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
        assert (done.returncode, done.stderr) == (code, "gdscp: error: cannot write the help: No space left on "
                                                        "device\n")
    reader, writer = os.pipe()
    os.close(reader)  # gone before the first byte: every write fails with EPIPE
    try:
        gone = subprocess.run(command, stdout=writer, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(writer)
    assert (gone.returncode, gone.stderr) == (code, "gdscp: error: cannot write the help: Broken pipe\n")


def test_every_command_has_help(capsys):
    for command in ("copy", "read", "write", "info"):
        code, out, _ = cli(capsys, command, "--help")
        assert code == 0 and "Usage" in out and "--json" in out


def test_no_arguments_shows_help(capsys):
    code, out, _ = cli(capsys)
    assert code == 2 and "copy" in out and "read" in out


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["write", "f", "--size", "10X"], "'10X'"),
        (["read", "f", "--offset", "1.5"], "'1.5'"),
        (["read", "f", "--threads", "0"], "--threads"),
        (["read", "f", "--compat-mode", "maybe"], "maybe"),
        (["frobnicate"], "frobnicate"),
        (["write", "f"], "--size"),
        (["copy", "only-one"], "missing destination operand after 'only-one'"),
    ],
)
def test_usage_errors_are_one_line_exit_2(capsys, tmp_path, monkeypatch, args, culprit):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0] and "Traceback" not in err


@pytest.mark.parametrize(
    "args, said",
    [
        (["--length", "1.0000000000000000000000000001K"],
         "'1.0000000000000000000000000001K' is not a whole number of bytes (1024.0000000000000000000000001024 bytes)"),
        (["--length", "0.99999999999999999999999999999K"],
         "'0.99999999999999999999999999999K' is not a whole number of bytes (1023.99999999999999999999999998976 bytes)"),
        (["--offset", "1023.9999999999999999999999999K"],
         "'1023.9999999999999999999999999K' is not a whole number of bytes (1048575.9999999999999999999998976 bytes)"),
        (["--length", "9" * 5000], "'99999999999999999999'... is not a size: 5000 characters, more than the 100 read"),
        (["--offset", "\u0668"], "'\u0668' is not a size"),
        (["--threads", "\u0668"], "'\u0668' is not a whole number"),
        (["--threads", "1_0"], "'1_0' is not a whole number"),
        (["--devices", "\u0668"], "'\u0668' is not 'all' or GPU numbers"),
    ],
)
def test_numbers_are_read_exactly_and_in_ascii_digits(capsys, tmp_path, args, said):
    """A size is computed exactly (a decimal of many places is no whole
    number of bytes however close it comes), read from at most 100
    characters, and written in ASCII digits, as a count is (Python's int()
    takes other scripts' digits, "\u0668" for 8, and "1_0"): a usage error
    saying why, on one line, and nothing read."""
    path = tmp_path / "f"
    path.write_bytes(bytes(4 * MiB))
    code, out, err = cli(capsys, "read", "--host", path, *args)
    assert (code, out) == (2, ""), err
    (line,) = error_lines(err)
    assert said in line and args[0] in line and "Traceback" not in err


@pytest.mark.parametrize("args", [["--size", "\u0668"], ["--size", "8", "--seed", "\u0668"]])
def test_a_write_takes_ascii_digits_only(capsys, tmp_path, args):
    code, out, err = cli(capsys, "write", "--host", tmp_path / "f", *args)
    assert (code, out) == (2, ""), err
    (line,) = error_lines(err)
    assert "'\u0668' is not a" in line and args[-2] in line
    assert list(tmp_path.iterdir()) == []


def test_a_mistyped_command_is_offered_the_right_one_once(capsys):
    """Typer adds the commands a mistyped one may mean to Click's message, and
    Click 8.4 on adds them again as it formats it: the line names them once."""
    code, out, err = cli(capsys, "cpy", "a", "b")
    assert code == 2 and out == ""
    assert err == "gdscp: error: No such command 'cpy'. Did you mean 'copy'? (see 'gdscp --help')\n"


def test_python_dash_m_and_console_script(tmp_path):
    data = random_file(tmp_path / "src.bin", 5000)
    done = subprocess.run(
        [sys.executable, "-m", "gdscp", "copy", str(tmp_path / "src.bin"), str(tmp_path / "dst.bin"), "-q"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "dst.bin").read_bytes() == data
    script = Path(sys.executable).with_name("gdscp")
    if script.exists():
        done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith("gdscp ")


def test_shell_completion():
    env = dict(os.environ, _GDSCP_COMPLETE="complete_bash", COMP_WORDS="gdscp re", COMP_CWORD="1")
    done = subprocess.run([sys.executable, "-m", "gdscp"], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["read"]


# -- output ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc, code",
    [
        (output.UsageError("bad"), 2),
        (memory.DeviceError("GPU 9 does not exist"), 2),
        (output.Failure("it broke"), 1),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "x.bin"), 1),
        (PermissionError(errno.EACCES, "Permission denied", "y"), 1),
        (MemoryError(), 1),
        (KeyboardInterrupt(), 130),
        (output.Terminated(), 143),
        (ZeroDivisionError("division by zero"), 1),
    ],
)
def test_exception_table(exc, code):
    message, got = output.describe(exc)
    assert got == code and message and "\n" not in message


def test_os_errors_name_the_file():
    message, _ = output.describe(FileNotFoundError(errno.ENOENT, "No such file or directory", "x.bin"))
    assert message == "'x.bin': No such file or directory"
    assert "ZeroDivisionError" in output.describe(ZeroDivisionError("boom"))[0]


def test_debug_shows_the_traceback(capsys, tmp_path):
    code, _, err = cli(capsys, "read", tmp_path / "missing.bin", "--debug")
    assert code == 1 and "Traceback" in err
    code, _, err = cli(capsys, "read", tmp_path / "missing.bin")
    assert code == 1 and "Traceback" not in err


class _FakeFuture:
    def __init__(self, moved: int):
        self.moved = moved

    def progress(self) -> int:
        return self.moved

    def get(self) -> int:
        return self.moved


def test_progress_bar_counts_bytes_and_files():
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, width=120)
    with TransferProgress(console, 3 * MiB, 3, "copy", enabled=True, delay=0.0, interval=3600) as progress:
        progress.wait(_FakeFuture(MiB))
        progress.file_done()
        future = _FakeFuture(512 * KiB)
        progress.watch(future)
        assert progress.bytes_done == MiB + 512 * KiB
        progress.finish(future, MiB)
        progress.file_done()
        progress.refresh()
    assert progress.bytes_done == 2 * MiB and progress.files_done == 2
    assert "2/3 files" in sink.getvalue()


def test_progress_bar_waits_for_the_delay():
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, width=120)
    with TransferProgress(console, MiB, 1, "read", enabled=True, delay=3600, interval=3600) as progress:
        progress.advance(MiB)
        progress.refresh()
    assert sink.getvalue() == ""


def _threads_refused(monkeypatch, allowed: tuple[str, ...]) -> None:
    """Every thread started from now on but those named ``allowed`` is
    refused, as by a system out of threads (a pids limit)."""
    import threading

    start = threading.Thread.start

    def refused(self):
        if self.name not in allowed:
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refused)


def test_the_progress_bar_takes_one_thread(monkeypatch):
    """The bar is drawn by its poller alone: Rich's own refresh thread, which
    a system short of threads may refuse, is not used."""
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, width=120)
    _threads_refused(monkeypatch, ("gdscp-progress",))
    with TransferProgress(console, MiB, 1, "copy", enabled=True, delay=0.0, interval=0.01) as progress:
        progress.advance(MiB // 2)
        progress.refresh()
        assert "copy" in sink.getvalue() and "50%" in sink.getvalue()
        progress.advance(MiB // 2)
    assert "100%" in sink.getvalue()


def test_a_copy_goes_on_without_the_bar_where_its_thread_is_refused(capsys, monkeypatch, tmp_path):
    """On a terminal, a progress bar whose thread the system refuses (a pids
    limit) is dropped, said in one warning line, and the copy goes on."""
    data = random_file(tmp_path / "a.bin", 100 * KiB)
    monkeypatch.setattr(output.Output, "show_progress", property(lambda self: True))
    _threads_refused(monkeypatch, ())
    code, out, err = cli(capsys, "copy", tmp_path / "a.bin", tmp_path / "b.bin")
    assert code == 0, err
    assert (tmp_path / "b.bin").read_bytes() == data
    assert err.splitlines() == ["gdscp copy: warning: no progress bar: can't start new thread"]


def test_no_progress_when_stderr_is_not_a_terminal(capsys, tmp_path):
    random_file(tmp_path / "a.bin", 100 * KiB)
    code, out, err = cli(capsys, "read", tmp_path / "a.bin")
    assert code == 0 and "━" not in err  # only the table (on stdout) draws lines


def test_read_prepares_staging_for_the_bytes_it_reads(monkeypatch):
    """gdscp read makes each GPU's share of the workers' staging before its
    clock, and for a small job only what its bytes can fill."""
    from gdscp import buffer, defaults
    from gdscp.cli import read as read_module

    made = []
    monkeypatch.setattr(memory, "allocate", lambda n, d=None: ("byte on", d))
    monkeypatch.setattr(buffer, "prepare", lambda device, workers=None: made.append((device, workers)))
    with defaults.set({"num_threads": 16, "bounce_buffer_size": 4 * MiB, "pipeline_depth": 2}):
        assert read_module.ready_gpus([0]) == [("byte on", 0)] and made == [(0, 16)]
        made.clear()
        read_module.ready_gpus([0, 1])
        assert made == [(0, 8), (1, 8)]
        made.clear()
        read_module.ready_gpus([0], 4096)
        read_module.ready_gpus([0], 20 * MiB)  # 3 workers' 8 MiB
        read_module.ready_gpus([0, 1], 10 << 30)
        assert made == [(0, 1), (0, 3), (0, 8), (1, 8)]
        made.clear()
        assert read_module.ready_gpus([], 1 << 30) == [] and made == []
    with defaults.set({"compat_mode": defaults.CompatMode.OFF}):
        read_module.ready_gpus([0], 1 << 30)  # cuFile only: nothing to stage
        assert made == []


# -- write -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["zeros", "random", "seq"])
def test_write_patterns(capsys, tmp_path, kind):
    path = tmp_path / "w.bin"
    code, doc, err = cli_json(capsys, "write", path, "--size", "100K", "--pattern", kind, "--seed", "3", "--host")
    assert code == 0, err
    data = path.read_bytes()
    assert len(data) == 100 * KiB
    words = np.frombuffer(data, dtype="<u8")
    if kind == "zeros":
        assert data == bytes(100 * KiB)
    elif kind == "seq":
        assert np.array_equal(words, np.arange(words.size, dtype=np.uint64) * 8)
    else:
        assert [int(w) for w in words[:4]] == [splitmix64(3, i) for i in range(4)]
        assert data == memory.pattern(100 * KiB, "random", seed=3).tobytes()
    assert doc["command"] == "write" and doc["ok"] is True
    assert doc["bytes"] == 100 * KiB and doc["pattern"] == kind and doc["fsync"] is True
    assert doc["memory"] == "host" and doc["device"] is None and doc["backend"] == "posix"
    assert doc["seconds"] >= 0 and doc["gb_per_s"] >= 0


def test_write_in_chunks_equals_one_write(capsys, tmp_path):
    size = MiB + 5
    code, _, err = cli(capsys, "write", tmp_path / "c.bin", "--size", size, "--pattern", "random",
                       "--seed", "11", "--chunk-size", "64K", "--verify", "--no-fsync", "-q")
    assert code == 0, err
    assert (tmp_path / "c.bin").read_bytes() == memory.pattern(size, "random", seed=11).tobytes()


def test_write_truncates_and_handles_empty(capsys, tmp_path):
    path = tmp_path / "t.bin"
    random_file(path, 50_000)
    assert cli(capsys, "write", path, "--size", "1000", "--pattern", "seq")[0] == 0
    assert path.read_bytes() == memory.pattern(1000, "seq").tobytes()
    code, doc, _ = cli_json(capsys, "write", path, "--size", "0")
    assert code == 0 and doc["bytes"] == 0 and path.read_bytes() == b""


def test_write_failures(capsys, tmp_path):
    code, out, err = cli(capsys, "write", tmp_path / "no" / "dir" / "f.bin", "--size", "1K")
    assert code == 1 and out == ""
    (line,) = error_lines(err)
    assert "f.bin" in line
    code, out, err = cli(capsys, "write", tmp_path, "--size", "1K")
    assert code == 1 and str(tmp_path) in error_lines(err)[0]


def test_json_records_one_to_a_line_whatever_their_strings_hold():
    """A list of flat records is written one record to a line: cut where one
    ends and the next begins, which text inside a string (quotes escaped)
    never matches. Other values keep the two-space indent."""
    names = ['plain', 'a}, {"source": "b', '}, {\\"source\\": ', "new\nline", "\u00e9\udcfc", ""]
    records = [{"source": n, "bytes": i, "ranks": [0, 1] if i % 2 else None} for i, n in enumerate(names)]
    data = {"command": "copy", "files": records, "nested": {"a": [1, {"b": 2}]}, "empty": [], "rows": [{"x": {}}]}
    text = output.json_text(data)
    assert json.loads(text) == data
    lines = text.splitlines()
    start = lines.index('  "files": [')
    assert [json.loads(line.rstrip(",")) for line in lines[start + 1 : start + 1 + len(records)]] == records
    assert lines[start + 1 + len(records)] == "  ],"
    assert '  "nested": {\n    "a": [\n      1,' in text
    assert output.json_text({}) == "{}"


def test_write_failure_in_json_mode_is_still_one_document(capsys, tmp_path):
    code, doc, err = cli_json(capsys, "write", tmp_path / "missing-dir" / "f", "--size", "1K")
    assert code == 1 and doc["ok"] is False and doc["exit_code"] == 1 and "f" in doc["error"]


# -- read ------------------------------------------------------------------------------


def test_read_reports_every_file(capsys, tmp_path):
    a = random_file(tmp_path / "a.bin", 300 * KiB + 7, seed=1)
    b = random_file(tmp_path / "b.bin", 5, seed=2)
    (tmp_path / "empty.bin").write_bytes(b"")
    code, doc, err = cli_json(capsys, "read", tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "empty.bin",
                              "--verify", "--host")
    assert code == 0, err
    assert doc["command"] == "read" and doc["ok"] is True and doc["verified"] is True
    assert [f["bytes"] for f in doc["files"]] == [len(a), len(b), 0]
    assert doc["bytes"] == len(a) + len(b)
    assert 0 <= doc["setup_seconds"] < 1  # host memory: no GPU to make ready
    for f in doc["files"]:
        assert set(f) >= {"path", "offset", "bytes", "seconds", "gb_per_s", "backend", "backend_reason", "verified"}
        assert f["backend"] == "posix"


def test_read_range_in_chunks_with_verify(capsys, tmp_path):
    random_file(tmp_path / "r.bin", MiB, seed=4)
    code, doc, err = cli_json(capsys, "read", tmp_path / "r.bin", "--offset", "4100", "--length", "200K",
                              "--chunk-size", "16K", "--verify")
    assert code == 0, err
    (f,) = doc["files"]
    assert f["offset"] == 4100 and f["bytes"] == 200 * KiB


def test_read_without_gpu_says_so(capsys, tmp_path):
    random_file(tmp_path / "a.bin", 1000)
    code, out, err = cli(capsys, "read", tmp_path / "a.bin")
    assert code == 0
    if not memory.gpu_available():
        assert "using host memory" in err
        assert "host memory" in out


@pytest.mark.parametrize("count", [1, 2])
def test_write_verify_checks_before_the_old_file_is_replaced(capsys, tmp_path, monkeypatch, count):
    """gdscp write --verify reads the new bytes back before they take the
    name: a mismatch fails the command (exit 1, naming the file and offset)
    and every old file stays as it was, with no temporary file left."""
    paths = [tmp_path / f"w{i}.bin" for i in range(count)]
    for p in paths:
        p.write_bytes(b"old contents")
    if count == 1:  # the single-file path checks the pattern in Python
        from gdscp import memory as memory_module

        monkeypatch.setattr(memory_module, "first_difference", lambda got, want: 5)
    else:  # a bulk job checks each file against its buffer in the engine
        _core.testing.arm_fault("land", 0, 1, 1)
    try:
        code, _, err = cli(capsys, "write", *paths, "--size", "64K", "--pattern", "seq", "--host", "--verify")
    finally:
        _core.testing.disarm_fault()
    assert code == 1
    assert "verify failed" in err and "offset" in err
    assert any(p.read_bytes() == b"old contents" for p in paths)
    if count == 1:
        assert paths[0].read_bytes() == b"old contents" and f"'{paths[0]}'" in err
    assert temp_files(tmp_path) == []


def test_read_verify_catches_wrong_bytes(capsys, tmp_path):
    random_file(tmp_path / "v.bin", 100 * KiB)
    _core.testing.arm_fault("land", 0, 1, 1)  # the first bytes checked are corrupted
    try:
        code, _, err = cli(capsys, "read", tmp_path / "v.bin", "--verify", "--chunk-size", "32K", "--threads", "1",
                           "--host")
    finally:
        _core.testing.disarm_fault()
    assert code == 1
    (line,) = error_lines(err)
    assert "verify failed" in line and "v.bin" in line and "offset 0" in line
    _core.testing.arm_fault("land", 0, 1, 1)
    try:
        assert cli(capsys, "read", tmp_path / "v.bin", "--host")[0] == 0  # without --verify nobody looks
    finally:
        _core.testing.disarm_fault()


@pytest.mark.parametrize(
    "args, code, culprit",
    [
        (["missing.bin"], 1, "missing.bin"),
        (["."], 1, "Is a directory"),
        (["a.bin", "--offset", "2K"], 1, "--offset"),
        (["a.bin", "--length", "2K"], 1, "has 1000 bytes from offset 0; --length"),
        (["a.bin", "--offset", "999", "--length", "2"], 1, "has 1 byte from offset 999; --length"),
        (["a.bin", "--host", "--device", "0"], 2, "--host"),
        (["a.bin", "--device", "64"], 2, "GPU 64"),
        (["a.bin", "--task-size", "0"], 2, "--task-size"),
    ],
)
def test_read_errors(capsys, tmp_path, monkeypatch, args, code, culprit):
    monkeypatch.chdir(tmp_path)
    random_file(tmp_path / "a.bin", 1000)
    got, out, err = cli(capsys, "read", *args)
    assert got == code and out == ""
    (line,) = error_lines(err)
    assert culprit in line and "Traceback" not in err


def test_read_io_error_names_the_file(capsys, tmp_path):
    random_file(tmp_path / "io.bin", 256 * KiB)
    _core.testing.arm_fault("pread", 1, 1, errno.EIO)
    try:
        code, _, err = cli(capsys, "read", tmp_path / "io.bin", "--chunk-size", "32K", "--host")
    finally:
        _core.testing.disarm_fault()
    assert code == 1
    (line,) = error_lines(err)
    assert "io.bin" in line and "Input/output error" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_read_permission_denied(capsys, tmp_path):
    path = tmp_path / "secret.bin"
    random_file(path, 100)
    path.chmod(0)
    code, _, err = cli(capsys, "read", path)
    assert code == 1 and "Permission denied" in error_lines(err)[0]


# -- copy ------------------------------------------------------------------------------


def test_copy_file_to_file(capsys, tmp_path):
    data = random_file(tmp_path / "src.bin", 777_777)
    code, doc, err = cli_json(capsys, "copy", tmp_path / "src.bin", tmp_path / "dst.bin", "--host")
    assert code == 0, err
    assert (tmp_path / "dst.bin").read_bytes() == data
    assert doc["command"] == "copy" and doc["ok"] is True
    assert (doc["copied"], doc["skipped"], doc["failed"], doc["bytes"]) == (1, 0, 0, len(data))
    (f,) = doc["files"]
    assert f["source"].endswith("src.bin") and f["destination"].endswith("dst.bin")
    assert f["status"] == "copied" and f["error"] is None and f["bytes"] == len(data)
    assert temp_files(tmp_path) == []


def test_copy_streams_large_files_in_chunks(capsys, tmp_path):
    data = random_file(tmp_path / "big.bin", 3 * MiB + 123)
    code, _, err = cli(capsys, "copy", tmp_path / "big.bin", tmp_path / "out.bin", "--chunk-size", "64K",
                       "--verify", "--task-size", "16K", "--threads", "3")
    assert code == 0, err
    assert (tmp_path / "out.bin").read_bytes() == data


def test_copy_files_into_a_directory(capsys, tmp_path):
    a = random_file(tmp_path / "a.bin", 1000, seed=1)
    b = random_file(tmp_path / "b.bin", 2000, seed=2)
    (tmp_path / "d").mkdir()
    assert cli(capsys, "copy", tmp_path / "a.bin", tmp_path / "d")[0] == 0
    assert (tmp_path / "d" / "a.bin").read_bytes() == a
    assert cli(capsys, "copy", tmp_path / "a.bin", tmp_path / "b.bin", f"{tmp_path / 'd'}/")[0] == 0
    assert (tmp_path / "d" / "b.bin").read_bytes() == b


def test_copy_several_files_needs_a_directory(capsys, tmp_path):
    random_file(tmp_path / "a.bin", 10)
    random_file(tmp_path / "b.bin", 10)
    code, _, err = cli(capsys, "copy", tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "nodir")
    assert code == 1 and "not a directory" in error_lines(err)[0]
    assert not (tmp_path / "nodir").exists()


def make_tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "sub" / "empty-file").write_bytes(b"")
    random_file(root / "top.bin", 70_000, seed=3)
    random_file(root / "sub" / "deeper" / "x.bin", 12_345, seed=4)
    os.symlink("top.bin", root / "link-to-top")


def test_copy_recursive_tree(capsys, tmp_path):
    make_tree(tmp_path / "src")
    code, doc, err = cli_json(capsys, "copy", "-r", tmp_path / "src", tmp_path / "new", "--chunk-size", "8K")
    assert code == 0, err
    assert tree(tmp_path / "new") == tree(tmp_path / "src")
    assert doc["copied"] == 4  # three files and the link
    # Into an existing directory: a subdirectory named after the source.
    (tmp_path / "existing").mkdir()
    assert cli(capsys, "copy", "-r", tmp_path / "src", tmp_path / "existing")[0] == 0
    assert tree(tmp_path / "existing" / "src") == tree(tmp_path / "src")
    assert temp_files(tmp_path) == []


def test_copy_recursive_copies_a_symbolic_link_named_as_src_as_a_link(capsys, tmp_path):
    """As cp -r: a SRC that is a symbolic link is copied as a link, as one
    inside a tree is (to a directory, to a file, dangling, or in a loop),
    never followed; LINK/ names the directory it points at. Without -r a
    link to a file is followed, one to a directory omitted."""
    make_tree(tmp_path / "real")
    os.symlink("real", tmp_path / "to-dir")
    os.symlink("real/top.bin", tmp_path / "to-file")
    os.symlink("missing", tmp_path / "dangling")
    os.symlink("loop-b", tmp_path / "loop-a")
    os.symlink("loop-a", tmp_path / "loop-b")
    links = ["to-dir", "to-file", "dangling", "loop-a"]
    for name in links:
        code, doc, err = cli_json(capsys, "copy", "-r", tmp_path / name, tmp_path / f"new-{name}")
        assert code == 0 and doc["copied"] == 1 and doc["bytes"] == 0, err
        assert os.readlink(tmp_path / f"new-{name}") == os.readlink(tmp_path / name)
    (tmp_path / "into").mkdir()
    code, doc, err = cli_json(capsys, "copy", "-r", *(tmp_path / name for name in links), tmp_path / "into")
    assert code == 0 and doc["copied"] == 4, err
    assert tree(tmp_path / "into") == {name: ("link", os.readlink(tmp_path / name)) for name in links}

    code, _, err = cli(capsys, "copy", "-r", str(tmp_path / "to-dir") + "/", tmp_path / "through")
    assert code == 0, err
    assert not (tmp_path / "through").is_symlink() and tree(tmp_path / "through") == tree(tmp_path / "real")

    code, _, err = cli(capsys, "copy", tmp_path / "to-file", tmp_path / "plain.bin")
    assert code == 0, err
    assert not (tmp_path / "plain.bin").is_symlink()
    assert (tmp_path / "plain.bin").read_bytes() == (tmp_path / "real" / "top.bin").read_bytes()
    code, _, err = cli(capsys, "copy", tmp_path / "to-dir", tmp_path / "not-made")
    assert code == 1 and "omitting directory" in err and not os.path.lexists(tmp_path / "not-made")
    assert temp_files(tmp_path) == []


def test_copy_r_of_a_link_over_the_file_it_leads_to_is_refused(capsys, tmp_path, monkeypatch):
    """As cp: a symbolic link copied (with -r, as a link) over the very file
    it leads to would leave a link to itself there, the file's bytes gone;
    'same file', and the file stays. So inside a tree."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").write_bytes(b"precious")
    os.symlink("a", tmp_path / "la")
    code, doc, err = cli_json(capsys, "copy", "-r", "la", "a")
    assert code == 1 and doc["failed"] == 1
    assert error_lines(err) == ["gdscp copy: error: 'la' and 'a' are the same file"]
    assert not os.path.islink(tmp_path / "a") and (tmp_path / "a").read_bytes() == b"precious"
    (tmp_path / "src").mkdir()
    (tmp_path / "out" / "src").mkdir(parents=True)
    (tmp_path / "out" / "src" / "l").write_bytes(b"kept")
    (tmp_path / "src" / "x").write_bytes(b"x")
    os.symlink("../out/src/l", tmp_path / "src" / "l")
    code, doc, err = cli_json(capsys, "copy", "-r", "src", "out")
    assert code == 1 and doc["failed"] == 1 and doc["copied"] == 1
    assert error_lines(err) == ["gdscp copy: error: 'src/l' and 'out/src/l' are the same file"]
    assert not os.path.islink(tmp_path / "out" / "src" / "l")
    assert (tmp_path / "out" / "src" / "l").read_bytes() == b"kept"
    assert (tmp_path / "out" / "src" / "x").read_bytes() == b"x"
    assert temp_files(tmp_path) == []


def test_copy_of_a_tree_under_a_low_limit_on_open_files(tmp_path):
    """ulimit -n 16, 16 workers: more files in flight than descriptors, and
    a batch of files waiting for their sync holding one each. The copy keeps
    fewer files in flight once it runs short, and copies every file whole."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    datas = {}
    for i in range(300):
        name = f"sub/f{i:03d}" if i % 3 else f"f{i:03d}"
        datas[name] = random_file(src / name, 1 + i * 53 % 9000, seed=i)
    env = {**os.environ, "GDSCP_NUM_THREADS": "16"}
    proc = subprocess.run(["bash", "-c", 'ulimit -n 16 && exec "$0" -m gdscp copy -r --json "$1" "$2"',
                           sys.executable, str(src), str(tmp_path / "dst")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["copied"], doc["failed"]) == (300, 0) and proc.stderr == ""
    for name, data in datas.items():
        assert (tmp_path / "dst" / name).read_bytes() == data, name
    assert temp_files(tmp_path) == []


def test_copy_directory_without_r(capsys, tmp_path):
    make_tree(tmp_path / "src")
    data = random_file(tmp_path / "f.bin", 100)
    (tmp_path / "out").mkdir()
    code, _, err = cli(capsys, "copy", tmp_path / "src", tmp_path / "f.bin", tmp_path / "out")
    assert code == 1
    (line,) = error_lines(err)
    assert "-r" in line and "src" in line
    assert (tmp_path / "out" / "f.bin").read_bytes() == data  # the other source was still copied
    assert not (tmp_path / "out" / "src").exists()


def test_copy_into_itself(capsys, tmp_path):
    make_tree(tmp_path / "src")
    code, _, err = cli(capsys, "copy", "-r", tmp_path / "src", tmp_path / "src" / "sub")
    assert code == 1 and "into itself" in error_lines(err)[0]


def test_copy_into_itself_through_a_bind_mount(capsys, tmp_path):
    """The source directory reached through a bind mount, a name whose real
    path is not below the source's: the same directory all the same
    (device and inode, as cp compares them), refused before anything is
    made in it."""
    make_tree(tmp_path / "src")
    before = tree(tmp_path / "src")
    (tmp_path / "mnt").mkdir()
    if subprocess.run(["mount", "--bind", tmp_path / "src", tmp_path / "mnt"], capture_output=True).returncode:
        pytest.skip("a bind mount needs privileges this process lacks")
    try:
        for dst, target in ((tmp_path / "mnt" / "x", tmp_path / "mnt" / "x"),
                            (tmp_path / "mnt" / "sub", tmp_path / "mnt" / "sub" / "src"),
                            (tmp_path / "mnt", tmp_path / "mnt" / "src")):
            code, doc, err = cli_json(capsys, "copy", "--host", "-r", tmp_path / "src", dst)
            message = f"cannot copy a directory, '{tmp_path}/src', into itself, '{target}'"
            assert code == 1 and error_lines(err) == [f"gdscp copy: error: {message}"], err
            assert (doc["copied"], doc["failed"], doc["bytes"]) == (0, 1, 0)
            assert [(f["source"], f["destination"], f["status"], f["error"]) for f in doc["files"]] == [
                (str(tmp_path / "src"), str(target), "failed", message)]
            assert tree(tmp_path / "src") == before
    finally:
        subprocess.run(["umount", tmp_path / "mnt"], check=True)


def test_inside_decides_by_identity_where_names_differ(tmp_path, monkeypatch):
    """Without privileges for a bind mount: real paths left as given, so
    that a symbolic link stands for another name of the same directory."""
    from gdscp.cli import copy as copy_command

    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "alias").symlink_to("src")
    monkeypatch.setattr(os.path, "realpath", os.path.abspath)
    inside = copy_command._inside
    src = str(tmp_path / "src")
    assert inside(str(tmp_path / "alias"), src) and inside(str(tmp_path / "alias" / "new" / "deeper"), src)
    assert inside(str(tmp_path / "alias" / "sub" / "new"), src) and inside(str(tmp_path / "src" / "new"), src)
    assert not inside(str(tmp_path / "other" / "new"), src) and not inside(str(tmp_path / "new"), src)
    assert not inside(str(tmp_path), src) and not inside(str(tmp_path / "srcx"), src)


def test_copy_same_file(capsys, tmp_path):
    data = random_file(tmp_path / "s.bin", 1000)
    code, _, err = cli(capsys, "copy", tmp_path / "s.bin", tmp_path / "s.bin")
    assert code == 1 and "same file" in error_lines(err)[0]
    assert (tmp_path / "s.bin").read_bytes() == data


def test_copy_no_clobber_onto_the_source_itself_skips_it(capsys, tmp_path, monkeypatch):
    """As cp -n: DST exists, so it is kept, even where it is SRC itself
    (through a link, or with -r a link over the file it leads to): a skip,
    exit status 0, not a failure."""
    monkeypatch.chdir(tmp_path)
    data = random_file(tmp_path / "a", 1000)
    os.symlink("a", tmp_path / "la")
    for args in (["a", "a"], ["a", "la"], ["la", "a"], ["-r", "la", "a"]):
        code, doc, err = cli_json(capsys, "copy", "-n", *args)
        assert code == 0, (args, err)
        assert doc["skipped"] == 1 and doc["failed"] == 0, args
        assert error_lines(err) == [], args
        assert (tmp_path / "a").read_bytes() == data and not os.path.islink(tmp_path / "a")


def test_copy_onto_a_link_to_itself_names_the_link(capsys, tmp_path, monkeypatch):
    """As cp: the error names DST as given, not the file the link leads to."""
    monkeypatch.chdir(tmp_path)
    data = random_file(tmp_path / "s.bin", 1000)
    os.symlink("s.bin", tmp_path / "link")
    code, _, err = cli(capsys, "copy", "s.bin", "link")
    assert code == 1
    assert error_lines(err) == ["gdscp copy: error: 's.bin' and 'link' are the same file"]
    assert (tmp_path / "s.bin").read_bytes() == data and os.readlink(tmp_path / "link") == "s.bin"


def test_copy_missing_source_copies_the_rest(capsys, tmp_path):
    data = random_file(tmp_path / "ok.bin", 100)
    (tmp_path / "out").mkdir()
    code, doc, err = cli_json(capsys, "copy", tmp_path / "gone.bin", tmp_path / "ok.bin", tmp_path / "out")
    assert code == 1 and doc["ok"] is False and doc["failed"] == 1 and doc["copied"] == 1
    assert "gone.bin" in error_lines(err)[0]
    assert (tmp_path / "out" / "ok.bin").read_bytes() == data
    # The record names the destination the missing file would have had.
    gone = [f for f in doc["files"] if f["status"] == "failed"]
    assert [(f["source"], f["destination"]) for f in gone] == [(str(tmp_path / "gone.bin"),
                                                                str(tmp_path / "out" / "gone.bin"))]
    code, doc, _ = cli_json(capsys, "copy", tmp_path / "gone.bin", tmp_path / "single.bin")
    assert code == 1 and doc["files"][0]["destination"] == str(tmp_path / "single.bin")


@pytest.mark.parametrize("command", ["copy", "read"])
def test_verified_says_only_what_was_checked(capsys, tmp_path, command):
    """``verified`` in the document is true only where every file was read
    back and matched: a failed file (missing, or a copy that cannot be read
    back) leaves it false, --verify or not."""
    random_file(tmp_path / "ok.bin", 100)
    targets = [tmp_path / "out.bin"] if command == "copy" else []
    code, doc, err = cli_json(capsys, command, "--verify", tmp_path / "ok.bin", *targets)
    assert code == 0 and doc["verified"] is True, err
    if command == "copy":
        code, doc, _ = cli_json(capsys, "copy", "--verify", tmp_path / "missing.bin", tmp_path / "out.bin")
    else:  # one file read and checked, one missing
        code, doc, _ = cli_json(capsys, "read", "--verify", tmp_path / "ok.bin", tmp_path / "missing.bin")
        assert [f["verified"] for f in doc["files"]] == [True, False]
    assert code == 1 and doc["ok"] is False and doc["verified"] is False
    if command == "copy":
        code, doc, _ = cli_json(capsys, "copy", "--verify", tmp_path / "ok.bin", "/dev/null")
        assert code == 1 and doc["verified"] is False


def test_copy_no_clobber(capsys, tmp_path):
    (tmp_path / "src").mkdir()
    new = random_file(tmp_path / "src" / "new.bin", 100, seed=1)
    random_file(tmp_path / "src" / "old.bin", 100, seed=2)
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "old.bin").write_bytes(b"keep me")
    code, doc, err = cli_json(capsys, "copy", "-n", tmp_path / "src" / "new.bin", tmp_path / "src" / "old.bin",
                              tmp_path / "dst")
    assert code == 0, err
    assert (tmp_path / "dst" / "old.bin").read_bytes() == b"keep me"
    assert (tmp_path / "dst" / "new.bin").read_bytes() == new
    assert (doc["copied"], doc["skipped"]) == (1, 1)


def test_copy_preserve_mode_and_times(capsys, tmp_path):
    src = tmp_path / "src"
    make_tree(src)
    (src / "top.bin").chmod(0o751)
    (src / "sub").chmod(0o705)
    os.utime(src / "top.bin", ns=(1_000_000_123_456_789, 1_100_000_987_654_321))
    os.utime(src / "sub", ns=(1_200_000_000_000_000, 1_300_000_000_000_000))
    assert cli(capsys, "copy", "-r", "--preserve", src, tmp_path / "p")[0] == 0
    for rel in ("top.bin", "sub"):
        a, b = os.stat(src / rel), os.stat(tmp_path / "p" / rel)
        assert stat.S_IMODE(a.st_mode) == stat.S_IMODE(b.st_mode)
        assert a.st_mtime_ns == b.st_mtime_ns
    # Without --preserve: the source mode less the umask, and a fresh mtime.
    assert cli(capsys, "copy", src / "top.bin", tmp_path / "plain.bin")[0] == 0
    mask = os.umask(0)
    os.umask(mask)
    st = os.stat(tmp_path / "plain.bin")
    assert stat.S_IMODE(st.st_mode) == 0o751 & ~mask
    assert st.st_mtime_ns != 1_100_000_987_654_321


def test_copy_keeps_a_directorys_sticky_bit_as_cp_does(capsys, tmp_path):
    """Without --preserve, as cp -r: a directory made keeps the sticky bit (a
    shared directory where only a file's owner may remove it stays so), not
    a set-group-ID bit; the permission bits lose the umask."""
    src = tmp_path / "src"
    for name, mode in (("shared", 0o1777), ("group", 0o2750), ("both", 0o3775)):
        (src / name).mkdir(parents=True)
        (src / name).chmod(mode)
    code, _, err = cli(capsys, "copy", "-r", "--host", "-q", src, tmp_path / "dst")
    assert code == 0, err
    mask = os.umask(0)
    os.umask(mask)
    for name, mode in (("shared", 0o1777), ("group", 0o2750), ("both", 0o3775)):
        assert stat.S_IMODE((tmp_path / "dst" / name).stat().st_mode) == mode & 0o1777 & ~mask, name


def test_copy_keeps_the_set_group_id_bit_a_directory_takes_from_its_parent(capsys, tmp_path):
    """As cp -r into a set-group-ID directory (a group's shared folder): each
    directory made takes the bit, and the group, from its parent and keeps
    them, so that the files made in it later still take the group."""
    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    for rel, mode in (("", 0o755), ("sub", 0o750), ("sub/deeper", 0o755)):
        (src / rel).chmod(mode)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    if not shared.stat().st_mode & stat.S_ISGID:
        pytest.skip("this filesystem keeps no set-group-ID bit on directories")
    code, _, err = cli(capsys, "copy", "-r", "--host", "-q", src, shared)
    assert code == 0, err
    mask = os.umask(0)
    os.umask(mask)
    for rel, mode in (("src", 0o755), ("src/sub", 0o750), ("src/sub/deeper", 0o755)):
        made = (shared / rel).stat()
        assert stat.S_IMODE(made.st_mode) == stat.S_ISGID | (mode & ~mask), rel
        assert made.st_gid == shared.stat().st_gid, rel


def test_copy_of_a_tree_deeper_than_the_recursion_limit(capsys, tmp_path):
    """A tree as deep as a path within PATH_MAX allows, deeper than Python's
    recursion limit, is copied as cp copies it (and cleaned with --clean),
    not failed with a RecursionError."""
    depth = sys.getrecursionlimit() + 100
    src, dst = tmp_path / "src", tmp_path / "dst"
    deepest = os.path.join(str(src), *["d"] * depth)
    if len(deepest) + 100 > os.pathconf(str(tmp_path), "PC_PATH_MAX"):
        pytest.skip("the path of the deepest folder would not fit in PATH_MAX")
    try:
        folder = str(src)
        os.mkdir(folder)
        for _ in range(depth):
            folder = os.path.join(folder, "d")
            os.mkdir(folder)
        with open(os.path.join(folder, "leaf"), "wb") as f:
            f.write(b"at the bottom")
        code, _, err = cli(capsys, "copy", "-r", "--host", "-q", src, dst)
        assert code == 0, err
        copied = os.path.join(str(dst), *["d"] * depth, "leaf")
        with open(copied, "rb") as f:
            assert f.read() == b"at the bottom"
        code, _, err = cli(capsys, "copy", "-r", "--host", "-q", "--clean", str(src) + "/.", dst)
        assert code == 0, err
    finally:
        # shutil.rmtree, and so pytest's own clean-up, recurses as deep as the tree.
        subprocess.run(["rm", "-rf", str(src), str(dst)], check=True)


def test_copy_over_an_existing_file_keeps_its_mode(capsys, tmp_path):
    data = random_file(tmp_path / "src.bin", 5000)
    dst = tmp_path / "dst.bin"
    dst.write_bytes(b"old")
    dst.chmod(0o600)
    assert cli(capsys, "copy", tmp_path / "src.bin", dst)[0] == 0
    assert dst.read_bytes() == data and stat.S_IMODE(dst.stat().st_mode) == 0o600


def test_copy_failing_midway_keeps_the_destination(capsys, tmp_path):
    random_file(tmp_path / "src.bin", MiB)
    dst = tmp_path / "dst.bin"
    dst.write_bytes(b"precious")
    _core.testing.arm_fault("pwrite", 3, 1, errno.EIO)
    try:
        code, doc, err = cli_json(capsys, "copy", tmp_path / "src.bin", dst, "--chunk-size", "64K", "--host")
    finally:
        _core.testing.disarm_fault()
    assert code == 1 and doc["failed"] == 1 and doc["ok"] is False
    (line,) = error_lines(err)
    assert "src.bin" in line and "dst.bin" in line and "Input/output error" in line
    assert dst.read_bytes() == b"precious"
    assert temp_files(tmp_path) == []
    # A new destination is not left behind either.
    _core.testing.arm_fault("pwrite", 2, 1, errno.ENOSPC)
    try:
        code, _, _ = cli(capsys, "copy", tmp_path / "src.bin", tmp_path / "fresh.bin", "--chunk-size", "64K",
                         "--host")
    finally:
        _core.testing.disarm_fault()
    assert code == 1 and not (tmp_path / "fresh.bin").exists() and temp_files(tmp_path) == []


def test_write_failing_midway_keeps_the_old_file(capsys, tmp_path):
    dst = tmp_path / "out.bin"
    dst.write_bytes(b"precious")
    dst.chmod(0o640)
    _core.testing.arm_fault("pwrite", 2, 1, errno.EIO)
    try:
        code, _, err = cli(capsys, "write", dst, "--size", "1M", "--chunk-size", "64K", "--host")
    finally:
        _core.testing.disarm_fault()
    assert code == 1 and "Input/output error" in err
    assert dst.read_bytes() == b"precious" and temp_files(tmp_path) == []
    # Once it succeeds, the new bytes replace the old file, which keeps its mode.
    assert cli(capsys, "write", dst, "--size", "1M", "--pattern", "seq", "--host")[0] == 0
    assert dst.stat().st_size == MiB and stat.S_IMODE(dst.stat().st_mode) == 0o640
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("size", [0, 1, 4095, 4097, MiB + 3])
def test_write_several_files_as_one_job(capsys, tmp_path, size):
    """Each FILE gets the whole pattern (the bytes depend only on position);
    an existing file is replaced and keeps its mode; no temporary is left."""
    names = [tmp_path / f"w{i}.bin" for i in range(5)]
    names[2].write_bytes(b"old")
    names[2].chmod(0o640)
    code, doc, err = cli_json(capsys, "write", *names, "--size", size, "--pattern", "random", "--seed", "9",
                              "--host", "--verify")
    assert code == 0, err
    expect = memory.pattern(size, "random", seed=9).tobytes()
    for p in names:
        assert p.read_bytes() == expect, p
    assert stat.S_IMODE(names[2].stat().st_mode) == 0o640
    assert temp_files(tmp_path) == []
    assert doc["ok"] is True and doc["bytes"] == 5 * size and doc["verified"] is True
    assert [f["path"] for f in doc["files"]] == [str(p) for p in names]
    assert all(f["status"] == "done" and f["bytes"] == size and f["seconds"] >= 0 for f in doc["files"])


def test_write_several_files_one_failing(capsys, tmp_path):
    """A file that cannot be written fails alone, with its path and reason;
    the others are written, and the exit code is 1."""
    names = [tmp_path / "a.bin", tmp_path / "missing" / "b.bin", tmp_path / "c.bin"]
    code, doc, err = cli_json(capsys, "write", *names, "--size", "100K", "--pattern", "seq", "--host")
    assert code == 1 and doc["ok"] is False
    (line,) = error_lines(err)
    assert "missing/b.bin" in line and "No such file or directory" in line
    assert [f["status"] for f in doc["files"]] == ["done", "failed", "done"]
    expect = memory.pattern(100 * KiB, "seq").tobytes()
    assert names[0].read_bytes() == expect and names[2].read_bytes() == expect
    assert temp_files(tmp_path) == []


def test_write_fail_fast_says_why_each_other_file_was_not_written(capsys, tmp_path):
    """With --fail-fast the files not written after the first failure are
    cancelled, each saying why as copy's do, with no backend: none wrote
    them, and none of them exists."""
    names = [tmp_path / "missing" / "x.bin", tmp_path / "a.bin", tmp_path / "b.bin"]
    code, doc, err = cli_json(capsys, "write", *names, "--size", "4K", "--pattern", "seq", "--fail-fast", "--threads",
                              "1", "--host")
    assert code == 1 and doc["ok"] is False, err
    first, *rest = doc["files"]
    assert first["status"] == "failed" and "No such file or directory" in first["error"]
    expect = memory.pattern(4 * KiB, "seq").tobytes()
    for record, name in zip(rest, names[1:]):
        if record["status"] == "cancelled":
            assert record["error"] == "not written: an earlier file failed (--fail-fast)", record
            assert record["backend"] is None and not name.exists()
        else:  # written before the failure stopped the job
            assert record["status"] == "done" and name.read_bytes() == expect
    assert any(r["status"] == "cancelled" for r in rest), doc
    assert temp_files(tmp_path) == []


def test_write_several_files_failing_midway_keep_the_old_ones(capsys, tmp_path):
    """An I/O error in one file's writes: that file keeps its old bytes, the
    others get the pattern."""
    names = [tmp_path / f"f{i}.bin" for i in range(4)]
    for p in names:
        p.write_bytes(b"precious")
    _core.testing.arm_fault("pwrite", 2, 1, errno.EIO)
    try:
        code, doc, err = cli_json(capsys, "write", *names, "--size", "1M", "--pattern", "random", "--host")
    finally:
        _core.testing.disarm_fault()
    assert code == 1 and "Input/output error" in err
    failed = [f["path"] for f in doc["files"] if f["status"] == "failed"]
    assert len(failed) == 1
    expect = memory.pattern(MiB, "random").tobytes()
    for p in names:
        assert p.read_bytes() == (b"precious" if str(p) in failed else expect), p
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("extra, message", [
    (["{a}"], "named twice"),
    (["/dev/null"], "not a regular file"),
    (["{d}"], "not a regular file"),
    (["{d}/"], "not a regular file"),
    (["{d}/new/"], "not a regular file"),
])
def test_write_several_files_usage_errors(capsys, tmp_path, extra, message):
    a = tmp_path / "a.bin"
    (tmp_path / "d").mkdir()
    code, _, err = cli(capsys, "write", a, *[e.format(a=a, d=tmp_path / "d") for e in extra], "--size", "1K",
                       "--host")
    assert code == 2 and message in err
    assert not a.exists() and os.listdir(tmp_path / "d") == []


def test_write_refuses_a_chunk_size_whose_host_buffers_are_more_than_the_memory_available(capsys, tmp_path,
                                                                                           monkeypatch):
    """write fills its two buffers of --chunk-size whole; in host memory,
    which the kernel may grant past what there is, buffers past the memory
    available would end in the OOM killer: a usage error naming the option,
    nothing written. Buffers that fit write the pattern."""
    monkeypatch.setattr(memory, "host_memory", lambda: (3 * MiB, 3 * MiB))
    out = tmp_path / "a.bin"
    code, stdout, err = cli(capsys, "write", out, "--size", "4M", "--chunk-size", "2M", "--host", "--pattern", "seq")
    assert (code, stdout) == (2, ""), err
    assert err.splitlines() == ["gdscp write: error: --chunk-size: 2 buffers of 2.00 MiB need 4.00 MiB of host "
                                "memory; 3.00 MiB is available"], err
    code, stdout, err = cli(capsys, "write", out, "--size", "4M", "--chunk-size", "8M", "--host", "--pattern", "seq")
    assert (code, err.splitlines()) == (2, ["gdscp write: error: --chunk-size: 1 buffer of 4.00 MiB needs 4.00 MiB "
                                            "of host memory; 3.00 MiB is available"]), err
    assert os.listdir(tmp_path) == []
    code, stdout, err = cli(capsys, "write", out, "--size", "4M", "--chunk-size", "1M", "--host", "--pattern", "seq")
    assert code == 0, err
    assert out.read_bytes() == memory.pattern(4 * MiB, "seq").tobytes()


def test_write_several_files_refuses_a_chunk_size_it_would_not_use(capsys, tmp_path):
    """Several FILEs are written from one buffer of SIZE bytes: --chunk-size,
    which would bound the memory of one FILE's write, is refused rather than
    passed over (the buffer would be SIZE whatever it says)."""
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    code, out, err = cli(capsys, "write", a, b, "--size", "1M", "--chunk-size", "64K", "--host")
    assert (code, out) == (2, ""), err
    assert err.splitlines() == ["gdscp write: error: --chunk-size cannot be used with several FILEs: they are "
                                "written from one buffer of SIZE bytes"], err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["d", "d/", "d/new/"])
def test_write_to_a_directory_fails_before_writing(capsys, tmp_path, name):
    (tmp_path / "d").mkdir()
    code, _, err = cli(capsys, "write", f"{tmp_path}/{name}", "--size", "1M", "--host")
    assert code == 1 and "directory" in err and ".gdscp-tmp" not in err
    assert sorted(os.listdir(tmp_path)) == ["d"] and os.listdir(tmp_path / "d") == []


SAID = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_copy_interrupted_by_a_signal(capsys, tmp_path, monkeypatch, signum, code):
    """A signal while the copy runs: the exit code says which, the old
    destination stays, no temporary file is left and the handlers are given
    back. The engine holds the copy after a few chunks until it is cancelled:
    left to itself, 8 MiB on a fast filesystem can be copied and renamed
    before the command first waits on its job, and the signal then lands
    after the copy."""
    random_file(tmp_path / "src.bin", 8 * MiB)
    dst = tmp_path / "dst.bin"
    dst.write_bytes(b"precious")
    real_wait = BulkJob.wait
    in_flight = []

    def signal_then_wait(self, timeout=None):
        if not in_flight:
            deadline = time.monotonic() + 60
            while not _core.testing.hold_reached() and not self.done() and time.monotonic() < deadline:
                time.sleep(0.001)
            in_flight.append(_core.testing.hold_reached() and not self.done())
            in_flight.append(temp_files(tmp_path))
            os.kill(os.getpid(), signum)  # the signal lands while the copy runs (once)
        return real_wait(self, timeout)

    monkeypatch.setattr(BulkJob, "wait", signal_then_wait)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    _core.testing.arm_hold(4)  # the fifth chunk waits for the cancel
    try:
        got, _, err = cli(capsys, "copy", tmp_path / "src.bin", dst, "--chunk-size", "64K")
    finally:
        _core.testing.disarm_fault()
    assert in_flight[0], "the copy was not in flight when the signal was sent"
    assert len(in_flight[1]) == 1, in_flight  # its temporary file, four chunks written
    assert got == code
    assert SAID[signum] in err
    assert dst.read_bytes() == b"precious" and temp_files(tmp_path) == []
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


# -- the destination directory moved while a file is written ------------------------


def _move_when_held(folder: Path, moved_to: Path, seen: list) -> threading.Thread:
    """A thread that waits until the engine holds the job at a chunk
    (testing.arm_hold, armed first: the file is in flight, its temporary file
    made), records the temporary files in ``folder``, renames ``folder`` to
    ``moved_to`` and lets the job go on."""

    def move() -> None:
        try:
            deadline = time.monotonic() + 60
            while not _core.testing.hold_reached() and time.monotonic() < deadline:
                time.sleep(0.001)
            if _core.testing.hold_reached():
                seen.append(temp_files(folder))
                folder.rename(moved_to)
        finally:
            _core.testing.disarm_fault()

    mover = threading.Thread(target=move)
    mover.start()
    return mover


def test_a_copy_whose_destination_directory_is_moved_leaves_no_temporary_file(capsys, tmp_path):
    """The destination's directory renamed while the copy is in flight: the
    copy fails naming the destination, is not put in place in the moved
    directory (the old file there is intact), and its temporary file, which
    went with the directory, is removed there."""
    random_file(tmp_path / "src.bin", 8 * MiB)
    folder, moved_to = tmp_path / "dd", tmp_path / "dd2"
    folder.mkdir()
    (folder / "d").write_bytes(b"good")
    seen: list = []
    _core.testing.arm_hold(4)  # the fifth chunk waits for the rename
    mover = _move_when_held(folder, moved_to, seen)
    try:
        code, _, err = cli(capsys, "copy", tmp_path / "src.bin", folder / "d", "--chunk-size", "64K")
    finally:
        _core.testing.disarm_fault()
        mover.join()
    assert len(seen) == 1 and len(seen[0]) == 1, seen  # renamed with the temporary file in it
    assert temp_files(tmp_path) == []
    assert not folder.exists() and sorted(os.listdir(moved_to)) == ["d"]
    assert (moved_to / "d").read_bytes() == b"good"
    assert code == 1
    assert err.strip().splitlines() == [
        f"gdscp copy: error: cannot copy '{tmp_path / 'src.bin'}' to '{folder / 'd'}': the destination directory "
        f"'{folder}' was moved or removed during the copy"], err


def test_a_tree_copy_whose_destination_directory_is_moved_leaves_no_temporary_file(capsys, tmp_path):
    """copy -r into DST, renamed while a file of the tree is in flight: that
    file fails (one line, naming it), the old file in the moved directory is
    intact, and no temporary file is left anywhere; the directory the copy
    made there, gone with the move, adds no error of its own."""
    src = tmp_path / "tree"
    (src / "new").mkdir(parents=True)
    random_file(src / "big.bin", 8 * MiB)
    folder, moved_to = tmp_path / "dd", tmp_path / "dd2"
    (folder / "tree").mkdir(parents=True)
    (folder / "tree" / "big.bin").write_bytes(b"good")
    seen: list = []
    _core.testing.arm_hold(4)
    mover = _move_when_held(folder, moved_to, seen)
    try:
        code, _, err = cli(capsys, "copy", "-r", src, folder, "--chunk-size", "64K")
    finally:
        _core.testing.disarm_fault()
        mover.join()
    assert len(seen) == 1 and len(seen[0]) == 1, seen
    assert temp_files(tmp_path) == []
    assert not folder.exists() and sorted(os.listdir(moved_to / "tree")) == ["big.bin", "new"]
    assert (moved_to / "tree" / "big.bin").read_bytes() == b"good"
    assert code == 1
    assert err.strip().splitlines() == [
        f"gdscp copy: error: cannot copy '{src / 'big.bin'}' to '{folder / 'tree' / 'big.bin'}': the destination "
        f"directory '{folder / 'tree'}' was moved or removed during the copy"], err


@pytest.mark.parametrize("preserve", [False, True])
def test_directories_made_get_their_modes_where_the_destination_was_moved(capsys, tmp_path, preserve):
    """copy -r into DST, renamed while a file of the tree is in flight: the
    directories the copy made, gone with DST, get the modes (with --preserve
    the times too) a finished copy gives them, not the 0700 they were made
    with; the directory that was there before keeps its own."""
    src = tmp_path / "tree"
    (src / "a" / "deep").mkdir(parents=True)
    (src / "b").mkdir()
    random_file(src / "big.bin", 8 * MiB)
    modes = {"": 0o751, "a": 0o755, "a/deep": 0o705, "b": 0o750}
    for name, mode in modes.items():
        os.chmod(src / name, mode)
        os.utime(src / name, ns=(1_000_000_000_000_000_000, 1_200_000_000_000_000_000))
    folder, moved_to = tmp_path / "dd", tmp_path / "dd2"
    folder.mkdir()
    os.chmod(folder, 0o775)
    seen: list = []
    _core.testing.arm_hold(4)  # the fifth chunk of big.bin waits for the rename
    mover = _move_when_held(folder, moved_to, seen)
    try:
        code, _, err = cli(capsys, "copy", "-r", *(["--preserve"] if preserve else []), src, folder,
                           "--chunk-size", "64K")
    finally:
        _core.testing.disarm_fault()
        mover.join()
    assert len(seen) == 1, seen
    assert code == 1
    assert err.strip().splitlines() == [
        f"gdscp copy: error: cannot copy '{src / 'big.bin'}' to '{folder / 'tree' / 'big.bin'}': the destination "
        f"directory '{folder / 'tree'}' was moved or removed during the copy"], err
    assert not folder.exists() and temp_files(tmp_path) == []
    umask = os.umask(0)
    os.umask(umask)
    for name, mode in modes.items():
        made = os.stat(moved_to / "tree" / name)
        assert stat.S_IMODE(made.st_mode) == (mode if preserve else mode & ~umask), name
        if preserve:
            assert made.st_mtime_ns == 1_200_000_000_000_000_000, name
    assert stat.S_IMODE(os.stat(moved_to).st_mode) == 0o775
    assert sorted(os.listdir(moved_to / "tree")) == ["a", "b"]


def test_directories_made_get_their_modes_where_dst_made_by_the_copy_was_moved(capsys, tmp_path):
    """copy -r of a tree to a DST that did not exist: the copy makes DST,
    which is renamed while a file is in flight; DST and the directories made
    in it get the modes a finished copy gives them wherever DST went."""
    src = tmp_path / "tree"
    (src / "a" / "deep").mkdir(parents=True)
    (src / "b").mkdir()
    random_file(src / "a" / "big.bin", 8 * MiB)
    modes = {"": 0o751, "a": 0o755, "a/deep": 0o705, "b": 0o750}
    for name, mode in modes.items():
        os.chmod(src / name, mode)
    dst, moved_to = tmp_path / "made", tmp_path / "made2"
    seen: list = []
    _core.testing.arm_hold(4)  # the fifth chunk of big.bin waits for the rename
    mover = _move_when_held(dst, moved_to, seen)
    try:
        code, _, err = cli(capsys, "copy", "-r", src, dst, "--chunk-size", "64K")
    finally:
        _core.testing.disarm_fault()
        mover.join()
    assert len(seen) == 1, seen
    assert code == 1
    assert f"the destination directory '{dst / 'a'}' was moved or removed during the copy" in err, err
    assert not dst.exists() and temp_files(tmp_path) == []
    umask = os.umask(0)
    os.umask(umask)
    for name, mode in modes.items():
        assert stat.S_IMODE(os.stat(moved_to / name).st_mode) == mode & ~umask, name
    assert sorted(os.listdir(moved_to)) == ["a", "b"]
    assert os.listdir(moved_to / "a") == ["deep"]


def test_a_write_whose_destination_directory_is_moved_leaves_no_temporary_file(capsys, tmp_path, monkeypatch):
    """gdscp write of one FILE whose directory is renamed halfway through:
    it fails naming FILE and saying what happened (not the temporary file's
    path, which leads nowhere), the old FILE in the moved directory is
    intact, and the temporary file is removed there."""
    write_command = importlib.import_module("gdscp.cli.write")
    real_write_range = write_command.write_range
    folder, moved_to = tmp_path / "dd", tmp_path / "dd2"
    folder.mkdir()
    (folder / "d").write_bytes(b"good")
    seen: list = []

    def write_then_move(sink, slots, fill, chunk, start, end, *rest):
        half = start + (end - start) // 2 // chunk * chunk
        real_write_range(sink, slots, fill, chunk, start, half, *rest)
        seen.append(temp_files(folder))
        folder.rename(moved_to)
        fill(0, half, min(chunk, end - half))
        real_write_range(sink, slots, fill, chunk, half, end, *rest)

    monkeypatch.setattr(write_command, "write_range", write_then_move)
    code, _, err = cli(capsys, "write", folder / "d", "--size", "8M", "--chunk-size", "1M", "--host")
    assert len(seen) == 1 and len(seen[0]) == 1, seen
    assert temp_files(tmp_path) == []
    assert not folder.exists() and sorted(os.listdir(moved_to)) == ["d"]
    assert (moved_to / "d").read_bytes() == b"good"
    assert code == 1
    assert err.strip().splitlines() == [
        f"gdscp write: error: cannot write '{folder / 'd'}': the destination directory '{folder}' was moved or "
        "removed during the write"], err


def test_several_writes_whose_destination_directory_is_moved_leave_no_temporary_file(capsys, tmp_path):
    """gdscp write of several FILEs (one bulk job) into a directory renamed
    while they are in flight: each fails naming itself, the old one in the
    moved directory is intact, and no temporary file is left."""
    folder, moved_to = tmp_path / "dd", tmp_path / "dd2"
    folder.mkdir()
    (folder / "a").write_bytes(b"good")
    seen: list = []
    _core.testing.arm_hold(4)
    mover = _move_when_held(folder, moved_to, seen)
    try:
        code, _, err = cli(capsys, "write", folder / "a", folder / "b", "--size", "8M", "--host")
    finally:
        _core.testing.disarm_fault()
        mover.join()
    assert len(seen) == 1 and seen[0], seen
    assert temp_files(tmp_path) == []
    assert sorted(os.listdir(moved_to)) == ["a"] and (moved_to / "a").read_bytes() == b"good"
    assert code == 1
    assert sorted(err.strip().splitlines()) == [
        f"gdscp write: error: cannot write '{folder / name}': the destination directory '{folder}' was moved or "
        "removed during the write" for name in ("a", "b")], err


def test_a_signal_between_a_job_starting_and_its_wait_cancels_it(capsys, tmp_path, monkeypatch):
    """Ctrl-C may land after the bulk job has started and before the command
    waits on it: the job is cancelled and waited for all the same (it does not
    run on behind the exit), no temporary file is left, and each file that is
    there is complete."""
    from gdscp.cli import copy as copy_command

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3000):
        (src / f"f{i:04d}").write_bytes(bytes([i % 251]) * (i % 50 + 1))
    started = []
    real = copy_command.copy_files

    def start_then_interrupt(*args, **kwargs):
        started.append(real(*args, **kwargs))
        raise KeyboardInterrupt

    monkeypatch.setattr(copy_command, "copy_files", start_then_interrupt)
    got, _, err = cli(capsys, "copy", "-r", "--host", src, tmp_path / "dst")
    assert got == 130 and "interrupted" in err
    (job,) = started
    assert job.done(), "the job ran on after the command ended"
    assert "cancelled" in {r.status for r in job.results()}
    assert temp_files(tmp_path / "dst") == []
    for name in os.listdir(tmp_path / "dst"):
        assert (tmp_path / "dst" / name).read_bytes() == (src / name).read_bytes()


def test_sighup_ignored_stays_ignored(tmp_path):
    """Under nohup (SIGHUP ignored) a hangup does not end the command."""
    random_file(tmp_path / "src.bin", 64 * MiB)
    proc = subprocess.Popen([sys.executable, "-m", "gdscp", "copy", "--host", "-q", "--chunk-size", "64K",
                             tmp_path / "src.bin", tmp_path / "dst.bin"], stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    time.sleep(0.3)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert (tmp_path / "dst.bin").read_bytes() == (tmp_path / "src.bin").read_bytes()


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_write_of_hundreds_of_files_interrupted(capsys, tmp_path, monkeypatch, signum, code):
    """A signal while 300 files are written: the exit code says which, no
    temporary file is left, and every FILE is either untouched or complete."""
    names = [tmp_path / f"n{i:03d}.bin" for i in range(300)]
    for p in names[::7]:
        p.write_bytes(b"precious")
    real_wait = BulkJob.wait

    def signal_then_wait(self, timeout=None):
        os.kill(os.getpid(), signum)  # the signal lands while the files are written
        return real_wait(self, timeout)

    monkeypatch.setattr(BulkJob, "wait", signal_then_wait)
    got, _, err = cli(capsys, "write", *names, "--size", "200K", "--pattern", "random", "--seed", "4", "--host")
    assert got == code
    assert SAID[signum] in err
    assert temp_files(tmp_path) == []
    expect = memory.pattern(200 * KiB, "random", seed=4).tobytes()
    for i, p in enumerate(names):
        if p.exists():
            assert p.read_bytes() in ((b"precious", expect) if i % 7 == 0 else (expect,)), p
        else:
            assert i % 7 != 0, p


def test_an_interrupt_as_a_tree_copy_picks_its_directories_still_gives_them_modes(capsys, tmp_path, monkeypatch):
    """Ctrl-C just as the files are in and the directories made are picked
    out for their modes: no directory is left at the 0700 it was made with
    (the pick had run outside the protection of the modes' own steps)."""
    from gdscp.cli import copy as copy_module

    tree = make_file_tree(str(tmp_path / "src"), 30, 1, 4 * KiB, seed=3)
    real_copy_files = copy_module._Copier._copy_files

    class InterruptedOnce(set):
        raised = False

        def __contains__(self, item):
            if not InterruptedOnce.raised:
                InterruptedOnce.raised = True
                raise KeyboardInterrupt
            return super().__contains__(item)

    def copy_then_interrupt(self, files, progress):
        real_copy_files(self, files, progress)
        self.created_dirs = InterruptedOnce(self.created_dirs)

    monkeypatch.setattr(copy_module._Copier, "_copy_files", copy_then_interrupt)
    dst = tmp_path / "dst"
    code, _, err = cli(capsys, "copy", "-r", "--host", tree.root, dst)
    assert InterruptedOnce.raised and code == 130, err
    umask = os.umask(0)
    os.umask(umask)
    for folder, _, _ in os.walk(dst):
        source = os.path.join(tree.root, os.path.relpath(folder, dst))
        assert stat.S_IMODE(os.stat(folder).st_mode) == stat.S_IMODE(os.stat(source).st_mode) & ~umask, folder


def test_an_interrupt_after_the_document_adds_no_second_one(capsys, tmp_path, monkeypatch):
    """A Ctrl-C that lands as the command line ends, after the command wrote
    its JSON document: exit 130, and stdout still holds that one document (a
    failure document after it had made two)."""
    from gdscp.cli import app as app_module

    random_file(tmp_path / "src.bin", 10000)
    real_app = app_module.app

    class AppThenInterrupt:
        def __getattr__(self, name):
            return getattr(real_app, name)

        def __call__(self, *args, **kwargs):
            real_app(*args, **kwargs)
            raise KeyboardInterrupt

    monkeypatch.setattr(app_module, "app", AppThenInterrupt())
    code, out, err = cli(capsys, "copy", tmp_path / "src.bin", tmp_path / "dst.bin", "--json")
    assert code == 130 and "interrupted" in err
    doc = json.loads(out)  # one document: a second would not parse
    assert doc["ok"] is True and (tmp_path / "dst.bin").read_bytes() == (tmp_path / "src.bin").read_bytes()
    # The next command in this process still gets its own failure document.
    monkeypatch.setattr(app_module, "app", real_app)
    code, doc, _ = cli_json(capsys, "copy", tmp_path / "missing.bin", tmp_path / "x.bin")
    assert code == 1 and doc["ok"] is False


def test_copy_of_a_tree_of_many_files(capsys, tmp_path):
    tree = make_file_tree(str(tmp_path / "src"), 400, 0, 40 * KiB, seed=2)
    code, doc, err = cli_json(capsys, "copy", "-r", tree.root, tmp_path / "dst", "--host")
    assert code == 0, err
    assert doc["copied"] == 400 and doc["bytes"] == tree.bytes
    for path in tree.paths:
        assert (tmp_path / "dst" / os.path.relpath(path, tree.root)).read_bytes() == Path(path).read_bytes()
    assert all(f["seconds"] >= 0 for f in doc["files"]) and temp_files(tmp_path) == []


def vanish_after_the_walk(monkeypatch, paths) -> None:
    """``gdscp copy`` finds ``paths`` in its walk, then they are gone."""
    from gdscp.cli import copy as copy_module

    real_run = copy_module._Copier.run

    def vanish_then_run(self, jobs, progress):
        for path in paths:
            os.unlink(path)
        return real_run(self, jobs, progress)

    monkeypatch.setattr(copy_module._Copier, "run", vanish_then_run)


def test_copy_of_a_tree_with_failing_files(capsys, tmp_path, monkeypatch):
    """Files that vanish after the walk, and writes that fail: each reported
    with its path and reason, the others copied, nothing partial left."""
    tree = make_file_tree(str(tmp_path / "src"), 200, 1, 20 * KiB, seed=4)
    gone = tree.paths[10:13]
    vanish_after_the_walk(monkeypatch, gone)
    _core.testing.arm_fault("pwrite", 50, 2, errno.EIO)
    try:
        code, doc, err = cli_json(capsys, "copy", "-r", tree.root, tmp_path / "dst", "--host")
    finally:
        _core.testing.disarm_fault()
    assert code == 1 and doc["ok"] is False and doc["failed"] == 5 and doc["copied"] == 195
    lines = error_lines(err)
    assert len(lines) == 5
    for path in gone:
        assert any(path in line and "No such file" in line for line in lines)
    assert sum("Input/output error" in line for line in lines) == 2
    for f in doc["files"]:
        dst = Path(f["destination"])
        if f["status"] == "copied":
            assert dst.read_bytes() == Path(f["source"]).read_bytes()
        else:
            assert f["status"] == "failed" and f["error"] and not dst.exists()
    assert temp_files(tmp_path) == []


def test_copy_fail_fast_stops_at_the_first_failure(capsys, tmp_path, monkeypatch):
    tree = make_file_tree(str(tmp_path / "src"), 100, 1, 4 * KiB, seed=6, dirs=1)
    vanish_after_the_walk(monkeypatch, tree.paths[:1])
    code, doc, err = cli_json(capsys, "copy", "-r", tree.root, tmp_path / "dst", "--host", "--fail-fast",
                              "--threads", "1")
    assert code == 1
    statuses = {f["status"] for f in doc["files"]}
    assert statuses <= {"failed", "cancelled", "copied"} and "cancelled" in statuses
    assert len(error_lines(err)) == 1
    assert temp_files(tmp_path) == []


def test_copy_clean_removes_dead_temporary_files(capsys, tmp_path):
    random_file(tmp_path / "a.bin", 100)
    deep = tmp_path / "out" / "deep"
    deep.mkdir(parents=True)
    dead = deep / ".x.bin.abcdefgh.gdscp-tmp"
    dead.write_bytes(b"killed run")
    code, _, err = cli(capsys, "copy", tmp_path / "a.bin", tmp_path / "out", "--clean", "--host")
    assert code == 0 and not dead.exists() and "removed 1 temporary file" in err
    assert (tmp_path / "out" / "a.bin").exists()


def test_read_of_many_files_reports_each(capsys, tmp_path):
    tree = make_file_tree(str(tmp_path / "t"), 150, 0, 30 * KiB, seed=8)
    code, doc, err = cli_json(capsys, "read", *tree.paths, "--host", "--verify")
    assert code == 0, err
    assert [f["bytes"] for f in doc["files"]] == tree.sizes and doc["bytes"] == tree.bytes
    # One read failing fails its file only.
    _core.testing.arm_fault("pread", 30, 1, errno.EIO)
    try:
        code, doc, err = cli_json(capsys, "read", *tree.paths, "--host", "--threads", "1")
    finally:
        _core.testing.disarm_fault()
    assert code == 1 and doc["ok"] is False
    failed = [f for f in doc["files"] if f["status"] == "failed"]
    assert len(failed) == 1 and "Input/output error" in failed[0]["error"]
    (line,) = error_lines(err)
    assert failed[0]["path"] in line
    for f, size in zip(doc["files"], tree.sizes):
        assert f["status"] == "failed" or f["bytes"] == size


def test_several_writes_name_each_file_that_fails(capsys, tmp_path, monkeypatch):
    """A write that fails is said with its FILE, never with the temporary file
    it was written to, removed by then."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").write_bytes(b"old")
    _core.testing.arm_fault("pwrite", 0, 1, errno.EIO)
    try:
        code, _, err = cli(capsys, "write", "--host", "--threads", "1", "a", "b", "--size", "2M")
    finally:
        _core.testing.disarm_fault()
    assert code == 1
    (line,) = error_lines(err)
    assert "Input/output error" in line
    assert ("'a'" in line or "'b'" in line) and ".gdscp-tmp" not in line, line
    assert (tmp_path / "a").read_bytes() in (b"old", bytes(2 * MiB))
    assert temp_files(tmp_path) == []


def test_a_write_that_fails_names_its_file(capsys, tmp_path, monkeypatch):
    """One FILE whose write fails part way (a full disk) is said with FILE, as
    several are, where the engine's error names only the temporary file that
    is then removed; the old FILE stays as it was."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").write_bytes(b"old")
    _core.testing.arm_fault("pwrite", 1, 1, errno.ENOSPC)
    try:
        code, doc, err = cli_json(capsys, "write", "--host", "a", "--size", "8M", "--chunk-size", "1M")
    finally:
        _core.testing.disarm_fault()
    assert code == 1 and doc["ok"] is False
    (line,) = error_lines(err)
    assert line == f"gdscp write: error: {doc['error']}"
    assert doc["error"].startswith("cannot write 'a': ") and "No space left on device" in doc["error"], doc
    assert (tmp_path / "a").read_bytes() == b"old"
    assert temp_files(tmp_path) == []


def test_a_write_whose_directory_refuses_a_temporary_file_says_so(capsys, tmp_path, monkeypatch):
    """FILE exists (and may be writable) but its directory refuses the
    temporary file it is written to first: the error says that, rather than
    that FILE itself cannot be created, and FILE stays as it was."""
    (tmp_path / "a").write_bytes(b"old")

    def refused(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    from gdscp.cli import write as write_command

    monkeypatch.setattr(write_command, "make_temp", refused)
    code, doc, err = cli_json(capsys, "write", "--host", tmp_path / "a", "--size", "4K")
    assert code == 1 and doc["ok"] is False
    (line,) = error_lines(err)
    assert line == f"gdscp write: error: {doc['error']}"
    assert doc["error"].startswith(f"cannot write '{tmp_path / 'a'}': ") and "temporary file" in doc["error"], doc
    assert "Permission denied" in doc["error"] and "cannot create" not in doc["error"], doc
    assert (tmp_path / "a").read_bytes() == b"old"


def test_a_write_whose_rename_is_refused_names_file_not_the_temporary_one(capsys, tmp_path, monkeypatch):
    """FILE complete under its temporary name, but the rename over FILE is
    refused (a sticky directory and FILE another user's): the error says
    FILE, not the temporary file, which is then gone; FILE stays as it was."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").write_bytes(b"old")
    from gdscp.cli import atomic as atomic_module

    def refused(src, dst, **dir_fds):  # (the rename goes through the directory's descriptor)
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), src, dst)

    monkeypatch.setattr(atomic_module.os, "replace", refused)
    code, doc, err = cli_json(capsys, "write", "--host", "a", "--size", "4K")
    monkeypatch.undo()
    assert code == 1 and doc["ok"] is False
    (line,) = error_lines(err)
    assert line == f"gdscp write: error: {doc['error']}"
    assert doc["error"] == "cannot rename the new file into place at 'a': Operation not permitted", doc
    assert (tmp_path / "a").read_bytes() == b"old"
    assert temp_files(tmp_path) == []


def _limit_file_size():
    # A write past the limit then fails with EFBIG instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * KiB, 256 * KiB))


def test_copy_hitting_a_file_size_limit_in_a_subprocess(tmp_path):
    data = random_file(tmp_path / "src.bin", MiB)
    small = random_file(tmp_path / "small.bin", 1000, seed=5)
    out = tmp_path / "out"
    out.mkdir()
    (out / "src.bin").write_bytes(b"precious")
    done = subprocess.run(
        [sys.executable, "-m", "gdscp", "copy", str(tmp_path / "src.bin"), str(tmp_path / "small.bin"), str(out),
         "--chunk-size", "64K", "--json", "--host"],
        capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size,
    )
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["copied"], doc["failed"]) == (1, 1)
    assert (out / "src.bin").read_bytes() == b"precious"
    assert (out / "small.bin").read_bytes() == small
    assert temp_files(tmp_path) == [] and len(data) == MiB


def test_copy_onto_a_symlink_writes_its_target(capsys, tmp_path):
    data = random_file(tmp_path / "src.bin", 3000)
    (tmp_path / "target.bin").write_bytes(b"old")
    os.symlink("target.bin", tmp_path / "link.bin")
    assert cli(capsys, "copy", tmp_path / "src.bin", tmp_path / "link.bin")[0] == 0
    assert (tmp_path / "link.bin").is_symlink() and (tmp_path / "target.bin").read_bytes() == data


def test_copy_into_an_unwritable_place(capsys, tmp_path):
    random_file(tmp_path / "src.bin", 100)
    code, _, err = cli(capsys, "copy", tmp_path / "src.bin", "/proc/gdscp-test.bin")
    assert code == 1
    (line,) = error_lines(err)
    assert "/proc/gdscp-test.bin" in line


# -- info ------------------------------------------------------------------------------


def test_info_json(capsys, tmp_path):
    random_file(tmp_path / "f.bin", 4096)
    code, doc, err = cli_json(capsys, "info", tmp_path, tmp_path / "f.bin")
    assert code == 0, err
    assert doc["command"] == "info" and doc["ok"] is True
    assert set(doc) >= {"gdscp", "cuda", "gpus", "cufile", "nvidia_fs", "cufile_json", "settings", "paths"}
    assert set(doc["cuda"]) >= {"available", "driver_version", "cuda_version", "library", "error"}
    assert set(doc["cufile"]) >= {"available", "version", "library", "error"}
    assert doc["settings"]["compat_mode"] in ("ON", "OFF", "AUTO")
    assert doc["cufile_json"]["path"]
    directory, file = doc["paths"]
    assert directory["kind"] == "directory" and file["kind"] == "file"
    for p in doc["paths"]:
        assert p["filesystem"] and p["mount_point"]
        assert p["o_direct"] in (True, False, None)
        assert p["backend"] in ("posix", "cufile") and p["backend_reason"]
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]  # the probes cleaned up
    if not memory.gpu_available():
        assert doc["gpus"] == [] and doc["paths"][0]["backend"] == "posix"


def test_info_json_has_the_documented_keys_and_types(capsys, tmp_path, monkeypatch):
    """Exactly the keys docs/info-json.md lists, each of its type; a PATH
    that cannot be checked is its own entry, and the document says ok false."""
    import gdscp

    random_file(tmp_path / "f.bin", 4096)
    code, doc, err = cli_json(capsys, "info", tmp_path / "f.bin", tmp_path / "missing", "/dev/null")
    assert code == 1
    assert error_lines(err) == [f"gdscp info: error: cannot check '{tmp_path / 'missing'}': No such file or directory"]
    assert list(doc) == ["command", "ok", "gdscp", "cuda", "gpus", "cufile", "nvidia_fs", "cufile_json", "settings",
                         "compat_mode_preferred", "paths"]
    assert (doc["command"], doc["ok"]) == ("info", False)
    assert set(doc["gdscp"]) == {"version", "python", "numpy", "cupy"} and doc["gdscp"]["version"] == gdscp.__version__
    assert set(doc["cuda"]) == {"available", "driver_version", "cuda_version", "library", "error"}
    for gpu in doc["gpus"]:
        assert set(gpu) == {"index", "name", "pci_bus_id", "total_memory"} and isinstance(gpu["total_memory"], int)
    assert set(doc["cufile"]) == {"available", "version", "version_code", "library", "error"}
    assert set(doc["nvidia_fs"]) == {"present", "version"}
    # and, where the machine's file sets them in its properties, three more keys
    optional = {"use_poll_mode", "max_direct_io_size_kb", "max_device_cache_size_kb"}
    assert set(doc["cufile_json"]) - optional == {"path", "source", "exists", "allow_compat_mode", "error"}
    assert doc["settings"] == json.loads(json.dumps(gdscp.defaults.current()))
    assert isinstance(doc["compat_mode_preferred"], bool)
    checked, missing, null = doc["paths"]
    keys = ["path", "kind", "filesystem", "mount_point", "source", "o_direct", "o_direct_reason", "backend",
            "backend_reason"]
    assert list(checked) == keys and list(null) == keys
    assert (checked["path"], checked["kind"]) == (str(tmp_path / "f.bin"), "file")
    assert checked["o_direct"] in (True, False, None) and checked["backend"] in ("posix", "cufile", None)
    assert missing == {"path": str(tmp_path / "missing"), "error": "No such file or directory"}
    why = "not probed: a character device is read and written front to back"
    assert (null["kind"], null["o_direct"], null["o_direct_reason"], null["backend"], null["backend_reason"]) == (
        "character device", None, why, "posix", why)
    code, doc, err = cli_json(capsys, "info", "--compat-mode", "bogus")
    assert code == 2 and list(doc) == ["command", "ok", "error", "exit_code"] and doc["exit_code"] == 2
    # The cufile.json entry of a file of this test's own (read by gdscp alone:
    # no libcufile of this process is pointed at it), and of none.
    from gdscp.info import cufile_json

    path = tmp_path / "cufile.json"
    path.write_text('{ // comments, as libcufile allows\n "properties": {"allow_compat_mode": true, '
                    '"use_poll_mode": false, "max_direct_io_size_kb": 16384}}')
    monkeypatch.setenv("CUFILE_ENV_PATH_JSON", str(path))
    assert cufile_json() == {"path": str(path), "source": "CUFILE_ENV_PATH_JSON", "exists": True,
                             "allow_compat_mode": True, "error": None, "use_poll_mode": False,
                             "max_direct_io_size_kb": 16384}
    monkeypatch.setenv("CUFILE_ENV_PATH_JSON", str(tmp_path / "none.json"))
    assert cufile_json() == {"path": str(tmp_path / "none.json"), "source": "CUFILE_ENV_PATH_JSON",
                             "exists": False, "allow_compat_mode": None, "error": None}


def test_info_says_a_directory_without_room_for_a_test_file_was_not_tested(capsys):
    """O_DIRECT and the backend of a directory are found with a test file
    made in it: where none can be made (procfs takes no new files), the
    answer is unknown, and the reason says so, not the bare error of the
    attempt as if it were the filesystem's answer."""
    code, doc, err = cli_json(capsys, "info", "/proc")
    assert code == 0, err
    (p,) = doc["paths"]
    why = "not tested: no test file could be created in the directory: No such file or directory"
    assert (p["kind"], p["filesystem"]) == ("directory", "proc")
    assert (p["o_direct"], p["o_direct_reason"]) == (None, why)
    assert (p["backend"], p["backend_reason"]) == (None, why)
    code, out, _ = cli(capsys, "info", "/proc")
    assert code == 0 and f"unknown ({why})" in " ".join(out.split())


def test_info_table_and_missing_path(capsys, tmp_path):
    code, out, err = cli(capsys, "info", tmp_path, tmp_path / "missing")
    assert code == 1
    assert "libcufile" in out and "compat mode" in out and "nvidia-fs" in out
    (line,) = error_lines(err)
    assert "missing" in line


def test_info_compat_mode_option(capsys):
    code, doc, _ = cli_json(capsys, "info", "--compat-mode", "on")
    assert code == 0 and doc["settings"]["compat_mode"] == "ON" and doc["compat_mode_preferred"] is True


def test_info_reads_cufile_json_from_the_environment(capsys, tmp_path, monkeypatch):
    config = tmp_path / "cufile.json"
    config.write_text('{\n  // comment\n  "properties": { "allow_compat_mode": false, // why\n'
                      '    "use_poll_mode": true }\n}\n')
    monkeypatch.setenv("CUFILE_ENV_PATH_JSON", str(config))
    code, doc, _ = cli_json(capsys, "info")
    assert code == 0
    cj = doc["cufile_json"]
    assert cj["path"] == str(config) and cj["source"] == "CUFILE_ENV_PATH_JSON" and cj["exists"] is True
    assert cj["allow_compat_mode"] is False and cj["use_poll_mode"] is True and cj["error"] is None


def test_mount_of_root():
    from gdscp.info import mount_of

    found = mount_of("/")
    assert found["mount_point"] == "/" and found["filesystem"]


# -- GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "seq"])
@pytest.mark.parametrize("offset", [0, 5, 8 * MiB + 3])
def test_gpu_fill_matches_host(kind, offset):
    buf = memory.allocate(MiB + 11, device=0)
    memory.fill(buf, kind, seed=42, offset=offset)
    assert memory.to_host(buf).tobytes() == memory.pattern(MiB + 11, kind, seed=42, offset=offset).tobytes()


@pytest.mark.gpu
def test_gpu_write_read_copy(capsys, tmp_path):
    size = 5 * MiB + 3
    path = tmp_path / "g.bin"
    code, doc, err = cli_json(capsys, "write", path, "--size", size, "--pattern", "random", "--seed", "9",
                              "--device", "0", "--chunk-size", "1M", "--verify")
    assert code == 0, err
    assert doc["memory"] == "gpu" and doc["device"] == 0 and doc["backend"] in ("posix", "cufile")
    expected = memory.pattern(size, "random", seed=9).tobytes()
    assert path.read_bytes() == expected

    code, doc, err = cli_json(capsys, "read", path, "--verify", "--chunk-size", "1M", "--offset", "3",
                              "--length", "4M")
    assert code == 0, err
    assert "using host memory" not in err
    assert doc["memory"] == "gpu" and doc["files"][0]["bytes"] == 4 * MiB

    code, doc, err = cli_json(capsys, "copy", path, tmp_path / "copy.bin", "--device", "0",
                              "--chunk-size", "1M", "--verify")
    assert code == 0, err
    assert doc["memory"] == "gpu" and doc["copied"] == 1
    assert (tmp_path / "copy.bin").read_bytes() == expected


def test_a_chunk_size_past_the_files_takes_no_more_gpu_memory_than_they_need(go):
    go(scenario_chunk_size_past_the_files)


def scenario_chunk_size_past_the_files(folder):
    """--chunk-size larger than any file of the job: the GPU staging is one
    chunk per worker, allocated before the job starts, and no chunk needs
    more than the largest file. "--chunk-size 1T" for a 3MiB file is
    copied and read through a few MiB of GPU memory (it asked the GPU for
    4TiB, and failed, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY")."""
    import contextlib

    without_cupy()
    data = np.random.default_rng(5).integers(0, 256, 3 * MiB + 5, dtype=np.uint8).tobytes()
    src = new_file(folder, "src.bin", data)
    dst = os.path.join(folder, "dst.bin")

    def cli_doc(*args: str) -> dict:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run([*args, "--json"])
        assert code == 0, err.getvalue()
        return json.loads(out.getvalue())

    with settings(num_threads=4):
        doc = cli_doc("copy", src, dst, "--device", "0", "--chunk-size", "1T")
        assert doc["copied"] == 1 and doc["memory"] == "gpu" and file_bytes(dst) == data
        doc = cli_doc("read", src, "--device", "0", "--chunk-size", "1T", "--verify")
        assert doc["bytes"] == len(data) and doc["files"][0]["verified"]
    allocated = [c.size for c in standin.cuda.calls("cuMemAlloc")]
    assert allocated and max(allocated) <= 4 * len(data), allocated


def test_a_chunk_size_whose_staging_does_not_fit_on_the_gpu_is_refused_naming_it(go):
    go(scenario_chunk_size_past_the_gpu)


def scenario_chunk_size_past_the_gpu(folder):
    """Chunks that the GPU cannot hold (600MiB for each of 32 workers; the
    stand-in's GPU says it has 16GiB free): exit 2 and one line naming
    --chunk-size and what it needs, before any GPU memory is taken or
    anything written. (A real GPU's own refusal said only "CUDA error:
    cuMemAlloc (20132659200 bytes on GPU 0): CUDA_ERROR_OUT_OF_MEMORY",
    naming neither; the stand-in's memory is the host's, and took it.)
    A chunk that fits is taken."""
    import contextlib

    without_cupy()
    src = os.path.join(folder, "sparse.bin")
    with open(src, "wb") as f:
        f.truncate(600 * MiB)  # a hole: its size is all that counts here
    dst = os.path.join(folder, "dst.bin")

    def cli_err(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run(list(args))
        return code, out.getvalue(), err.getvalue()

    said = ("error: --chunk-size: a chunk of 600.00 MiB for each of 32 workers needs 18.75 GiB of GPU 0's memory; "
            "16.00 GiB is free")
    with settings(num_threads=32):
        for command, args in (("copy", (src, dst)), ("read", (src,))):
            code, out, err = cli_err(command, *args, "--device", "0", "--chunk-size", "1G")
            assert code == 2 and out == "", err
            assert err.splitlines() == [f"gdscp {command}: {said}"], err
        assert not os.path.exists(dst) and os.listdir(folder) == ["sparse.bin"]
        assert standin.cuda.calls("cuMemAlloc") == []
        code, _, err = cli_err("read", src, "--device", "0", "--chunk-size", "1G", "--length", "1M", "-q")
        assert code == 0, err


@pytest.mark.gpu
def test_gpu_copy_tree_and_failure(capsys, tmp_path):
    make_tree(tmp_path / "src")
    code, _, err = cli(capsys, "copy", "-r", tmp_path / "src", tmp_path / "dst", "--device", "0", "--chunk-size", "8K")
    assert code == 0, err
    assert tree(tmp_path / "dst") == tree(tmp_path / "src")
    keep = tmp_path / "dst" / "top.bin"
    keep.write_bytes(b"precious")
    _core.testing.arm_fault("pwrite", 2, 1, errno.EIO)
    try:
        # compat mode on: the POSIX path, where the engine's fault hook sits. Two
        # threads of 8 KiB chunks stage 16 KiB at a time, so the 70,000 bytes
        # take more than three pwrites whatever the machine's thread count
        # (with 16 threads the whole file is one or two).
        code, _, _ = cli(capsys, "copy", tmp_path / "src" / "top.bin", keep, "--device", "0", "--chunk-size", "8K",
                         "--threads", "2", "--compat-mode", "on")
    finally:
        _core.testing.disarm_fault()
    assert code == 1 and keep.read_bytes() == b"precious" and temp_files(tmp_path) == []


@pytest.mark.gpu
def test_gpu_unknown_device_is_a_usage_error(capsys, tmp_path):
    random_file(tmp_path / "a.bin", 100)
    code, _, err = cli(capsys, "read", tmp_path / "a.bin", "--device", str(memory.device_count()))
    assert code == 2 and "does not exist" in error_lines(err)[0]



# -- long names, links and unusual option values ------------------------------------------

def test_names_up_to_the_longest_a_directory_takes(capsys, tmp_path):
    """A file name of 255 bytes (the most ext4, XFS and tmpfs take) is copied
    and written like any other: the temporary name beside it is shortened."""
    (tmp_path / "out").mkdir()
    for length in (235, 236, 255):
        name = "y" * length
        data = random_file(tmp_path / name, 5000, seed=length)
        code, _, err = cli(capsys, "copy", "--host", "-q", tmp_path / name, tmp_path / "out")
        assert code == 0, err
        assert (tmp_path / "out" / name).read_bytes() == data
        code, _, err = cli(capsys, "write", "--host", "-q", tmp_path / "out" / name, "--size", "4K")
        assert code == 0, err
        assert (tmp_path / "out" / name).stat().st_size == 4096
    code, _, err = cli(capsys, "copy", "--host", "-q", "-r", tmp_path / "out", tmp_path / "again")
    assert code == 0, err
    assert temp_files(tmp_path) == []


def _directory_of_length(root: Path, length: int) -> Path:
    """A new directory under ``root`` whose path is ``length`` bytes long."""
    path = str(root)
    while len(path) < length:
        path += "/" + "d" * min(200, length - len(path) - 1)
    os.makedirs(path)
    assert len(path) == length
    return Path(path)


def test_paths_up_to_the_longest_the_system_takes(capsys, tmp_path):
    """A destination whose path is PATH_MAX - 1 bytes (the longest a system
    call takes), under a long name, is copied, replaced and written like any
    other: its temporary name is cut to fit the path too, and is still one
    that a later run's cleaning recognises."""
    name = "z" * 250
    folder = _directory_of_length(tmp_path / "deep", os.pathconf("/", "PC_PATH_MAX") - 1 - 1 - len(name))
    dst = folder / name
    assert len(os.fsencode(dst)) == os.pathconf("/", "PC_PATH_MAX") - 1
    for size, seed in ((3 * MiB, 1), (3 * MiB, 2), (5000, 3), (5000, 4)):  # named temporaries, then unnamed
        data = random_file(tmp_path / "src", size, seed=seed)
        code, _, err = cli(capsys, "copy", "--host", "-q", tmp_path / "src", dst)
        assert code == 0, err
        assert dst.read_bytes() == data
    code, _, err = cli(capsys, "write", "--host", "-q", dst, "--size", "2MiB", "--pattern", "random", "--seed", "5", "--verify")
    assert code == 0, err
    assert dst.read_bytes() == memory.pattern(2 * MiB, "random", 5).tobytes()
    tmp = _core.temporary_name(str(dst))
    assert len(os.fsencode(tmp)) <= len(os.fsencode(dst)) and os.path.dirname(tmp) == str(folder)
    assert _core.is_temporary_name(os.path.basename(tmp))
    assert os.listdir(folder) == [name]


def test_a_short_name_at_the_longest_path_is_copied_through_its_directory(capsys, tmp_path):
    """A destination of a short name whose path is PATH_MAX - 1 bytes leaves
    no room for a temporary path beside it, even with no NAME: copies reach
    the temporary file through a descriptor of the directory, new and over
    an existing file, large and small, and leave nothing behind (nor a
    descriptor open). gdscp write of one such FILE says it cannot."""
    path_max = os.pathconf("/", "PC_PATH_MAX")
    folder = _directory_of_length(tmp_path / "deep", path_max - 1 - 2)
    dst = folder / "x"
    assert len(os.fsencode(dst)) == path_max - 1
    before = len(os.listdir("/proc/self/fd"))
    for size, seed in ((3 * MiB, 1), (3 * MiB, 2), (5000, 3), (5000, 4), (3 * MiB, 5)):
        data = random_file(tmp_path / "src", size, seed=seed)
        code, _, err = cli(capsys, "copy", "--host", "-q", tmp_path / "src", dst)
        assert code == 0, err
        assert dst.read_bytes() == data
        assert os.listdir(folder) == ["x"]
    assert len(os.listdir("/proc/self/fd")) == before
    code, _, err = cli(capsys, "write", "--host", "-q", dst, "--size", "1K")
    (line,) = error_lines(err)
    assert code == 1 and "File name too long" in line
    assert dst.read_bytes() == data and os.listdir(folder) == ["x"]


def test_no_file_is_made_under_a_temporary_files_name(capsys, tmp_path):
    """A source named like a gdscp temporary file (left by a dead run) is not
    copied under that name, nor written: the next run into the directory
    would remove it. The rest of the tree is copied."""
    src = tmp_path / "src"
    src.mkdir()
    (src / ".a.12345678.gdscp-tmp").write_bytes(b"leftover")
    (src / "real").write_bytes(b"data")
    code, _, err = cli(capsys, "copy", "-r", "--host", "-q", src, tmp_path / "dst")
    assert code == 1 and "name is that of a gdscp temporary file" in err
    assert sorted(os.listdir(tmp_path / "dst")) == ["real"]
    code, _, err = cli(capsys, "write", "--host", "-q", tmp_path / ".b.abcdefgh.gdscp-tmp", "--size", "1")
    assert code == 1 and "name is that of a gdscp temporary file" in err
    assert not (tmp_path / ".b.abcdefgh.gdscp-tmp").exists()


def test_no_symbolic_link_is_made_under_a_temporary_files_name(capsys, tmp_path):
    """As for a file: a link in a tree named like a gdscp temporary file is not
    copied under that name (the next run into the directory would remove it
    as a dead run's); the rest of the tree is copied."""
    src = tmp_path / "src"
    src.mkdir()
    os.symlink("real", src / ".a.12345678.gdscp-tmp")
    (src / "real").write_bytes(b"data")
    code, _, err = cli(capsys, "copy", "-r", "--host", "-q", src, tmp_path / "dst")
    assert code == 1 and "name is that of a gdscp temporary file" in err
    assert sorted(os.listdir(tmp_path / "dst")) == ["real"]
    assert (tmp_path / "dst" / "real").read_bytes() == b"data"


def test_write_goes_through_a_symbolic_link(capsys, tmp_path):
    """As copy and dd: the link stays, its target gets the bytes; a dangling
    link is refused and left as it was."""
    (tmp_path / "target").write_bytes(b"old")
    os.symlink("target", tmp_path / "link")
    os.symlink("missing", tmp_path / "dangling")
    code, _, err = cli(capsys, "write", "--host", "-q", tmp_path / "link", "--size", "1K")
    assert code == 0, err
    assert os.path.islink(tmp_path / "link") and (tmp_path / "target").stat().st_size == 1024
    code, _, err = cli(capsys, "write", "--host", "-q", tmp_path / "dangling", "--size", "1K")
    assert code == 1 and "dangling symbolic link" in err
    assert os.readlink(tmp_path / "dangling") == "missing" and not (tmp_path / "missing").exists()
    assert temp_files(tmp_path) == []


def test_single_write_removes_dead_runs_temporaries(capsys, tmp_path):
    """As every bulk job does for the directories it writes into."""
    import fcntl

    dead = tmp_path / ".old.abcdefgh.gdscp-tmp"
    dead.write_bytes(b"partial")
    live = tmp_path / ".busy.abcdefgh.gdscp-tmp"
    live.write_bytes(b"being written")
    fd = os.open(live, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live writer's lock
    try:
        code, _, err = cli(capsys, "write", "--host", "-q", tmp_path / "new.bin", "--size", "1K")
        assert code == 0, err
        assert not dead.exists() and live.exists()
    finally:
        os.close(fd)


def test_single_write_counts_the_space_a_dead_run_held_as_free(capsys, tmp_path, monkeypatch):
    """A dead run's temporary file holding the space a write needs is removed
    before the space is counted, so the write goes ahead (as copy and a
    write of several files do); a live writer's is kept, and its space is
    not counted as free."""
    import fcntl

    from gdscp.cli import special

    def statvfs(path):  # a 4 MiB filesystem holding the files of tmp_path
        held = sum(-(-p.stat().st_size // 4096) for p in tmp_path.iterdir() if p.is_file())
        return os.statvfs_result((4096, 4096, 1024, 1024 - held, 1024 - held, 0, 0, 0, 0, 255))

    monkeypatch.setattr(special.os, "statvfs", statvfs)
    live = tmp_path / ".busy.abcdefgh.gdscp-tmp"
    live.write_bytes(b"L" * (3 * MiB))
    fd = os.open(live, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live writer's lock
    try:
        code, doc, err = cli_json(capsys, "write", "--host", tmp_path / "new.bin", "--size", "2M")
        assert code == 1 and doc["error"].startswith("not enough space for "), doc
        assert live.read_bytes() == b"L" * (3 * MiB) and not (tmp_path / "new.bin").exists()
    finally:
        os.close(fd)
    dead = tmp_path / ".old.abcdefgh.gdscp-tmp"
    live.rename(dead)  # its writer gone, its lock with it
    code, doc, err = cli_json(capsys, "write", "--host", tmp_path / "new.bin", "--size", "2M", "--pattern", "seq")
    monkeypatch.undo()
    assert code == 0, err
    assert not dead.exists() and temp_files(tmp_path) == []
    assert (tmp_path / "new.bin").read_bytes() == memory.pattern(2 * MiB, "seq").tobytes()


def test_fail_fast_stops_at_a_source_that_fails_before_the_copy(capsys, tmp_path):
    for name in ("s1", "s3"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "o").mkdir()
    code, data, err = cli_json(capsys, "copy", "--host", "--fail-fast", tmp_path / "missing", tmp_path / "s1",
                               tmp_path / "s3", tmp_path / "o")
    assert code == 1 and "cannot stat" in err
    assert os.listdir(tmp_path / "o") == []
    assert (data["copied"], data["failed"]) == (0, 3)


def test_a_destination_made_twice_is_made_once(capsys, tmp_path):
    """As cp: the first source makes it, the second is not written over it."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x").write_bytes(d.encode())
    (tmp_path / "o").mkdir()
    code, _, err = cli(capsys, "copy", "--host", "-q", tmp_path / "a" / "x", tmp_path / "b" / "x", tmp_path / "o")
    assert code == 1 and "will not overwrite just-created" in err and "Error" not in err
    assert (tmp_path / "o" / "x").read_bytes() == b"a"


def test_a_source_named_twice_is_copied_once_with_a_warning(capsys, tmp_path):
    """As cp: the same file (or tree, with -r) named twice for the same
    destination is a warning, not a failure: copied once, exit status 0."""
    data = random_file(tmp_path / "a", 1000)
    make_tree(tmp_path / "t")
    (tmp_path / "o").mkdir()
    code, doc, err = cli_json(capsys, "copy", "--host", "-r", tmp_path / "a", tmp_path / "a",
                              str(tmp_path / "t" / ".." / "a"), tmp_path / "t", str(tmp_path / "t") + "/",
                              tmp_path / "o")
    assert code == 0, err
    assert doc["ok"] is True and doc["failed"] == 0
    assert err.splitlines() == [
        f"gdscp copy: warning: source file '{tmp_path / 'a'}' specified more than once",
        f"gdscp copy: warning: source file '{tmp_path / 't' / '..' / 'a'}' specified more than once",
        f"gdscp copy: warning: source directory '{tmp_path / 't'}/' specified more than once",
    ]
    assert (tmp_path / "o" / "a").read_bytes() == data
    assert tree(tmp_path / "o" / "t") == tree(tmp_path / "t")


def test_a_destination_reached_through_a_link_in_the_tree_is_made_once(capsys, tmp_path):
    """A tree copied into one that has a symbolic link where the source has
    a file: the copy goes through the link (as cp's), onto where another
    file of the tree lands. The two would be copied at once and one lost;
    the later one fails instead, naming both, and the rest is copied."""
    (tmp_path / "s").mkdir()
    for name in ("x", "y", "z"):
        (tmp_path / "s" / name).write_bytes(name.encode())
    (tmp_path / "d" / "s").mkdir(parents=True)
    (tmp_path / "d" / "s" / "x").write_bytes(b"old")
    (tmp_path / "d" / "s" / "y").symlink_to("x")
    code, doc, err = cli_json(capsys, "copy", "--host", "-r", tmp_path / "s", tmp_path / "d")
    assert code == 1 and (doc["copied"], doc["failed"]) == (2, 1), err
    expected = (f"will not overwrite just-created '{tmp_path}/d/s/x' with '{tmp_path}/s/y' "
                f"through '{tmp_path}/d/s/y'")
    assert [f["error"] for f in doc["files"] if f["status"] == "failed"] == [expected]
    assert (tmp_path / "d" / "s" / "x").read_bytes() == b"x" and (tmp_path / "d" / "s" / "z").read_bytes() == b"z"
    assert os.readlink(tmp_path / "d" / "s" / "y") == "x"
    assert temp_files(tmp_path) == []

    code, _, err = cli(capsys, "write", "--host", tmp_path / "d" / "s" / "x", tmp_path / "d" / "s" / "y",
                       "--size", "1K")
    assert code == 2 and f"'{tmp_path}/d/s/x' and '{tmp_path}/d/s/y' name the same file" in err, err
    assert (tmp_path / "d" / "s" / "x").read_bytes() == b"x"


def test_a_source_that_the_same_copy_replaces_is_not_copied(capsys, tmp_path):
    """A file whose source another file of the command replaces (a tree
    copied over a directory that is also a source, a symbolic link to a
    destination) would be read before or after the replacement took its
    name, as the job's timing had it. It fails, naming what replaces it, and
    so does the file that would replace it: the source stays as it was.
    The rest is copied."""
    (tmp_path / "s" / "sub").mkdir(parents=True)
    (tmp_path / "s" / "sub" / "f").write_bytes(b"new")
    (tmp_path / "s" / "g").write_bytes(b"g")
    (tmp_path / "d" / "s" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "s" / "sub" / "f").write_bytes(b"old")
    code, doc, err = cli_json(capsys, "copy", "--host", "-r", tmp_path / "s", tmp_path / "d" / "s" / "sub",
                              tmp_path / "d")
    expected = [f"will not copy '{tmp_path}/d/s/sub/f': this copy replaces it with '{tmp_path}/s/sub/f'",
                f"will not copy '{tmp_path}/s/sub/f' to '{tmp_path}/d/s/sub/f': it would replace "
                f"'{tmp_path}/d/s/sub/f', which this copy reads"]
    assert code == 1 and (doc["copied"], doc["failed"]) == (1, 2), err
    assert [f["error"] for f in doc["files"] if f["status"] == "failed"] == expected
    assert (tmp_path / "d" / "s" / "sub" / "f").read_bytes() == b"old"
    assert (tmp_path / "d" / "s" / "g").read_bytes() == b"g"
    assert not (tmp_path / "d" / "sub" / "f").exists()

    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "link").symlink_to(tmp_path / "d" / "a")
    (tmp_path / "d" / "a").write_bytes(b"old")
    code, _, err = cli(capsys, "copy", "--host", "-q", tmp_path / "a", tmp_path / "link", tmp_path / "d")
    assert code == 1 and error_lines(err) == [
        f"gdscp copy: error: will not copy '{tmp_path}/link': this copy replaces it with '{tmp_path}/a'",
        f"gdscp copy: error: will not copy '{tmp_path}/a' to '{tmp_path}/d/a': it would replace '{tmp_path}/link', "
        "which this copy reads"], err
    assert (tmp_path / "d" / "a").read_bytes() == b"old" and not (tmp_path / "d" / "link").exists()
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("recursive", [(), ("-r",)])
def test_a_copy_through_a_link_onto_another_source_keeps_that_source(capsys, tmp_path, monkeypatch, recursive):
    """``copy a b c d`` where d/b is a symbolic link to a: b's copy would go
    through the link over a, which the same command copies to d/a. Neither
    is copied (both said, each naming the other), so a keeps its bytes; c,
    which has nothing to do with them, is copied."""
    (tmp_path / "a").write_bytes(b"AAAA\n")
    (tmp_path / "b").write_bytes(b"BBBB\n")
    (tmp_path / "c").write_bytes(b"CCCC\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").symlink_to("../a")
    monkeypatch.chdir(tmp_path)
    code, doc, err = cli_json(capsys, "copy", "--host", *recursive, "a", "b", "c", "d")
    assert code == 1 and doc["ok"] is False and (doc["copied"], doc["failed"]) == (1, 2), err
    failed = {"source": "a", "destination": "d/a", "bytes": 0, "status": "failed",
              "error": "will not copy 'a': this copy replaces it with 'b'"}, \
             {"source": "b", "destination": "d/b", "bytes": 0, "status": "failed",
              "error": "will not copy 'b' to 'd/b': it would replace 'a', which this copy reads"}
    assert [{k: f[k] for k in failed[0]} for f in doc["files"] if f["status"] == "failed"] == list(failed)
    assert [(f["source"], f["destination"], f["bytes"]) for f in doc["files"] if f["status"] == "copied"] == [
        ("c", "d/c", 5)]
    assert error_lines(err) == [f"gdscp copy: error: {f['error']}" for f in failed]
    assert (tmp_path / "a").read_bytes() == b"AAAA\n" and (tmp_path / "b").read_bytes() == b"BBBB\n"
    assert (tmp_path / "d" / "c").read_bytes() == b"CCCC\n"
    assert sorted(os.listdir(tmp_path / "d")) == ["b", "c"] and os.readlink(tmp_path / "d" / "b") == "../a"
    assert temp_files(tmp_path) == []


def test_a_link_that_the_same_tree_copy_puts_over_a_source_file_copies_neither(capsys, tmp_path, monkeypatch):
    """``copy -r s d/s/x d`` where s/x is a symbolic link and d/s/x a file:
    the link would replace d/s/x before the file is read (links are made
    first), and its bytes would be lost (cp -r replaces it and copies the
    link it finds). Neither is copied, each naming the other; the rest is."""
    monkeypatch.chdir(tmp_path)
    Path("s").mkdir()
    os.symlink("new", "s/x")
    Path("s/y").write_bytes(b"y")
    Path("d/s").mkdir(parents=True)
    Path("d/s/x").write_bytes(b"precious")
    code, doc, err = cli_json(capsys, "copy", "--host", "-r", "s", "d/s/x", "d")
    assert code == 1 and (doc["copied"], doc["failed"]) == (1, 2), err
    failed = [{"source": "d/s/x", "destination": "d/x", "bytes": 0, "status": "failed",
               "error": "will not copy 'd/s/x': this copy replaces it with 's/x'"},
              {"source": "s/x", "destination": "d/s/x", "bytes": 0, "status": "failed",
               "error": "will not copy 's/x' to 'd/s/x': it would replace 'd/s/x', which this copy reads"}]
    assert [{k: f[k] for k in failed[0]} for f in doc["files"] if f["status"] == "failed"] == failed
    assert error_lines(err) == [f"gdscp copy: error: {f['error']}" for f in failed]
    assert Path("d/s/x").read_bytes() == b"precious" and Path("d/s/y").read_bytes() == b"y"
    assert sorted(os.listdir("d")) == ["s"] and temp_files(tmp_path) == []


@pytest.mark.parametrize("order, refused", [(("s", "d/s/x"), True), (("d/s/x", "s"), False)])
def test_a_link_that_the_same_tree_copy_puts_over_a_source_link(capsys, tmp_path, monkeypatch, order, refused):
    """``copy -r s d/s/x d`` where s/x and d/s/x are symbolic links: made in
    that order, s/x's link would replace d/s/x before d/s/x is read, and
    where d/s/x pointed would be lost (as cp -r loses it): neither is copied.
    In the other order d/s/x is copied first, as it was, then replaced:
    both are copied."""
    monkeypatch.chdir(tmp_path)
    Path("s").mkdir()
    os.symlink("new", "s/x")
    Path("d/s").mkdir(parents=True)
    os.symlink("old", "d/s/x")
    code, doc, err = cli_json(capsys, "copy", "--host", "-r", *order, "d")
    if refused:
        assert code == 1 and (doc["copied"], doc["failed"]) == (0, 2), err
        assert error_lines(err) == [
            "gdscp copy: error: will not copy 'd/s/x': this copy replaces it with 's/x'",
            "gdscp copy: error: will not copy 's/x' to 'd/s/x': it would replace 'd/s/x', which this copy reads"]
        assert os.readlink("d/s/x") == "old" and not os.path.lexists("d/x")
    else:
        assert code == 0 and (doc["copied"], doc["failed"]) == (2, 0), err
        assert os.readlink("d/x") == "old" and os.readlink("d/s/x") == "new"


@pytest.mark.parametrize(
    "args",
    [
        ("--threads", "99999999999999999999"),
        ("--threads", "5000"),
        ("--task-size", "99999999999999999999999G"),
        ("--chunk-size", "99999999999999999999999G"),
        ("--chunk-size", "0"),
    ],
)
def test_option_values_out_of_range_are_usage_errors(capsys, tmp_path, args):
    """Exit 2 and one line naming the option, before any file is looked at."""
    code, out, err = cli(capsys, "copy", "--host", tmp_path / "missing", tmp_path / "dst", *args)
    assert code == 2, err
    assert args[0] in err and "Traceback" not in err and "Error:" not in err
    assert out == "" and not (tmp_path / "dst").exists()


@pytest.mark.parametrize("args", [("copy", "a", "b", "--chunk-size"), ("read", "a", "--offset"), ("write", "a", "-s"),
                                  ("info", "--json", "a", "--compat-mode"), ("benchmark", "--json", "--mode")])
def test_an_option_without_its_value_names_the_command(capsys, args):
    """An option whose value is missing at the end of the line is said as
    the command's own usage error, pointing to the command's help (the
    option is not in gdscp's); with --json, its document names the command."""
    command, option = args[0], args[-1]
    code, out, err = cli(capsys, *args)
    assert code == 2, err
    message = f"Option '{option}' requires an argument."
    assert error_lines(err) == [f"gdscp {command}: error: {message} (see 'gdscp {command} --help')"], err
    if "--json" in args:
        assert json.loads(out) == {"command": command, "ok": False, "error": message, "exit_code": 2}
    else:
        assert out == ""


@pytest.mark.parametrize("command", ["copy", "read", "write"])
def test_a_chunk_size_below_a_page_is_refused_naming_the_minimum(capsys, tmp_path, command):
    """A chunk of a few bytes costs a system call per few bytes (a 10MiB
    write took most of a minute at --chunk-size 1), most likely a slip for
    a larger size: exit 2, one line naming the option and its minimum, and
    nothing written. A page is taken."""
    data = random_file(tmp_path / "src.bin", 3 * 4096 + 5)
    args = {"copy": [tmp_path / "src.bin", tmp_path / "dst.bin"], "read": [tmp_path / "src.bin"],
            "write": [tmp_path / "dst.bin", "--size", "12K"]}[command]
    for size in ("1", "4095", "3.5K"):
        code, out, err = cli(capsys, command, "--host", *args, "--chunk-size", size)
        assert code == 2 and out == "", err
        assert error_lines(err) == [f"gdscp {command}: error: Invalid value for '--chunk-size': '{size}' is below "
                                    f"the minimum of 4096 bytes (see 'gdscp {command} --help')"], err
        assert not (tmp_path / "dst.bin").exists()
    code, doc, err = cli_json(capsys, command, "--host", *args, "--chunk-size", "4K")
    assert code == 0 and doc["bytes"] == (12 * 1024 if command == "write" else len(data)), err
    if command == "copy":
        assert (tmp_path / "dst.bin").read_bytes() == data


@pytest.mark.parametrize("stdout", ["closed", "full", "gone"])
def test_a_result_that_cannot_be_written_is_a_failure(tmp_path, stdout):
    """Stdout closed, on a full disk, or a reader that left (| head): exit 1
    and a line on stderr saying so, no traceback."""
    names = []
    for i in range(3000 if stdout == "gone" else 1):
        names.append(tmp_path / f"f{i:04d}")
        names[-1].write_bytes(b"x")
    argv = [sys.executable, "-m", "gdscp", "read", "--host", "--json", *map(str, names)]
    if stdout == "closed":
        proc = subprocess.run(argv, stderr=subprocess.PIPE, text=True, timeout=120, pass_fds=(),
                              preexec_fn=lambda: os.close(1))
        err = proc.stderr
    elif stdout == "full":
        with open("/dev/full", "w") as full:
            proc = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
        err = proc.stderr
    else:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.read(10)
        proc.stdout.close()
        err = proc.stderr.read()
        proc.wait(120)
    assert proc.returncode == 1, err
    assert "cannot write the result" in err and "Traceback" not in err and "Exception ignored" not in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_stderr_that_cannot_be_written_loses_only_its_lines(tmp_path):
    """With stderr on a full device, warnings and errors are lost, not the
    command: the file is written, and the JSON result (success or failure)
    still reaches stdout with the command's own exit status."""
    out = tmp_path / "w.bin"
    with open("/dev/full", "w") as full:
        ok = subprocess.run([sys.executable, "-m", "gdscp", "write", str(out), "--size", "1M", "--host", "--json"],
                            stdout=subprocess.PIPE, stderr=full, text=True, timeout=60)
        bad = subprocess.run([sys.executable, "-m", "gdscp", "read", str(tmp_path / "missing"), "--json"],
                             stdout=subprocess.PIPE, stderr=full, text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["bytes"] == MiB
    assert out.read_bytes() == bytes(MiB)
    doc = json.loads(bad.stdout)
    assert bad.returncode == 1 and doc["ok"] is False and "missing" in doc["error"]


def test_read_goes_on_past_a_file_it_cannot_read(capsys, tmp_path):
    """With several FILEs, one that cannot be read (missing, or too short for
    the range) is a failed file in the result, in its place, and the others
    are read; exit status 1."""
    random_file(tmp_path / "a.bin", 300_000)
    random_file(tmp_path / "c.bin", 200_000)
    (tmp_path / "short.bin").write_bytes(b"x" * 10)
    names = [tmp_path / "a.bin", tmp_path / "missing", tmp_path / "short.bin", tmp_path / "c.bin"]
    code, doc, err = cli_json(capsys, "read", *names, "--host", "--length", "100000")
    assert code == 1 and doc["ok"] is False
    assert [(f["path"], f["status"], f["bytes"]) for f in doc["files"]] == [
        (str(names[0]), "done", 100_000), (str(names[1]), "failed", 0), (str(names[2]), "failed", 0),
        (str(names[3]), "done", 100_000)]
    assert "missing" in doc["files"][1]["error"] and "short.bin" in doc["files"][2]["error"]
    assert doc["bytes"] == 200_000
    assert len(error_lines(err)) == 2


@pytest.mark.parametrize("args, env", [
    (["read", "x.bin", "--offset", "-1", "--json"], {}),
    (["read", "--json"], {}),
    (["copy", "--json", "only-one"], {}),
    (["read", "x.bin", "--json"], {"GDSCP_TASK_SIZE": "lots"}),
])
def test_usage_errors_give_a_json_document_with_json(tmp_path, args, env):
    """An error found before a command's body runs (a bad option value, a
    missing argument, a bad environment variable) still gives, with --json,
    the JSON error document on stdout, beside its line on stderr; exit 2."""
    done = subprocess.run([sys.executable, "-m", "gdscp", *args], cwd=tmp_path, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["command"] == args[0] and doc["error"]
    assert doc["error"].split()[0] in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
@pytest.mark.parametrize("command", ["copy", "write", "write-two"])
def test_a_replaced_file_keeps_its_owner_and_group(capsys, tmp_path, command):
    """As cp, which writes into the existing file: the new bytes arrive under
    the old file's owner, group and mode, though they came through a new
    file renamed over it."""
    dsts = [tmp_path / "owned.bin", tmp_path / "owned2.bin"]
    for d in dsts:
        d.write_bytes(b"old")
        os.chown(d, 65534, 65534)
        os.chmod(d, 0o640)
    if command == "copy":
        data = random_file(tmp_path / "src.bin", 5000)
        args = ["copy", tmp_path / "src.bin", dsts[0]]
    else:
        data = memory.pattern(5000, "seq").tobytes()
        args = ["write", *dsts[: 2 if command == "write-two" else 1], "--size", "5000", "--pattern", "seq", "--host"]
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    for d in dsts[: 2 if command == "write-two" else 1]:
        st = os.stat(d)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o640)
        assert d.read_bytes() == data


def test_names_with_line_breaks_stay_exact_and_errors_one_line(capsys, tmp_path):
    """A file name with a newline or a tab: the error is still one line on
    stderr, where such characters show as escapes (as ls -b shows them), and
    the JSON document names the file exactly."""
    odd = tmp_path / "new\nline\tname.bin"
    random_file(odd, 100)
    code, doc, err = cli_json(capsys, "copy", odd, tmp_path / "missing-dir" / "x")
    assert code == 1
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert "new\\nline\\tname.bin" in line
    (record,) = doc["files"]
    assert record["source"] == str(odd) and record["status"] == "failed"
    code, doc, err = cli_json(capsys, "write", tmp_path / "missing-dir" / "a\nb.bin", "--size", "1K", "--host")
    assert code == 1 and len([x for x in err.splitlines() if x.strip()]) == 1
    assert "a\nb.bin" in doc["error"]


def test_an_offset_into_an_empty_file_is_past_its_end(capsys, tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    code, _, err = cli(capsys, "read", tmp_path / "empty.bin", "--offset", "1", "--host")
    (line,) = error_lines(err)
    assert code == 1 and "past the end" in line and "empty.bin" in line


def test_copy_of_dir_dot_merges_its_contents_as_cp(capsys, tmp_path):
    """`copy -r SRC/. DST`: SRC's contents into DST, whether DST exists (merged
    into) or not (made), as cp does; not DST/SRC."""
    src = tmp_path / "s"
    (src / "sub").mkdir(parents=True)
    (src / "a").write_bytes(b"a")
    (src / "sub" / "b").write_bytes(b"b")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "keep").write_bytes(b"k")
    for dst in (tmp_path / "t", tmp_path / "new"):
        code, _, err = cli(capsys, "copy", "-r", f"{src}/.", dst, "-q")
        assert code == 0, err
        assert (dst / "a").read_bytes() == b"a" and (dst / "sub" / "b").read_bytes() == b"b"
        assert not (dst / "s").exists()
    assert (tmp_path / "t" / "keep").read_bytes() == b"k"
