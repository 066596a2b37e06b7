"""The CPU profiler keeps freed memory in the process: a step's megabyte buffers come from the
heap, not from fresh mmaps that the OS zero-fills again every step."""

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import ctypes, ctypes.util, sys
    import numpy as np
    from calibrate.host_allocator import keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = MallInfo2

    def mmapped_while_held(num_bytes):
        before = libc.mallinfo2().hblkhd
        buffer = np.ones(num_bytes // 8)
        grown = libc.mallinfo2().hblkhd - before
        del buffer
        return grown

    if sys.argv[1] == "kept":
        print(keep_freed_memory())
    print(mmapped_while_held(16 << 20))
""")


def _run(mode: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                          check=True)
    return done.stdout.split("\n")[:-1]


def test_a_step_sized_buffer_comes_from_the_heap_once_freed_memory_is_kept():
    # glibc's default: a 16 MiB buffer is its own mmap (so freeing it unmaps it)
    assert int(_run("default")[-1]) >= 16 << 20
    said, mmapped = _run("kept")
    assert said.startswith("glibc, freed memory kept")
    assert int(mmapped) == 0
