"""Run a benchmark script as if on a CPU without AVX-512: what an AVX2-only CPU runs.

Why: the recipes' peers dispatch at run time. MLAS (ONNX Runtime's kernels behind `fused-q8`)
and numpy read CPUID and pick AVX-512 code where the CPU has it, so on an AVX-512 machine their
AVX2 speed cannot be timed; and our operators choose at compile time (`-march=native`). Here
CPUID itself is made to fault (Linux `arch_prctl(ARCH_SET_CPUID, 0)`, on CPUs with the
`cpuid_fault` flag) and a SIGSEGV handler answers it with leaf 7's AVX-512, VNNI and AVX-VNNI
bits cleared, before ONNX Runtime or numpy is imported; our operators are built with
`-mno-avx512f`. Not changed: code compiled for this CPU ahead of time (llama-cpp-python's
library keeps its AVX-512), so its figures in such a run are not an AVX2 CPU's.

    python benchmarks/avx2_cpu.py benchmarks/decode.py --recipes fused-int8-kernel fused-q8 ...
    python benchmarks/avx2_cpu.py benchmarks/score.py --recipes fused-int8-kernel fused-q8 ...
"""

from __future__ import annotations

import ctypes
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

# The handler: CPUID at the faulting address is run with faulting off, its answer masked, and
# the instruction skipped; any other SIGSEGV goes back to the default action (a crash).
_SOURCE = r"""
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static int answered = 0;
static long cpuid_faults(int on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, !on); }

static void on_segv(int sig, siginfo_t* info, void* context) {
  (void)sig, (void)info;
  greg_t* r = ((ucontext_t*)context)->uc_mcontext.gregs;
  const uint8_t* ip = (const uint8_t*)r[REG_RIP];
  if (ip[0] != 0x0f || ip[1] != 0xa2) {
    signal(SIGSEGV, SIG_DFL);
    return;
  }
  uint32_t a = (uint32_t)r[REG_RAX], b, c = (uint32_t)r[REG_RCX], d;
  const uint32_t leaf = a, sub = c;
  cpuid_faults(0);
  __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
  cpuid_faults(1);
  if (leaf == 7 && sub == 0) {  /* AVX-512 F, DQ, IFMA, PF, ER, CD, BW, VL; VBMI(2), VNNI, ... */
    b &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) |
           (1u << 30) | (1u << 31));
    c &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
    d &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 23));
  }
  if (leaf == 7 && sub == 1) a &= ~((1u << 4) | (1u << 5)); /* AVX-VNNI, AVX512-BF16 */
  r[REG_RAX] = a, r[REG_RBX] = b, r[REG_RCX] = c, r[REG_RDX] = d;
  r[REG_RIP] += 2;
  ++answered;
}

int hide_avx512(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, 0);
  return (int)cpuid_faults(1);
}

int answered_calls(void) { return answered; }
"""


def hide_avx512(folder: Path) -> ctypes.CDLL:
    """CPUID answered without AVX-512 from now on, in this process and the threads it starts."""
    if "cpuid_fault" not in Path("/proc/cpuinfo").read_text():
        raise SystemExit("this CPU cannot make CPUID fault (no cpuid_fault flag)")
    source, library = folder / "avx2_cpu.c", folder / "libavx2_cpu.so"
    source.write_text(_SOURCE)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
    loaded = ctypes.CDLL(str(library))
    if loaded.hide_avx512() != 0:
        raise SystemExit("arch_prctl(ARCH_SET_CPUID) refused")
    return loaded


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    with tempfile.TemporaryDirectory(prefix="avx2-cpu-") as tmp:
        handler = hide_avx512(Path(tmp))
        from nbresponses.models import kernels  # numpy: imported after the mask, AVX2 code

        built = kernels.library(flags=("-mno-avx512f",))
        kernels.library = lambda *args, **kwargs: built  # every session of this process
        script = Path(sys.argv[1])
        sys.argv = sys.argv[1:]
        sys.path.insert(0, str(script.parent))
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            print(f"CPUID answered without AVX-512 {handler.answered_calls()} times", flush=True)


if __name__ == "__main__":
    main()
