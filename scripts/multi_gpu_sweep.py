"""Staging sweep on a machine of two GPUs: hot 4 GiB files loaded into GPU
memory by read_files for each combination of num_threads, bounce_buffer_size
and pipeline_depth, each setting in a new process (the staging is sized when
the module loads). The figures behind the default staging size on two GPUs
(docs/performance.md, bounce_buffer_size and pipeline_depth).

    python scripts/multi_gpu_sweep.py OUT.json [--dir DIR] [--threads 16,24,32]
        [--bounce 512K,1M,2M,4M] [--depth 2]

Per setting, the median of 5 timed loads after one untimed one, in GB/s:
  one  one file into GPU 0
  d2   two files, one into each GPU (read_files over devices=[0, 1])
  d4   the two files twice each, two per GPU, in one job
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys

GiB = 1 << 30


def child(paths: list[str]) -> None:
    from gdscp import defaults, memory
    from gdscp.bench.multi import _time as time_job  # the multi-GPU benchmark's timing: waits, refuses failures
    from gdscp.bulk import read_files

    bufs = [[memory.allocate(4 * GiB, d) for d in (0, 1)] for _ in range(2)]
    jobs = {
        "one": (lambda: read_files(paths[:1], [bufs[0][0]]), 4 * GiB),
        "d2": (lambda: read_files(paths, [bufs[0][0], bufs[0][1]], devices=[0, 1]), 8 * GiB),
        "d4": (lambda: read_files(paths * 2, [bufs[0][0], bufs[0][1], bufs[1][0], bufs[1][1]], devices=[0, 1]),
               16 * GiB),
    }
    out = {"num_threads": defaults.get("num_threads"), "bounce_buffer_size": defaults.get("bounce_buffer_size"),
           "pipeline_depth": defaults.get("pipeline_depth")}
    for name, (job, nbytes) in jobs.items():
        time_job(job)  # untimed: what a first load makes
        out[name] = round(statistics.median(nbytes / time_job(job) / 1e9 for _ in range(5)), 2)
    print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--threads", default="16,24,32")
    ap.add_argument("--bounce", default="512K,1M,2M,4M")
    ap.add_argument("--depth", default="2")
    args = ap.parse_args()
    from gdscp.bench.files import make_file, warm_cache

    paths = [os.path.join(args.dir, f".gdscp-sweep-{os.getpid()}-{i}.bin") for i in range(2)]
    records = []
    try:
        for i, p in enumerate(paths):
            make_file(p, 4 * GiB, seed=i)
            warm_cache(p)
        for threads, bounce, depth in itertools.product(args.threads.split(","), args.bounce.split(","),
                                                        args.depth.split(",")):
            env = dict(os.environ, GDSCP_NUM_THREADS=threads, GDSCP_BOUNCE_BUFFER_SIZE=bounce,
                       GDSCP_PIPELINE_DEPTH=depth)
            done = subprocess.run([sys.executable, __file__, "--child", *paths], env=env, capture_output=True,
                                  text=True, timeout=120)
            if done.returncode:
                print(f"threads {threads}, bounce {bounce}, depth {depth}: {done.stderr.strip()[-300:]}",
                      file=sys.stderr)
                continue
            record = json.loads(done.stdout.strip().splitlines()[-1])
            records.append(record)
            print(f"threads {threads:>3}  bounce {bounce:>5}  depth {depth}:  one {record['one']:7.2f}  "
                  f"d2 {record['d2']:7.2f}  d4 {record['d4']:7.2f} GB/s", flush=True)
    finally:
        for p in paths:
            with contextlib.suppress(OSError):
                os.unlink(p)
    with open(args.out, "w") as f:
        json.dump({"sweep": "multi_gpu_staging", "records": records}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
