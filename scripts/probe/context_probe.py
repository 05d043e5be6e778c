"""Experiment: what, inside `gdscp benchmark`, makes gdscp's hot file -> GPU
reads slower than in a process of their own (about 1 GB/s on one machine, 4
minutes apart). Each context runs in its own process, twice, in alternating
order; every gdscp figure is 16 threads, the file opened for each read, median
of RUNS after a warm-up:

  alone        gdscp only;
  kvikio       KvikIO imported and reading in the same process, rounds alternating;
  cycle        gdscp alternating 4, 8, 16 and 32 threads, as the benchmark does;
  cufile       libcufile's driver opened (cuFileDriverOpen) first, as KvikIO does;
  bench-like   all of it plus the benchmark's naive baselines between rounds;
  kvikio-sleep as kvikio, with 1 s of sleep after each KvikIO read;
  kvikio-warm  as kvikio, with an untimed 256 MiB gdscp read after each KvikIO read;
  evict        gdscp only, with a 2 GiB host copy between reads (CPU caches flushed);
  kvikio-32    as kvikio, KvikIO at 32 threads;
  kvikio-8first as kvikio, gdscp at 8 threads before its 16-thread read.
The 2026-11-30 runs (docs/benchmarks.md, fourth session) used alone, kvikio,
cycle, cufile, bench-like (6 runs); alone, kvikio, kvikio-sleep, kvikio-warm,
evict (5 runs); and the list main() has now (4 runs).

    OUT=dir python3 scripts/probe/context_probe.py   # on the GPU machine, after building
"""
import ctypes
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_probe import timed  # noqa: E402

GiB = 1 << 30
PATH, SIZE = "/tmp/gdscp-context.bin", 4 * GiB
OUT = os.environ.get("OUT", ".")
RUNS = 4


def child(context):
    import cupy

    import gdscp

    dev = cupy.empty(SIZE, dtype=cupy.uint8)
    has_kvikio = importlib.util.find_spec("kvikio") is not None
    uses_kvikio = context.startswith("kvikio") or context == "bench-like"
    if uses_kvikio and not has_kvikio:
        print(json.dumps({"error": "no kvikio"}))
        return
    if uses_kvikio:
        import kvikio
        import kvikio.defaults
    if context == "cufile":
        lib = ctypes.CDLL("libcufile.so.0")
        lib.cuFileDriverOpen.restype = ctypes.c_int64
        print("cuFileDriverOpen ->", lib.cuFileDriverOpen(), file=sys.stderr)

    def gd(t):
        with gdscp.defaults.set("num_threads", t):
            f = gdscp.CuFile(PATH)
            r = timed(lambda: f.pread(dev).get(), SIZE)
            f.close()
        return r

    def kv(t):
        with kvikio.defaults.set("num_threads", t):
            f = kvikio.CuFile(PATH, "r")
            r = timed(lambda: f.pread(dev).get(), SIZE)
            f.close()
        return r

    host = np.empty(SIZE, dtype=np.uint8) if context == "bench-like" else None
    if context == "evict":
        scratch_a = np.ones(2 * GiB, dtype=np.uint8)
        scratch_b = np.empty_like(scratch_a)

    counts = (4, 8, 16, 32) if context in ("cycle", "bench-like") else (8, 16) if context == "kvikio-8first" else (16,)
    kv_counts = (32,) if context == "kvikio-32" else counts
    out = {"gdscp": [], "kvikio": []}
    for run in range(RUNS + 1):
        for t in counts:
            r = gd(t)
            if run and t == 16:
                out["gdscp"].append(r)
        if context == "bench-like":
            from bench_gap import baselines  # this folder, on sys.path

            baselines(host, PATH, SIZE)
        if uses_kvikio:
            for t in kv_counts:
                r = kv(t)
                if run and t in (16, 32):
                    out["kvikio"].append(r)
            if context == "kvikio-sleep":
                time.sleep(1.0)
            if context == "kvikio-warm":  # an untimed 256 MiB gdscp read first
                with gdscp.defaults.set("num_threads", 16), gdscp.CuFile(PATH) as f:
                    f.pread(dev[: 256 << 20]).get()
        if context == "evict":  # 2 GiB through the CPU caches between gdscp reads
            np.copyto(scratch_b, scratch_a)
    out["affinity"] = sorted({open(f"/proc/self/task/{t}/status").read().split("Cpus_allowed_list:")[1].split()[0]
                              for t in os.listdir("/proc/self/task")})
    try:
        from cuda.bindings import driver

        out["ctx_flags"] = int(driver.cuCtxGetFlags()[1])
    except Exception as exc:
        out["ctx_flags"] = repr(exc)
    print(json.dumps(out))


def main():
    from gdscp.bench import files

    files.make_file(PATH, SIZE)
    files.warm_cache(PATH)
    contexts = ["alone", "kvikio", "kvikio-32", "kvikio-8first"]
    rows, table = [], {}
    try:
        for rnd in range(2):
            for ctx in (contexts if rnd == 0 else contexts[::-1]):
                proc = subprocess.run([sys.executable, __file__, "--child", ctx],
                                      capture_output=True, text=True, timeout=180)
                if proc.returncode != 0:
                    print(ctx, "failed:", proc.stderr[-1500:], flush=True)
                    continue
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                row = {"round": rnd, "context": ctx, **res}
                rows.append(row)
                print(json.dumps(row), flush=True)
                for tool, rates in res.items():
                    if tool in ("affinity", "ctx_flags"):
                        continue
                    if isinstance(rates, list) and rates:
                        table.setdefault((ctx, tool), []).append(statistics.median(rates))
    finally:
        os.unlink(PATH)
        with open(os.path.join(OUT, "context.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print("\ncontext, tool: round medians (16 threads)")
    for (ctx, tool), meds in table.items():
        print(f"{ctx:11s} {tool:7s}: " + " / ".join(f"{m:.2f}" for m in meds))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
