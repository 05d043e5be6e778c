"""A tree of many files for the many-files workload and its tests: ``files``
files spread over directories of about 100 each, sizes drawn uniformly from a
range, contents pseudo-random (and different in every file)."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

__all__ = ["Tree", "make_tree", "parse_size_range"]

FILES_PER_DIR = 100


class Tree(NamedTuple):
    root: str
    paths: list[str]  # every file, in creation order
    sizes: list[int]

    @property
    def bytes(self) -> int:
        return sum(self.sizes)


def parse_size_range(text: str, parse) -> tuple[int, int]:
    """``"1K-64K"`` or ``"4K"`` -> (low, high) in bytes; ``parse`` reads one size."""
    low, sep, high = text.partition("-")
    if not low.strip() or (sep and not high.strip()):
        raise ValueError(f"{text!r} is not a size or a range of sizes (SIZE or SIZE-SIZE)")
    lo = parse(low.strip())
    hi = parse(high.strip()) if sep else lo
    if lo > hi:
        raise ValueError(f"{text!r}: the range starts above its end")
    return lo, hi


def make_tree(root: str, files: int, low: int, high: int, seed: int = 0, dirs: int | None = None) -> Tree:
    """Write the tree under ``root`` (created), then sync the filesystem once,
    so that no writeback of it runs during a measurement."""
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(low, high + 1, files)] if files else []
    # One random block, read at a different offset for each file: unlike
    # contents, without generating every byte anew.
    block = rng.integers(0, 256, 2 * max(high, 1) + 8, dtype=np.uint8).tobytes()
    folders = dirs if dirs is not None else max(1, -(-files // FILES_PER_DIR))
    paths = []
    os.makedirs(root, exist_ok=True)
    for d in range(folders):
        os.makedirs(os.path.join(root, f"d{d:03d}"), exist_ok=True)
    for i, size in enumerate(sizes):
        path = os.path.join(root, f"d{i % folders:03d}", f"f{i:06d}.bin")
        start = (i * 7919) % (len(block) - size - 8)
        with open(path, "wb", buffering=0) as f:
            f.write(i.to_bytes(8, "little")[: min(8, size)] + block[start : start + max(size - 8, 0)])
        paths.append(path)
    os.sync()
    return Tree(root, paths, sizes)
