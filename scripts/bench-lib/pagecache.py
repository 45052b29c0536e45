#!/usr/bin/env python3
"""Puts a backing file's page cache in a known state before a benchmark job.

    pagecache.py small FILE   write back, drop the file's cached pages, then read the whole
                              file back with readahead off: every page cached, in 4 KiB folios
    pagecache.py drop FILE    write back and drop the file's cached pages (cold cache)

Why: on kernels with large folios in the page cache (ext4 since 6.16, this VM runs 6.18) the
size of the folios a file is cached in depends on the size of the writes or reads that
brought it in, and 4 KiB random writes into large folios run at about half the speed of
writes into 4 KiB folios (measured here: 20k vs 45k IOPS at QD1, 32k vs 150k at QD32, same
server, same file). A server that writes its precondition pass in 1 MiB pieces (nbdkit-file,
sealdisk) would otherwise be measured on a different cache than one that writes 512-byte
sectors one at a time (nbdkit's luks filter). Needs no privileges: posix_fadvise on a file
one may read.
"""
import os
import sys

CHUNK = 1 << 20


def main(mode, path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)  # dirty pages are not dropped by DONTNEED; write them back first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if mode == "small":
            # FADV_RANDOM turns readahead off for this open file only: each read brings in
            # exactly the pages it asks for, as order-0 folios.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            size = os.fstat(fd).st_size
            buf = bytearray(CHUNK)
            off = 0
            while off < size:
                n = os.preadv(fd, [buf], off)
                if n <= 0:
                    break
                off += n
    finally:
        os.close(fd)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("small", "drop"):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
