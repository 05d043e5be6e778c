"""Cold reads ask the disk for what they read next (POSIX_FADV_WILLNEED) in
steps no longer than Linux serves in one call: the larger of the device's
largest request and its readahead window, which the engine reads from sysfs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gdscp import _core
from gdscp.bench.files import memory_filesystem

KiB, MiB = 1 << 10, 1 << 20


def sysfs_kib(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0]) * KiB
    except (OSError, ValueError, IndexError):
        return 0


def test_the_step_is_what_sysfs_says_of_the_files_device(tmp_path):
    dev = os.stat(tmp_path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    block = f"/sys/dev/block/{major}:{minor}"
    want = 0
    for queue in ("/queue/", "/../queue/"):
        want = max(sysfs_kib(block + queue + "max_sectors_kb"), sysfs_kib(block + queue + "read_ahead_kb"))
        if want:
            break
    want = want or sysfs_kib(f"/sys/class/bdi/{major}:{minor}/read_ahead_kb")
    assert _core.testing.readahead_step(major, minor) == (want if want >= 4 * KiB else 128 * KiB)


CHILD = r"""
import json, os, sys, time
import numpy as np
import gdscp
from gdscp import _core

MiB = 1 << 20
cases, path = json.loads(sys.argv[1]), sys.argv[2]
steps = {name: _core.testing.readahead_step(major, minor) for name, (major, minor) in cases.items()}
# The whole file asked for, 4 KiB at a time: every page comes in.
gdscp.drop_file_page_cache(path)
fd = os.open(path, os.O_RDONLY)
before = gdscp.get_page_cache_info(path)[0]
_core.testing.ask_disk(fd, 0, os.fstat(fd).st_size)
deadline = time.monotonic() + 20
while (info := gdscp.get_page_cache_info(path))[0] < info[1] and time.monotonic() < deadline:
    time.sleep(0.01)
os.close(fd)
# Cold reads with part of the file cached, byte-exact.
data = open(path, "rb").read()
reads = []
for size, offset in [(len(data), 0), (3 * MiB + 5, 4093), (2 * MiB, len(data) - 5)]:
    gdscp.drop_file_page_cache(path)
    fd = os.open(path, os.O_RDONLY)
    os.pread(fd, MiB, 2 * MiB + 7)  # a cached stretch in the middle
    os.close(fd)
    gdscp.defaults.set({"num_threads": 3, "task_size": 4 * MiB, "mapped_reads": False})
    host = np.full(size + 6, 0xA5, np.uint8)
    with gdscp.CuFile(path, "r") as f:
        n = f.read(host[3 : 3 + size], size, offset)
    got = host.tobytes()
    want = data[offset : offset + size]
    reads.append(n == len(want) and got[3 : 3 + n] == want and got[:3] + got[3 + n :] == b"\xa5" * (size + 6 - n))
print(json.dumps({"steps": steps, "cached": [before, *info], "reads": reads}))
"""


def test_steps_from_a_machines_sysfs_and_cold_reads_stepped_finely(tmp_path):
    """A made-up sysfs: a whole disk, a partition (its disk's queue, one up),
    a filesystem with a backing device but no block device (NFS), a device
    sysfs says nothing of and one it says nonsense of. The data's own device
    is given 4 KiB steps, so its cold reads ask in many small calls and a
    last short one: the whole of a range asked comes into the page cache
    (Linux would have read ahead at most a few MiB of it in one call), and
    every byte of a read still lands where it belongs."""
    root = tmp_path / "sys"

    def put(rel, text):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    put("devices/disk/sda/queue/max_sectors_kb", "1280")
    put("devices/disk/sda/queue/read_ahead_kb", "128")
    (root / "devices/disk/sda/sda1").mkdir()
    put("devices/disk/vdb/queue/max_sectors_kb", "4096")
    put("devices/disk/vdb/queue/read_ahead_kb", "8192")
    put("devices/disk/odd/queue/max_sectors_kb", "lots")
    put("class/bdi/0:61/read_ahead_kb", "15360")
    data_dev = os.stat(tmp_path).st_dev
    data_id = f"{os.major(data_dev)}:{os.minor(data_dev)}"
    put("devices/disk/data/queue/max_sectors_kb", "4")
    put("devices/disk/data/queue/read_ahead_kb", "4")
    (root / "dev/block").mkdir(parents=True)
    for dev_id, target in [("250:0", "sda"), ("250:1", "sda/sda1"), ("250:16", "vdb"), ("250:32", "odd"),
                           (data_id, "data")]:
        (root / "dev/block" / dev_id).symlink_to(f"../../devices/disk/{target}")
    cases = {"disk": (250, 0), "partition": (250, 1), "large": (250, 16), "nonsense": (250, 32),
             "nfs": (0, 61), "unknown": (250, 48), "data": (os.major(data_dev), os.minor(data_dev))}

    data = os.urandom(24 * MiB + 4097)
    path = tmp_path / "cold.bin"
    path.write_bytes(data)
    env = dict(os.environ, GDSCP_SYSFS_ROOT=str(root))
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases), str(path)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["steps"] == {"disk": 1280 * KiB, "partition": 1280 * KiB, "large": 8 * MiB, "nonsense": 128 * KiB,
                            "nfs": 15 * MiB, "unknown": 128 * KiB, "data": 4 * KiB}
    before, cached, total = got["cached"]
    if not memory_filesystem(str(tmp_path)):  # (tmpfs: every page is always there)
        assert before < total // 2 and cached == total
    assert got["reads"] == [True, True, True]
