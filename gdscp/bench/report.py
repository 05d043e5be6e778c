"""Comparisons inside a benchmark result: each figure against the machine's
ceiling and gdscp against each baseline; the best of each tool per measurement.

Definitions (also in docs/benchmark-json.md):

* ``share_of_ceiling`` = median GB/s / ceiling's median GB/s, for sequential
  reads and writes (random reads are latency-bound and have none).
* ``factor[baseline]`` = how many times faster gdscp is: for sequential modes
  gdscp's median GB/s / the baseline's median GB/s; for random reads the
  baseline's median p50 latency / gdscp's. Against KvikIO the same thread count
  is compared; against single-threaded baselines, each gdscp row is compared
  with the one baseline figure. Above 1 means gdscp is faster.
* ``factor_p99[baseline]`` (random reads) = the same with p99 latencies.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["compare", "ceiling_for", "BASELINES"]

BASELINES = ("python", "numpy_cupy", "kvikio", "preadv")


def _median(entry: Optional[dict], key: str = "gb_per_s") -> Optional[float]:
    if not entry or not entry.get("available", True):
        return None
    value = entry.get(key)
    return None if value is None else value.get("median")


def ceiling_for(document: dict, mode: str, cache: Optional[str]) -> Optional[dict]:
    """``{"name", "gb_per_s"}`` of the ceiling that bounds ``mode``/``cache``, or None."""
    ceilings = document.get("ceilings", {})
    memory = document.get("config", {}).get("memory")
    if mode == "read" and cache == "hot":
        names = ["pinned_h2d"] if memory == "gpu" else ["host_memcpy", "page_cache_read"]
    elif mode == "read" and cache == "cold":
        names = ["disk_direct_read", "disk_buffered_read"]
    elif mode == "write":
        names = ["disk_direct_write", "disk_buffered_write"]
    else:
        return None
    found = [(name, _median(ceilings.get(name))) for name in names]
    found = [(name, gb_per_s) for name, gb_per_s in found if gb_per_s]
    if not found:
        return None
    name, gb_per_s = max(found, key=lambda item: item[1])
    return {"name": name, "gb_per_s": gb_per_s}


def _key(record: dict) -> tuple:
    return (record["mode"], record["cache"], record["io_size"], record.get("buffer", "touched"))


def _speed(record: dict, percentile: str = "p50") -> Optional[float]:
    """Bigger is better: GB/s for sequential modes, 1/p50 (or 1/p99) for random reads."""
    if record["mode"] == "randread":
        latency = record.get("latency_us", {}).get(percentile, {}).get("median")
        return 1.0 / latency if latency else None
    return record["gb_per_s"]["median"] or None


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4)


def compare(document: dict) -> dict:
    """Add ``ceiling``, ``share_of_ceiling`` and (gdscp records) ``factor`` to
    every record of ``document["results"]``, and ``document["summary"]``: per
    measurement, each tool's best figure and gdscp's best against the others."""
    results = document["results"]
    by_key: dict[tuple, list[dict]] = {}
    for record in results:
        by_key.setdefault(_key(record), []).append(record)

    for key, records in by_key.items():
        ceiling = ceiling_for(document, key[0], key[1])
        for record in records:
            record["ceiling"] = ceiling["name"] if ceiling else None
            record["share_of_ceiling"] = _round(record["gb_per_s"]["median"] / ceiling["gb_per_s"]) if ceiling else None
        for record in records:
            if record["tool"] != "gdscp":
                continue
            mine = _speed(record)
            factor = {}
            factor_p99 = {}
            for baseline in BASELINES:
                peers = [r for r in records if r["tool"] == baseline]
                if baseline == "kvikio":
                    peers = [r for r in peers if r["threads"] == record["threads"]]
                theirs = _speed(peers[0]) if peers else None
                factor[baseline] = _round(mine / theirs) if mine and theirs else None
                if record["mode"] == "randread":
                    mine99, theirs99 = _speed(record, "p99"), _speed(peers[0], "p99") if peers else None
                    factor_p99[baseline] = _round(mine99 / theirs99) if mine99 and theirs99 else None
            record["factor"] = factor
            if record["mode"] == "randread":
                record["factor_p99"] = factor_p99

    summary = []
    for key, records in by_key.items():
        mode, cache, io_size, buffer = key
        best: dict[str, dict] = {}
        for record in records:
            speed = _speed(record)
            if speed is None:
                continue
            current = best.get(record["tool"])
            if current is None or speed > _speed(current):
                best[record["tool"]] = record
        ceiling = ceiling_for(document, mode, cache)
        row: dict = {
            "mode": mode,
            "cache": cache,
            "io_size": io_size,
            "buffer": buffer,
            "best": {
                tool: {
                    "threads": r["threads"],
                    "gb_per_s": r["gb_per_s"]["median"],
                    **(
                        {"p50_us": r["latency_us"]["p50"]["median"], "p99_us": _median(r["latency_us"], "p99")}
                        if "latency_us" in r
                        else {}
                    ),
                }
                for tool, r in best.items()
            },
            "ceiling": ceiling,
            "share_of_ceiling": None,
            "factor": {},
        }
        mine = best.get("gdscp")
        if mine is not None:
            if ceiling:
                row["share_of_ceiling"] = _round(mine["gb_per_s"]["median"] / ceiling["gb_per_s"])
            for baseline in BASELINES:
                theirs = best.get(baseline)
                row["factor"][baseline] = _round(_speed(mine) / _speed(theirs)) if theirs else None
            if mode == "randread":
                row["factor_p99"] = {
                    baseline: _round(_speed(mine, "p99") / _speed(best[baseline], "p99"))
                    if baseline in best and _speed(mine, "p99") and _speed(best[baseline], "p99")
                    else None
                    for baseline in BASELINES
                }
        summary.append(row)
    document["summary"] = summary
    return document
