"""Run a benchmark script as if on an older CPU: without AVX-512 (an AVX2-only CPU), or with
AVX-512 but without VNNI (Skylake's).

Why: the recipes' peers dispatch at run time. MLAS (ONNX Runtime's kernels behind `fused-q8`),
numpy and PyTorch read CPUID and pick their code from it, so on a newer CPU their speed on an
older one cannot be timed; and our operators choose at compile time (`-march=native`). Here
CPUID itself is made to fault (Linux `arch_prctl(ARCH_SET_CPUID, 0)`, on CPUs with the
`cpuid_fault` flag) and a SIGSEGV handler answers it with leaf 7's bits for the hidden features
cleared (``avx512``: every AVX-512 bit, VNNI and AVX-VNNI; ``vnni``: AVX512-VNNI and AVX-VNNI),
before those libraries are imported; our operators are built with `-mno-avx512f` or
`-mno-avx512vnni`. Not changed: code compiled for this CPU ahead of time (llama-cpp-python's
library keeps what it was built with), so its figures in such a run are not the older CPU's.

    python benchmarks/cpu_without.py avx512 benchmarks/decode.py --recipes fused-int8-kernel ...
    python benchmarks/cpu_without.py vnni benchmarks/score.py --recipes fused-int8-kernel ...
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
static int keep_avx512 = 0; /* 1: hide VNNI only */
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
  if (leaf == 7 && sub == 0 && keep_avx512) c &= ~(1u << 11); /* AVX512-VNNI */
  if (leaf == 7 && sub == 0 && !keep_avx512) { /* AVX-512 F, DQ, IFMA, PF, ER, CD, BW, VL; ... */
    b &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) |
           (1u << 30) | (1u << 31));
    c &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
    d &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 23));
  }
  if (leaf == 7 && sub == 1) a &= ~((1u << 4) | (keep_avx512 ? 0u : 1u << 5)); /* AVX-VNNI, BF16 */
  r[REG_RAX] = a, r[REG_RBX] = b, r[REG_RCX] = c, r[REG_RDX] = d;
  r[REG_RIP] += 2;
  ++answered;
}

int hide(int vnni_only) {
  keep_avx512 = vnni_only;
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, 0);
  return (int)cpuid_faults(1);
}

int answered_calls(void) { return answered; }
"""


# what each hidden feature leaves, for our operators' build
FLAGS = {"avx512": "-mno-avx512f", "vnni": "-mno-avx512vnni"}


def hide(feature: str, folder: Path) -> ctypes.CDLL:
    """CPUID answered without ``feature`` from now on, in this process and its threads."""
    if "cpuid_fault" not in Path("/proc/cpuinfo").read_text():
        raise SystemExit("this CPU cannot make CPUID fault (no cpuid_fault flag)")
    source, library = folder / "cpu_without.c", folder / "libcpu_without.so"
    source.write_text(_SOURCE)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
    loaded = ctypes.CDLL(str(library))
    if loaded.hide(int(feature == "vnni")) != 0:
        raise SystemExit("arch_prctl(ARCH_SET_CPUID) refused")
    return loaded


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in FLAGS:
        raise SystemExit(__doc__)
    feature = sys.argv.pop(1)
    with tempfile.TemporaryDirectory(prefix="cpu-without-") as tmp:
        handler = hide(feature, Path(tmp))
        from nbresponses.models import kernels  # numpy: imported after the mask

        built = kernels.library(flags=(FLAGS[feature],))
        kernels.library = lambda *args, **kwargs: built  # every session of this process
        script = Path(sys.argv[1])
        sys.argv = sys.argv[1:]
        sys.path.insert(0, str(script.parent))
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            print(f"CPUID answered without {feature} {handler.answered_calls()} times", flush=True)


if __name__ == "__main__":
    main()
