"""tests/test_simt.py — the SIMT emulator's checkers (simt/) on kernels with one planted
bug each (build/tests/test_simt --case NAME): every case must fail (exit 3) with the report that
names the bug, the kernel and its source line. The fragment tables and the other positive checks
run as the C test build/tests/test_simt itself."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "tests", "test_simt")

pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason="no SIMT build (nvcc or clang++ missing)")

# case -> what the report must say (kernel findings also name the kernel and a test_simt.cpp line)
CASES = {
    "race": "shared-memory race: read of offset",
    "uninit": "read of shared memory that no thread of this block wrote",
    "partial-barrier": "barrier reached by only part of the block: 32 of 64 threads exited",
    "divergent-barrier": "wait at different barriers",
    "shfl-exited": "shuffle with mask 0xffffffff: lane 31 has exited",
    "global-oob": "invalid global read of 4 bytes",
    "zero-fill-oob": "invalid global write of 16 bytes",   # stores clang would merge into a memset
    "use-after-free": "(freed)",
    "dyn-shared-oob": "past the launch's 64 bytes of dynamic shared memory",
    "misaligned": "misaligned global read of 4 bytes",
    "async-early": "read of a cp.async destination before its group was waited for",
    "async-race": "shared-memory race: cp.async of offset",
    "host-deref": "host code read of 4 bytes of device memory",
    "smem-attribute": "over the 49152 allowed (cudaFuncSetAttribute raises it)",
    "grid-y": "y and z in [1, 65535]",
    "capture-sync": "cudaErrorStreamCaptureUnsupported",
    "ldmatrix-global": "ldmatrix row address",   # ... is not shared memory
    "cp-async-src-shared": "cp.async source",     # ... is not global memory
    "ldnc-shared": "ld.global.nc address",        # ... is not global memory
    "wgmma-changed": "read by wgmma.mma_async changed before the wait_group that completes it",
    "wgmma-desc-oob": "names shared address 8192, outside this block's shared memory",
    "wgmma-desc-partial": "reaches past this block's shared memory",
    "wgmma-warpgroup": "wgmma.mma_async in a block of 96 threads: not whole warpgroups of 128",
}
# the second half of each report the cases above abbreviate (an address sits between)
TAILS = {"ldmatrix-global": "is not shared memory", "cp-async-src-shared": "is not global memory",
         "ldnc-shared": "is not global memory"}
KERNEL_FINDINGS = {"race", "uninit", "partial-barrier", "divergent-barrier", "shfl-exited", "global-oob", "zero-fill-oob",
                   "use-after-free", "dyn-shared-oob", "misaligned", "async-early", "async-race",
                   "ldmatrix-global", "cp-async-src-shared", "ldnc-shared",
                   "wgmma-changed", "wgmma-desc-oob", "wgmma-desc-partial", "wgmma-warpgroup"}


def test_every_case_is_listed():
    p = subprocess.run([BIN, "--list"], capture_output=True, text=True, timeout=30)
    assert sorted(p.stdout.split()) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_planted_bug_is_reported(case):
    p = subprocess.run([BIN, "--case", case], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr[-2000:])
    assert CASES[case] in p.stderr, p.stderr[-2000:]
    assert TAILS.get(case, "") in p.stderr, p.stderr[-2000:]
    assert "no finding" not in p.stdout
    if case in KERNEL_FINDINGS:
        first = p.stderr.split("simt: ")[1]   # the first report: kernel, launch site, source line
        assert re.search(r"kernel \w+_kernel, launched at tests/test_simt.cpp:\d+, block \(0,0,0\)", first), first
        assert re.search(r"\n  at [^\n]*(\n     inlined into [^\n]*)*test_simt.cpp:\d+", first), first
