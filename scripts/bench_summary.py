"""Summarise `gdscp benchmark --json` documents, one line per measurement:
gdscp's best figure (and the figure at its default thread count) beside KvikIO's
best and the machine's ceiling from the same run, with the ratios.

    python scripts/bench_summary.py bench-gpu.json bench-host.json ...

Sequential modes: GB/s, "xN" = gdscp / KvikIO, "-> S" = gdscp / ceiling.
Random reads: median latency (p50, p99), "gdscp/kvikio" below 1 means gdscp is faster;
the same against plain Python (readinto, + one copy to the GPU) and a bare os.preadv.
"fresh": into a new numpy.empty each run, never touched before.
"""

import json
import sys


def main(paths: list[str]) -> int:
    for path in paths:
        try:
            doc = json.load(open(path))
        except (OSError, ValueError) as e:
            print(f"{path}: unreadable ({e})")
            continue
        if not doc.get("ok", True):
            print(f"{path}: failed: {doc.get('error')}")
            continue
        default_threads = doc["gdscp"]["settings"]["num_threads"]
        memory = doc["config"]["memory"]
        settings = doc["gdscp"]["settings"]
        print(f"== {path} ({memory}, {doc['config']['size'] >> 20} MiB, {doc['date']}; "
              f"num_threads {default_threads}, direct_io {settings.get('direct_io')}, "
              f"mapped_reads {settings.get('mapped_reads')})")
        for row in doc["summary"]:
            best = row["best"]
            g, k = best.get("gdscp", {}), best.get("kvikio")
            buffer = row.get("buffer", "touched")
            what = f"{row['mode']:<8} {row['cache'] or '':<4} {row['io_size'] or '':<8}"
            what += " fresh  " if buffer == "fresh" else "        "
            default = [
                r for r in doc["results"]
                if r["tool"] == "gdscp" and r["mode"] == row["mode"] and r["cache"] == row["cache"]
                and r["io_size"] == row["io_size"] and r["threads"] == default_threads
                and r.get("buffer", "touched") == buffer
            ]
            if row["mode"] == "randread":
                line = f"{what} gdscp p50 {g.get('p50_us')} p99 {g.get('p99_us')} us"
                if k:
                    line += f" | kvikio p50 {k['p50_us']} us | gdscp/kvikio {g['p50_us'] / k['p50_us']:.2f}"
                for peer in ("python", "preadv"):
                    p = best.get(peer)
                    if p and p.get("p99_us") and g.get("p99_us"):
                        line += (f" | {peer} p50 {p['p50_us']} p99 {p['p99_us']} us,"
                                 f" gdscp/{peer} {g['p50_us'] / p['p50_us']:.2f} / {g['p99_us'] / p['p99_us']:.2f}")
            else:
                line = f"{what} gdscp {g.get('gb_per_s')} GB/s ({g.get('threads')} thr)"
                if default:
                    line += f" | default {default[0]['gb_per_s']['median']}"
                if k:
                    line += f" | kvikio {k['gb_per_s']} ({k['threads']} thr) x{g['gb_per_s'] / k['gb_per_s']:.3f}"
                if row.get("ceiling"):
                    c = row["ceiling"]
                    line += f" | {c['name']} {c['gb_per_s']} -> {row['share_of_ceiling']:.3f}"
            print(line)
        ceilings = {n: c["gb_per_s"]["median"] for n, c in doc["ceilings"].items() if c.get("available")}
        print("   ceilings:", ceilings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
