"""Destinations that name one of the process's own descriptors (/dev/stdout,
/dev/fd/N, /proc/self/fd/N...): written through the descriptor, from where it
stands, as ``cat SRC >> FILE`` writes, whatever it refers to; the file behind
it is the shell's, never replaced. Each command runs as a real process, its
descriptors set up as a shell sets them up."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from gdscp import memory

from test_cli import random_file, temp_files
from test_cufile_standin import folder, go, standin_build  # noqa: F401 - fixtures

SIZE = 300_000  # several pieces of --chunk-size 64K

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="no /proc/self/fd")


def command(kind: str, tmp_path: Path, dst: str) -> tuple[list[str], bytes]:
    """``gdscp copy`` (of a random file) or ``gdscp write`` (of the seq
    pattern) into ``dst``, and the bytes it writes there."""
    if kind == "copy":
        data = random_file(tmp_path / "src.bin", SIZE + 1)
        return ["copy", str(tmp_path / "src.bin"), dst, "--chunk-size", "64K"], data
    args = ["write", dst, "--size", str(SIZE), "--pattern", "seq", "--host", "--chunk-size", "64K"]
    return args, memory.pattern(SIZE, "seq").tobytes()


def gdscp(args: list[str], **how: object) -> subprocess.CompletedProcess:
    how.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "gdscp", *args], stderr=subprocess.PIPE, timeout=120, **how)


@pytest.mark.parametrize("kind", ["copy", "write"])
def test_standard_output_opened_for_appending_is_appended_to(tmp_path, kind):
    """``gdscp ... /dev/stdout >> log``: the bytes follow what log held, in
    the same file (the shell's descriptor still leads to it)."""
    log = tmp_path / "log"
    log.write_bytes(b"old\n")
    before = os.stat(log).st_ino
    args, want = command(kind, tmp_path, "/dev/stdout")
    with open(log, "ab") as out:
        done = gdscp([*args, "-q"], stdout=out)
    assert done.returncode == 0, done.stderr[-2000:]
    assert log.read_bytes() == b"old\n" + want
    assert os.stat(log).st_ino == before
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("kind", ["copy", "write"])
def test_standard_output_opened_by_the_shell_is_written_through(tmp_path, kind):
    """``{ gdscp ... /dev/stdout; echo done; } > out``: the shell's own
    descriptor goes on from where the command left it, so that what it writes
    next lands after the bytes, in the same file; the result table goes to
    stderr, out of the data's way."""
    out = tmp_path / "out"
    out.write_bytes(b"what the redirection empties")
    args, want = command(kind, tmp_path, "/dev/stdout")
    done = subprocess.run(["bash", "-c", '{ "$@"; echo done; } > "$0"', str(out), sys.executable, "-m", "gdscp",
                           *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_bytes() == want + b"done\n"
    assert (b"/dev/stdout" if kind == "write" else b"copied") in done.stderr


@pytest.mark.parametrize("kind", ["copy", "write"])
@pytest.mark.parametrize("name", ["/dev/fd/{n}", "/proc/self/fd/{n}", "/proc/thread-self/fd/{n}",
                                  "/proc/@PID@/fd/{n}", "link"])
def test_another_descriptor_is_written_through(tmp_path, kind, name):
    """Descriptor N (not stdout) passed to the command, named every way
    there is (/proc/PID/fd/N with the command's own PID), and through a
    symbolic link of one's own to /dev/fd/N: the bytes follow what the file
    held; it is written through the descriptor, made durable, never
    replaced. The command's own stdout keeps the result."""
    if name.startswith("/proc/thread-self") and not os.path.exists("/proc/thread-self"):
        pytest.skip("no /proc/thread-self")
    log = tmp_path / "log"
    log.write_bytes(b"old\n")
    before = os.stat(log).st_ino
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        if name == "link":
            os.symlink(f"/dev/fd/{fd}", tmp_path / "link")
            dst = str(tmp_path / "link")
        else:
            dst = name.format(n=fd)
        args, want = command(kind, tmp_path, dst)
        # exec: the shell's PID ($$) is then the command's.
        done = subprocess.run(["bash", "-c", 'exec "$0" -m gdscp "${@//@PID@/$$}"', sys.executable, *args, "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120, pass_fds=[fd])
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["ok"] is True
    if kind == "write":
        assert doc["fsync"] is True
        assert doc["path"].endswith(f"/fd/{fd}") if "@PID@" in dst else doc["path"] == dst
    else:
        assert doc["copied"] == 1 and doc["bytes"] == len(want)
    assert log.read_bytes() == b"old\n" + want
    assert os.stat(log).st_ino == before
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("kind", ["copy", "write"])
def test_a_descriptor_is_written_from_where_it_stands(tmp_path, kind):
    """A descriptor open for reading and writing (``3<>file``), moved 3 bytes
    in: the bytes land from there, over what was there, the rest of the file
    kept, and the descriptor is left after them."""
    args, want = command(kind, tmp_path, "")
    f = tmp_path / "f"
    f.write_bytes(b"z" * (len(want) + 10))
    fd = os.open(f, os.O_RDWR)
    try:
        os.lseek(fd, 3, os.SEEK_SET)
        args[args.index("")] = f"/dev/fd/{fd}"
        done = gdscp([*args, "-q"], pass_fds=[fd])
        assert os.lseek(fd, 0, os.SEEK_CUR) == 3 + len(want)
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f.read_bytes() == b"zzz" + want + b"z" * 7


@pytest.mark.parametrize("kind", ["copy", "write"])
def test_a_non_blocking_pipe_is_waited_for(tmp_path, kind):
    """Standard output a pipe that another program made non-blocking (its
    flags are shared with the command's copy of it): the command waits for
    room in it, as cat does, rather than fail once it is full."""
    args, want = command(kind, tmp_path, "/dev/stdout")
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    got = bytearray()

    def drain() -> None:
        with open(r, "rb") as pipe:
            got.extend(pipe.read())

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        done = gdscp([*args, "-q"], stdout=w)
    finally:
        os.close(w)
        reader.join(60)
    assert not reader.is_alive()
    assert done.returncode == 0, done.stderr[-2000:]
    assert bytes(got) == want


def test_a_symbolic_link_to_a_regular_file_is_still_replaced(tmp_path):
    """A name that merely leads to a file (a link of one's own, even to the
    very file standard output is): the file is replaced by a new one, renamed
    over it once complete, as before; standard output is no part of it."""
    log = tmp_path / "log"
    log.write_bytes(b"old\n")
    before = os.stat(log).st_ino
    os.symlink(log, tmp_path / "link")
    args, want = command("write", tmp_path, str(tmp_path / "link"))
    with open(log, "ab") as out:
        done = gdscp([*args, "-q"], stdout=out)
    assert done.returncode == 0, done.stderr[-2000:]
    assert log.read_bytes() == want
    assert os.stat(log).st_ino != before
    assert os.path.islink(tmp_path / "link")
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("extra, code, message", [
    (["write", "/dev/stdout", "{other}", "--size", "4K", "--host"], 2,
     "gdscp write: error: '/dev/stdout' is a descriptor of this process, written through it, front to back: "
     "several FILEs must all be regular files named as such (write it alone)"),
    (["copy", "{log}", "/dev/stdout"], 1,
     "gdscp copy: error: '{log}' and '/dev/stdout' are the same file"),
])
def test_what_cannot_go_through_a_descriptor_is_refused_before_any_byte(tmp_path, extra, code, message):
    """Refused with one line, the file behind the descriptor as it was: a
    descriptor among several FILEs, and a source that is the very file
    written (it would be read as it grows, without end)."""
    log = tmp_path / "log"
    old = random_file(log, 5000, seed=3)
    args = [a.format(log=log, other=tmp_path / "other") for a in extra]
    with open(log, "ab") as out:
        done = gdscp(args, stdout=out)
    lines = [line for line in done.stderr.decode().splitlines() if ": error: " in line]
    assert (done.returncode, lines) == (code, [message.format(log=log)])
    assert log.read_bytes() == old
    assert not os.path.exists(tmp_path / "other")


@pytest.mark.parametrize("into", ["new file", "appended", "pipe"])
def test_preserve_through_a_descriptor(tmp_path, into):
    """copy -p SRC /dev/stdout: standard output a file the shell made for
    it (``> new``) holds the copy alone, and gets SRC's mode and times, as
    cp -p gives a copy; a file the copy was added to (``>> log``) or a pipe
    is no copy of SRC, keeps its own, and a warning says so. (-p was passed
    over in silence.)"""
    src = tmp_path / "src"
    data = random_file(src, 5000)
    os.chmod(src, 0o751)
    os.utime(src, ns=(10**18, 10**18 + 5))
    dst = tmp_path / "dst"
    dst.write_bytes(b"old\n" if into == "appended" else b"")
    os.chmod(dst, 0o640)
    args = ["copy", "-p", str(src), "/dev/stdout"]
    if into == "pipe":
        done = gdscp(args)
        got = done.stdout
    else:
        with open(dst, "ab") as out:
            done = gdscp(args, stdout=out)
        st = os.stat(dst)  # (before reading it sets its access time)
        got = dst.read_bytes()
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = [line for line in done.stderr.decode().splitlines() if ": warning: " in line]
    if into == "new file":
        assert got == data and warnings == []
        assert (stat.S_IMODE(st.st_mode), st.st_atime_ns, st.st_mtime_ns) == (0o751, 10**18, 10**18 + 5)
        return
    why = ("the file holds more than the copy of '{src}' (it was written from offset 4)" if into == "appended"
           else "it is a pipe or FIFO, not a copy of '{src}'")
    assert warnings == ["gdscp copy: warning: --preserve: '/dev/stdout' keeps its own mode and times: "
                        + why.format(src=src)]
    if into == "appended":
        assert got == b"old\n" + data
        assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_mtime_ns != 10**18 + 5
    else:
        assert got == data


@pytest.mark.parametrize("to", ["/dev/stdout", "/dev/fd/{fd}", "/proc/self/fd/{fd}"])
@pytest.mark.parametrize("what", ["link", "directory"])
def test_a_recursive_copy_into_a_descriptor_replaces_no_link(tmp_path, to, what):
    """-r of a symbolic link (copied as a link) or a directory into DST, a
    link of one's own to a descriptor (standard output, or descriptor N,
    both a log opened for appending): refused with one line naming DST,
    the link DST and the log as they were, no temporary file left. (The
    link was renamed over DST, which then led to the source's target, and
    nothing went through the descriptor.)"""
    log = tmp_path / "log"
    old = random_file(log, 5000, seed=3)
    random_file(tmp_path / "target", 100)
    os.symlink("target", tmp_path / "src")
    if what == "directory":
        os.mkdir(tmp_path / "src-dir")
        random_file(tmp_path / "src-dir" / "a", 100)
    src = tmp_path / ("src" if what == "link" else "src-dir")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        dst = tmp_path / "out"
        os.symlink(to.format(fd=fd), dst)
        with open(log, "ab") as stdout:
            done = gdscp(["copy", "-r", str(src), str(dst), "-q"], stdout=stdout, pass_fds=[fd])
    finally:
        os.close(fd)
    lines = [line for line in done.stderr.decode().splitlines() if ": error: " in line]
    if what == "link":
        said = (f"gdscp copy: error: cannot overwrite '{dst}' with symbolic link '{src}': '{dst}' names a descriptor "
                "of this process, written through, never replaced (without -r, the file the link leads to goes "
                "through it)")
    else:
        said = f"gdscp copy: error: cannot overwrite non-directory '{dst}' with directory '{src}'"
    assert (done.returncode, lines) == (1, [said])
    assert os.readlink(dst) == to.format(fd=fd)
    assert log.read_bytes() == old
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("kind", ["copy", "write"])
def test_verify_reads_back_what_went_through_a_descriptor(tmp_path, kind):
    """--verify through /dev/fd/N opened for appending: the bytes just
    appended are read back and checked, where they landed."""
    log = tmp_path / "log"
    log.write_bytes(b"old\n")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        args, want = command(kind, tmp_path, f"/dev/fd/{fd}")
        done = gdscp([*args, "--verify", "--json"], pass_fds=[fd])
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["verified"] is True
    assert log.read_bytes() == b"old\n" + want


@pytest.mark.parametrize("extra, code, message", [
    (["write", "/dev/stdout", "--size", "4K", "--host", "--verify"], 2,
     "gdscp write: error: --verify cannot read '/dev/stdout' back: it is not a regular file or block device"),
    (["copy", "{src}", "/dev/stdout", "--verify"], 1,
     "gdscp copy: error: cannot verify a copy into '/dev/stdout': it is not a regular file or block device, to be "
     "read back"),
    (["copy", "/dev/stdin", "{log}", "--verify"], 1,
     "gdscp copy: error: cannot verify what was read from '/dev/stdin': a FIFO or character device cannot be read "
     "again"),
])
def test_verify_through_a_pipe_is_refused_before_any_byte(tmp_path, extra, code, message):
    """Standard input and output pipes: what goes into one cannot be read
    back, what comes out of one cannot be read again. One line, nothing
    written (the log, through descriptor 3, as it was)."""
    log = tmp_path / "log"
    old = random_file(log, 5000, seed=3)
    random_file(tmp_path / "src", 100)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        args = [a.format(log=f"/dev/fd/{fd}", src=tmp_path / "src") for a in extra]
        done = gdscp(args, input=b"some input", pass_fds=[fd])
    finally:
        os.close(fd)
    lines = [line for line in done.stderr.decode().splitlines() if ": error: " in line]
    assert (done.returncode, lines) == (code, [message])
    if "/dev/stdout" in extra:
        assert done.stdout == b""  # (the table goes to stderr)
    assert log.read_bytes() == old


def test_a_descriptor_open_for_reading_only_is_refused(tmp_path):
    """/dev/stdin as the destination, standard input a file opened for
    reading: one line, and the file as it was."""
    src = tmp_path / "src"
    random_file(src, 100)
    old = random_file(tmp_path / "input", 1000, seed=2)
    with open(tmp_path / "input", "rb") as stdin:
        done = gdscp(["copy", str(src), "/dev/stdin", "-q"], stdin=stdin)
    lines = [line for line in done.stderr.decode().splitlines() if ": error: " in line]
    assert (done.returncode, lines) == (1, ["gdscp copy: error: cannot write to '/dev/stdin': descriptor 0 is open "
                                            "for reading only"])
    assert (tmp_path / "input").read_bytes() == old


def test_the_file_size_limit_counts_from_where_the_descriptor_stands(tmp_path):
    """Appending 4K to a file of 6000 bytes under a limit of 8K (ulimit -f):
    the file would end past the limit, so nothing is written, where a write
    checked as a new file of 4K would have got as far as the limit."""
    log = tmp_path / "log"
    old = random_file(log, 6000)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    with open(log, "ab") as out:
        done = gdscp(["write", "/dev/stdout", "--size", "4K", "--host", "-q"], stdout=out, preexec_fn=limit)
    lines = [line for line in done.stderr.decode().splitlines() if ": error: " in line]
    assert (done.returncode, lines) == (1, ["gdscp write: error: '/dev/stdout' would end at 9.86 KiB, more than "
                                            "this process may write to one file (8.00 KiB, the file-size limit "
                                            "set by ulimit -f)"])
    assert log.read_bytes() == old


def scenario_gpu_memory_into_a_descriptor(folder):
    """copy --device 0 and write from GPU memory (the stand-in's) into
    /dev/fd/N opened for appending: each through the GPU, appended in turn."""
    import contextlib
    import io

    from gdscp.cli.app import run

    data = np.random.default_rng(4).integers(0, 256, SIZE + 1, dtype=np.uint8).tobytes()
    src, log = os.path.join(folder, "src.bin"), os.path.join(folder, "log")
    for path, content in ((src, data), (log, b"old\n")):
        with open(path, "wb") as f:
            f.write(content)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        for args in (["copy", src, f"/dev/fd/{fd}", "--device", "0"],
                     ["write", f"/dev/fd/{fd}", "--size", str(SIZE), "--pattern", "seq", "--device", "0"]):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = run([*args, "--chunk-size", "64K", "--json"])
            assert code == 0, err.getvalue()
            doc = json.loads(out.getvalue())
            assert doc["ok"] and doc["memory"] == "gpu" and doc["device"] == 0, doc
    finally:
        os.close(fd)
    with open(log, "rb") as f:
        assert f.read() == b"old\n" + data + memory.pattern(SIZE, "seq").tobytes()


def test_gpu_memory_into_a_descriptor(go):
    go(scenario_gpu_memory_into_a_descriptor)


def test_a_chunk_size_past_the_source_allocates_no_more_than_the_source(tmp_path):
    """``gdscp copy SRC /dev/stdout --chunk-size 4E``: the buffer is no
    larger than SRC (as the bulk path's staging), so a small file goes
    through whatever chunk size is asked for, where a buffer of the whole
    size is more memory than any machine has."""
    data = random_file(tmp_path / "src.bin", SIZE + 1)
    log = tmp_path / "log"
    with open(log, "wb") as out:
        done = gdscp(["copy", str(tmp_path / "src.bin"), "/dev/stdout", "--chunk-size", str(1 << 62), "-q"],
                     stdout=out)
    assert (done.returncode, done.stderr) == (0, b"")
    assert log.read_bytes() == data
    assert temp_files(tmp_path) == []
