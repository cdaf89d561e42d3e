"""How much of a file sits in the page cache, and dropping it from there (for a cold start from disk).

    python3 bench/gpu/pagecache.py resident FILE     # prints the share of FILE's pages in RAM
    python3 bench/gpu/pagecache.py evict FILE        # writes it back, then drops its cached pages

``evict`` needs no privileges (``posix_fadvise(DONTNEED)`` after ``fsync``), so a start-up measured after
it reads the model from the disk, not from RAM. ``resident`` asks the kernel (``mincore``) page by page.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")
CHUNK = 1 << 30  # map and ask a GiB at a time


def resident(path: str) -> float:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    inside = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for start in range(0, size, CHUNK):
            length = min(CHUNK, size - start)
            base = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
            if base in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), "mmap failed")
            vector = (ctypes.c_ubyte * ((length + PAGE - 1) // PAGE))()
            try:
                if libc.mincore(base, length, vector) != 0:
                    raise OSError(ctypes.get_errno(), "mincore failed")
            finally:
                libc.munmap(base, length)
            inside += sum(byte & 1 for byte in vector)
    finally:
        os.close(fd)
    return inside * PAGE / max(size, 1)


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> int:
    verb, path = sys.argv[1], sys.argv[2]
    if verb == "evict":
        evict(path)
    elif verb != "resident":
        raise SystemExit(f"unknown verb {verb}: resident or evict")
    print(f"{path}: {resident(path):.1%} in the page cache")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
