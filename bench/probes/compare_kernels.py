#!/usr/bin/env python3
"""Compares the machine code of two cubins kernel by kernel.

Each kernel's .text section is read straight from the ELF file (this
repository's machines have nvcc but no cuobjdump), with the anonymous
namespace's per-file tag taken out of its name, so that a change that must
leave the existing kernels alone can be checked to have done so.
  usage: compare_kernels.py OLD.cubin NEW.cubin
  build: nvcc <the build's flags for the file> -cubin -o X.cubin FILE.cu
         (the flags: build/compile_commands.json)
Prints each kernel of OLD as identical, changed (instructions that differ,
16 bytes each) or missing from NEW, then the kernels only NEW has.
"""
import re
import struct
import sys


def kernel_texts(path):
    data = open(path, "rb").read()
    section_table = struct.unpack_from("<Q", data, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    entries = [struct.unpack_from("<IIQQQQ", data, section_table + i * entry_size) for i in range(count)]
    names_offset = entries[names_index][4]
    texts = {}
    for name, _, _, _, offset, size in entries:
        end = data.index(b"\0", names_offset + name)
        section = data[names_offset + name:end].decode()
        if section.startswith(".text."):
            kernel = re.sub(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}", "", section[len(".text."):])
            texts[kernel] = data[offset:offset + size]
    return texts


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = kernel_texts(sys.argv[1]), kernel_texts(sys.argv[2])
    for kernel in sorted(old):
        if kernel not in new:
            print(f"missing   {kernel}")
            continue
        a, b = old[kernel], new[kernel]
        if a == b:
            print(f"identical {kernel}")
            continue
        differ = sum(1 for i in range(0, min(len(a), len(b)), 16) if a[i:i + 16] != b[i:i + 16])
        print(f"changed   {kernel}: {len(a) // 16} -> {len(b) // 16} instructions, {differ} differ")
    for kernel in sorted(set(new) - set(old)):
        print(f"new       {kernel}")


if __name__ == "__main__":
    main()
