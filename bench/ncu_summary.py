#!/usr/bin/env python3
"""Sums an ncu --csv log (metric gpu__time_duration.sum) per kernel and grid: count, total and mean µs, and
where the log has dram__bytes_read.sum too, the bytes each kernel read from memory and their rate (TB/s).

  python3 bench/ncu_summary.py ncu.csv [--top N]

Kernels of the same name at different grid sizes (one cuBLASLt kernel over several GEMM shapes) are listed
apart, so that each projection's GEMM keeps its own line."""
import csv
import sys
from collections import defaultdict


def rows(path, metric="gpu__time_duration.sum"):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own ==PROF== lines are not CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == metric:
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
    read = defaultdict(float)  # bytes from DRAM per key, when the log has them
    for r in rows(path, "dram__bytes_read.sum"):
        read[(r["Kernel Name"][:90], r["Grid Size"], r["Block Size"])] += float(r["Metric Value"].replace(",", ""))
    print(f"{n} kernels, {total:.1f} us summed (each alone, cold caches)")
    extra = f" {'MB each':>9} {'TB/s':>6}" if read else ""
    print(f"{'count':>6} {'total us':>10} {'us each':>9}{extra}  grid / block  kernel")
    for key, (c, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
        name, grid, block = key
        cols = f" {read[key] / c / 1e6:>9.2f} {read[key] / (us * 1e-6) / 1e12:>6.2f}" if read else ""
        print(f"{c:>6} {us:>10.1f} {us / c:>9.2f}{cols}  {grid} / {block}  {name}")


if __name__ == "__main__":
    main()
