"""A minute's check of the GPU path before longer runs: round trips of odd
sizes and offsets, raw and stream-ordered calls, a thread with no CUDA context.
Exits non-zero on the first wrong byte."""

import os
import sys
import tempfile
import threading

import cupy
import numpy as np

import gdscp


def main() -> int:
    rng = np.random.default_rng(7)
    d = tempfile.mkdtemp(dir="/tmp")
    path = os.path.join(d, "smoke.bin")
    data = rng.integers(0, 256, size=(40 << 20) + 3, dtype=np.uint8)
    data.tofile(path)
    failures = 0

    def check(what, got, want):
        nonlocal failures
        ok = got.shape == want.shape and bool((got == want).all())
        print(("ok  " if ok else "FAIL"), what, flush=True)
        failures += not ok

    for compat in ("on", "off"):
        try:
            gdscp.defaults.set("compat_mode", compat)
            with gdscp.CuFile(path) as f:
                print("compat", compat, "->", f.backend, "|", f.backend_reason, flush=True)
                for size, off in [(1, 0), (4095, 1), (4097, 4096), ((1 << 20) + 3, 12345), (len(data) - 5, 5)]:
                    buf = cupy.empty(size, dtype=cupy.uint8)
                    n = f.read(buf, file_offset=off)
                    check(f"read size={size} off={off} n={n}", buf.get()[:n], data[off:off + size])
                buf = cupy.zeros(100, dtype=cupy.uint8)
                n = f.read(buf, file_offset=len(data) - 10)
                check(f"past EOF n={n}", buf.get()[:10], data[-10:])
                big = cupy.empty(len(data) + 7, dtype=cupy.uint8)
                n = f.read(big[7:])
                check("unaligned device view", big[7:].get(), data)
                n = f.raw_read(big, 4096, 100, dev_offset=3)
                check("raw_read dev_offset", big[3:3 + 4096].get(), data[100:4196])
                s = cupy.cuda.Stream()
                fut = f.raw_read_async(big, s, 8192, 1, 0)
                n = fut.check_bytes_done()
                check(f"raw_read_async n={n}", big[:8192].get(), data[1:8193])
            out = os.path.join(d, f"w-{compat}.bin")
            src = cupy.asarray(data)
            with gdscp.CuFile(out, "w") as f:
                f.write(src[3:])
            check("write from device", np.fromfile(out, dtype=np.uint8), data[3:])
            with gdscp.CuFile(out, "r+") as f:
                f.raw_write(src, 4096, 0, dev_offset=11)
            check("raw_write", np.fromfile(out, dtype=np.uint8)[:4096], data[11:4107])
        except Exception as e:  # noqa: BLE001
            print("FAIL compat", compat, type(e).__name__, e, flush=True)
            failures += 1
        finally:
            gdscp.defaults.set("compat_mode", "auto")

    box = {}
    dev = cupy.empty(len(data), dtype=cupy.uint8)

    def worker():
        try:
            with gdscp.CuFile(path) as f:
                box["n"] = f.read(dev)
        except Exception as e:  # noqa: BLE001
            box["err"] = e

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    if "err" in box:
        print("FAIL thread without context:", box["err"])
        failures += 1
    else:
        check("thread without context", dev.get(), data)
    print("smoke failures:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
