"""What ``gdscp copy --json`` says of each file when the copy ends part-way:
interrupted by a real signal in a real process, a file that fails after
some of its bytes moved, an interrupt while the links are made. Each file
is listed with its outcome, and its ``bytes`` are what the copy left at its
destination, which the total sums."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from gdscp.cli import copy as copy_module
from gdscp.cli.app import run

SAID = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated", 143)}

# ``python -c HELD MARKER SKIP gdscp-arguments...``: the command line, with the
# engine's test hold armed: after SKIP chunks, a worker reaching the next one
# waits there until the job is cancelled. MARKER is made once it waits, so
# that a signal sent then lands while that file is certainly in flight.
HELD = """
import pathlib, sys, threading, time
from gdscp import _core
from gdscp.cli.main import main

marker = pathlib.Path(sys.argv[1])
_core.testing.arm_hold(int(sys.argv[2]))

def mark():
    while not _core.testing.hold_reached():
        time.sleep(0.001)
    marker.touch()

threading.Thread(target=mark, daemon=True).start()
sys.argv = ["gdscp", *sys.argv[3:]]
main()
"""


def _wait_for(ready, proc: subprocess.Popen, what: str) -> None:
    """Until ``ready()``; a command that ended first fails the test with what it said."""
    deadline = time.monotonic() + 120  # a bound on a hang, not a timing under test
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the copy ended (exit {proc.returncode}) before {what}: {out!r} {err!r}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.communicate()
            pytest.fail(f"no {what} within two minutes")
        time.sleep(0.005)


def _timed(doc: dict) -> dict:
    """``doc`` with its times (which vary) checked and set to None."""
    for record in (doc, *doc["files"]):
        assert isinstance(record["seconds"], float) and record["seconds"] >= 0, record
        record["seconds"] = None
    assert isinstance(doc["gb_per_s"], float) and doc["gb_per_s"] >= 0
    doc["gb_per_s"] = None
    return doc


def _record(source: str, destination: str, nbytes: int, status: str, error=None, backends=("posix", "posix")):
    return {"source": source, "destination": destination, "bytes": nbytes, "status": status, "error": error,
            "read_backend": backends[0], "write_backend": backends[1], "seconds": None}


def _document(message: str, code: int, copied: int, failed: int, nbytes: int, files: list) -> dict:
    return {"command": "copy", "ok": False, "error": message, "exit_code": code, "memory": "host", "device": None,
            "devices": None, "device_bytes": None, "copied": copied, "skipped": 0, "failed": failed,
            "bytes": nbytes, "seconds": None, "gb_per_s": None, "verified": False, "files": files}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_copy_of_several_files_interrupted_lists_each_file(tmp_path, monkeypatch, signum):
    """``copy a fifo c DIR --json`` with a signal while the FIFO's bytes are
    read (a and c already in place): the document lists all three, a and c
    copied, the FIFO's file cancelled, and counts only what is in place."""
    monkeypatch.chdir(tmp_path)
    Path("a").write_bytes(b"a" * 100_000)
    Path("c").write_bytes(b"c" * 5_000)
    os.mkfifo("f")
    Path("d").mkdir()
    # Workers enough for a and c while another waits on the FIFO.
    proc = subprocess.Popen([sys.executable, "-m", "gdscp", "copy", "--threads", "4", "a", "f", "c", "d", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    writer = None
    try:
        _wait_for(lambda: Path("d/a").exists() and Path("d/c").exists(), proc, "a and c in place")

        def opened() -> bool:  # by the copy, for reading: without a reader, ENXIO
            nonlocal writer
            try:
                writer = os.open("f", os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
            return writer is not None

        _wait_for(opened, proc, "the FIFO opened")
        os.write(writer, b"f" * 3_000)

        def drained() -> bool:  # the copy has read them: the FIFO's file is in flight
            return struct.unpack("i", fcntl.ioctl(writer, termios.FIONREAD, b"\0" * 4))[0] == 0

        _wait_for(drained, proc, "the FIFO's bytes read")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    message, code = SAID[signum]
    assert proc.returncode == code, err
    assert _timed(json.loads(out)) == _document(message, code, 2, 1, 105_000, [
        _record("a", "d/a", 100_000, "copied"),
        _record("f", "d/f", 0, "cancelled", f"not copied: {message}"),
        _record("c", "d/c", 5_000, "copied"),
    ])
    assert err.decode().splitlines() == [f"gdscp copy: error: {message}"]
    assert sorted(os.listdir("d")) == ["a", "c"]
    assert Path("d/a").read_bytes() == b"a" * 100_000 and Path("d/c").read_bytes() == b"c" * 5_000


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_tree_copy_interrupted_lists_each_file_and_link(tmp_path, monkeypatch, signum):
    """``copy -r --json`` of a tree with one worker, held in its second file
    (b) until the signal: a and the link copied, b (in flight) and c (never
    started) cancelled, each listed; nothing of b or c at the destination."""
    monkeypatch.chdir(tmp_path)
    src = Path("src")
    src.mkdir()
    (src / "a").write_bytes(b"a" * 3_000)
    (src / "b").write_bytes(b"b" * (1 << 20))
    (src / "c").write_bytes(b"c" * 2_000)
    os.symlink("a", src / "l")
    # One worker takes the files in order; the hold is at its second chunk: b's first.
    proc = subprocess.Popen([sys.executable, "-c", HELD, "held", "1", "copy", "-r", "--threads", "1",
                             "--chunk-size", "64K", "src", "dst", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(Path("held").exists, proc, "the hold reached")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    message, code = SAID[signum]
    assert proc.returncode == code, err
    assert _timed(json.loads(out)) == _document(message, code, 2, 2, 3_000, [
        _record("src/a", "dst/a", 3_000, "copied"),
        _record("src/b", "dst/b", 0, "cancelled", f"not copied: {message}"),
        _record("src/c", "dst/c", 0, "cancelled", f"not copied: {message}", (None, None)),
        _record("src/l", "dst/l", 0, "copied", backends=(None, None)),
    ])
    assert err.decode().splitlines() == [f"gdscp copy: error: {message}"]
    assert sorted(os.listdir("dst")) == ["a", "l"]
    assert Path("dst/a").read_bytes() == b"a" * 3_000 and os.readlink("dst/l") == "a"


def test_a_failed_file_counts_no_bytes(tmp_path, monkeypatch):
    """A file that fails after some of its bytes were written (past the
    file-size limit) left nothing at its destination: its ``bytes`` are 0,
    and the total is the sum of the files'."""
    monkeypatch.chdir(tmp_path)
    Path("big").write_bytes(b"b" * (1 << 20))
    Path("small").write_bytes(b"s" * 1_000)
    Path("d").mkdir()
    limit = 500_000  # big's chunks below it are written, the one across it fails

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "gdscp", "copy", "--chunk-size", "64K", "big", "small", "d", "--json"],
                          capture_output=True, preexec_fn=limited, timeout=120)
    assert proc.returncode == 1, proc.stderr
    doc = _timed(json.loads(proc.stdout))
    error = doc["files"][0].pop("error")
    assert error.startswith("cannot copy 'big' to 'd/big': ") and "File too large" in error, error
    assert doc == {"command": "copy", "ok": False, "memory": "host", "device": None, "devices": None,
                   "device_bytes": None, "copied": 1, "skipped": 0, "failed": 1, "bytes": 1_000, "seconds": None,
                   "gb_per_s": None, "verified": False, "files": [
                       {k: v for k, v in _record("big", "d/big", 0, "failed").items() if k != "error"},
                       _record("small", "d/small", 1_000, "copied"),
                   ]}
    assert os.listdir("d") == ["small"]


def test_an_interrupt_while_links_are_made_lists_the_files_not_reached(capsys, tmp_path, monkeypatch):
    """A signal while a link is put in place waits for that link's end: the
    link is copied, and every file and link after it (and the file before
    it, whose job never started) is listed, cancelled."""
    monkeypatch.chdir(tmp_path)
    src = Path("src")
    src.mkdir()
    (src / "a").write_bytes(b"a" * 10)
    os.symlink("a", src / "l1")
    os.symlink("a", src / "l2")
    (src / "z").write_bytes(b"z" * 10)
    real_step = copy_module._Copier._step

    def signal_in_second_link(self, job, record):
        if job.src == "src/l2":
            os.kill(os.getpid(), signal.SIGINT)  # lands while the link is made
        real_step(self, job, record)

    monkeypatch.setattr(copy_module._Copier, "_step", signal_in_second_link)
    capsys.readouterr()
    code = run(["copy", "-r", "src", "dst", "--json"])
    out, err = capsys.readouterr()
    assert code == 130, err
    why = "not copied: interrupted"
    assert _timed(json.loads(out)) == _document("interrupted", 130, 2, 2, 0, [
        _record("src/a", "dst/a", 0, "cancelled", why, (None, None)),
        _record("src/l1", "dst/l1", 0, "copied", backends=(None, None)),
        _record("src/l2", "dst/l2", 0, "copied", backends=(None, None)),
        _record("src/z", "dst/z", 0, "cancelled", why, (None, None)),
    ])
    assert sorted(os.listdir("dst")) == ["l1", "l2"]


def test_an_interrupted_copy_into_a_descriptor_counts_what_went_through(capsys, tmp_path, monkeypatch):
    """Bytes written into a descriptor of the process (a pipe, /dev/fd/N)
    stay written when the copy is interrupted part-way: the cancelled file's
    ``bytes`` are those, and the total sums them."""
    monkeypatch.chdir(tmp_path)
    Path("s").write_bytes(b"s" * 10_000)
    r, w = os.pipe()
    w_name = w
    real = copy_module.copy_through

    def interrupted_part_way(src, writer, buffer, progress, verify):
        writer.pwrite(memoryview(b"s" * 3_000), 3_000, 0)
        progress.advance(3_000)
        raise KeyboardInterrupt

    monkeypatch.setattr(copy_module, "copy_through", interrupted_part_way)
    try:
        capsys.readouterr()
        code = run(["copy", "s", f"/dev/fd/{w}", "--json"])
        out, err = capsys.readouterr()
        os.close(w)
        w = -1
        assert os.read(r, 10_000) == b"s" * 3_000
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    assert real is not copy_module.copy_through and code == 130, err
    assert _timed(json.loads(out)) == _document("interrupted", 130, 0, 1, 3_000, [
        _record("s", f"/dev/fd/{w_name}", 3_000, "cancelled", "not copied: interrupted"),
    ])
