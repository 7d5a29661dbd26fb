#!/usr/bin/env python3
"""Sums an ncu --csv log (metric gpu__time_duration.sum) per kernel and grid: count, total and mean µs.

  python3 bench/ncu_summary.py ncu.csv [--top N]

Kernels of the same name at different grid sizes (one cuBLASLt kernel over several GEMM shapes) are listed
apart, so that each projection's GEMM keeps its own line."""
import csv
import sys
from collections import defaultdict


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own ==PROF== lines are not CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            yield r


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 40
    per = defaultdict(lambda: [0, 0.0])
    total, n = 0.0, 0
    for r in rows(path):
        ns = float(r["Metric Value"].replace(",", ""))  # --print-units base: nanoseconds
        key = (r["Kernel Name"][:90], r["Grid Size"], r["Block Size"])
        per[key][0] += 1
        per[key][1] += ns / 1000
        total += ns / 1000
        n += 1
    print(f"{n} kernels, {total:.1f} us summed (each alone, cold caches)")
    print(f"{'count':>6} {'total us':>10} {'us each':>9}  grid / block  kernel")
    for (name, grid, block), (c, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{c:>6} {us:>10.1f} {us / c:>9.2f}  {grid} / {block}  {name}")


if __name__ == "__main__":
    main()
