#!/usr/bin/env python3
"""Kernels whose SASS loads through the non-coherent path (LDG...CONSTANT: __ldg, ld.global.nc) before their PDL wait
(ACQBULK: griddepcontrol.wait). Loads of constant data there are intended (weights, norm weights, batch metadata);
a load of what the kernel before wrote is a bug: .nc lets ptxas hoist it above the wait, where it may read the bytes
of an earlier op (gemv_q8p_ahead_kernel<1, 8> did, 12-06; such loads now go through ld_act). Compare the counts with
the sources of a listed kernel.

usage: sass-hoist.py OBJECT.o...   (prints: loads before the wait, LDGs after, kernel)"""
import re
import subprocess
import sys


def kernels(obj):
    out = subprocess.run(['cuobjdump', '-sass', obj], capture_output=True, text=True).stdout
    name, lines = None, []
    for line in out.splitlines():
        m = re.search(r'Function : (\S+)', line)
        if m:
            if name:
                yield name, lines
            name, lines = m.group(1), []
        elif re.search(r'/\*[0-9a-f]{4}\*/', line):
            lines.append(line)
    if name:
        yield name, lines


def main():
    for obj in sys.argv[1:]:
        for name, lines in kernels(obj):
            wait = next((i for i, l in enumerate(lines) if 'ACQBULK' in l), None)
            if wait is None:
                continue
            before = sum(1 for l in lines[:wait] if re.search(r'LDG\.[^ ]*CONSTANT', l))
            after = sum(1 for l in lines[wait:] if 'LDG' in l)
            if before:
                demangled = subprocess.run(['c++filt', name], capture_output=True, text=True).stdout.strip()
                print(before, after, demangled[:150])


if __name__ == '__main__':
    main()
