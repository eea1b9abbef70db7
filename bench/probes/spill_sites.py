#!/usr/bin/env python3
"""Where a cubin's kernels spill: each local store and load, by source line.

ptxas -v says how many bytes a kernel spills, not where; a few bytes loaded
once a job cost nothing, the same bytes in a main loop can (bench/NOTES.md
v1.24, v1.56, v2.08). This reads nvdisasm's listing with line info and
prints, per kernel whose name holds every FILTER, its STL / LDL sites as
"file:line" with their counts.
  usage: spill_sites.py X.cubin [FILTER...]
  e.g.:  spill_sites.py narrow.cubin InstantiationE4ELi2 ElementTypeE0
  build: nvcc <the build's flags> -lineinfo -cubin -o X.cubin FILE.cu
  needs: nvdisasm. This repository's machines have nvcc but no nvdisasm or
         cuobjdump; the `nvidia-cuda-nvdisasm` wheel carries one
         (pip download nvidia-cuda-nvdisasm --no-deps, unzip it, and put
         nvidia/cu13/bin on PATH, or set NVDISASM to the binary).
"""
import collections
import os
import re
import subprocess
import sys


def listing(cubin):
    nvdisasm = os.environ.get("NVDISASM", "nvdisasm")
    return subprocess.run([nvdisasm, "-c", "-g", cubin], check=True, capture_output=True, text=True).stdout


def spill_sites(text, filters):
    """{kernel: Counter of (kind, file:line)} for kernels matching every filter."""
    sites = {}
    kernel, where = None, "?"
    for line in text.split("\n"):
        if line.startswith(".text."):
            name = line[len(".text."):].rstrip(":")
            kernel = name if all(f in name for f in filters) else None
            if kernel is not None:
                sites[kernel] = collections.Counter()
            where = "?"
            continue
        if kernel is None:
            continue
        located = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if located:
            where = "%s:%s" % (os.path.basename(located.group(1)), located.group(2))
            continue
        op = re.search(r"\b(STL|LDL)(\.[A-Z0-9]+)*\b", line)
        if op:
            sites[kernel][(op.group(1), where)] += 1
    return sites


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for kernel, counts in spill_sites(listing(sys.argv[1]), sys.argv[2:]).items():
        total = sum(counts.values())
        print("%s: %d local stores / loads%s" % (kernel, total, "" if total else " (none)"))
        for (kind, where), count in sorted(counts.items(), key=lambda item: (item[0][1], item[0][0])):
            print("  %s x%d at %s" % (kind, count, where))


if __name__ == "__main__":
    main()
