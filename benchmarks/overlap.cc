// Can this CPU stream weights from memory while it computes integer products on them? (#40)
//
// Why: a 16-row step's products take about the time of reading their weights plus that of
// computing them (benchmarks/README.md), in our GroupProduct and in ONNX Runtime's own integer
// GEMM alike. This separates the hardware from the kernels: two threads walk memory 64 bytes at
// a time and do R vpdpbusd on each line (the line as the unsigned operand, R broadcasts of
// 4 activation bytes from L1 as the signed one, R accumulators in registers), as a product of R
// rows does. Compute alone: the same loop over a 16 KB block held in L1. Stream alone: R = 0.
// Perfect overlap: stream + compute = max(stream, compute); none: their sum.
//
// Table 1, one long walk per thread (256 MB each); table 2, R = 16 in bursts (each thread a
// fresh stretch of `burst` bytes, then both meet, as the nodes of a graph follow each other:
// 576 x 3072 gate/up weights are ~885 KB a thread).
//
//   g++ -O3 -march=native -std=c++17 -pthread benchmarks/overlap.cc -o /tmp/overlap && /tmp/overlap
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 2;
constexpr size_t kBytes = size_t(512) << 20;  // far beyond any cache
constexpr size_t kAll = ~size_t(0);           // line mask: the whole stretch
constexpr size_t kL1 = 255;                   // line mask: 256 lines, 16 KB

// in place (GCC's intrinsic copies the accumulator around every instruction)
inline void dpbusd(__m512i& acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
}

#define NBR_EACH16(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)

// R vpdpbusd a line (R <= 32; 16 accumulators, the second 16 products on the same ones)
template <int R>
__attribute__((noinline)) __m512i walk(const uint8_t* p, size_t lines, size_t mask, const int32_t* x) {
#define NBR_DECLARE(i) __m512i a##i = _mm512_setzero_si512();
  NBR_EACH16(NBR_DECLARE)
  for (size_t l = 0; l < lines; ++l) {
    const __m512i w = _mm512_load_si512(p + (l & mask) * 64);
    if (R == 0) {
      a0 = _mm512_add_epi32(a0, w);
      continue;
    }
    const int32_t* xl = x + (l & 63) * 16;
#define NBR_STEP(i)                                                   \
  if (i < R) dpbusd(a##i, w, _mm512_set1_epi32(xl[i]));               \
  if (i + 16 < R) dpbusd(a##i, w, _mm512_set1_epi32(xl[(i + 1) & 15]));
    NBR_EACH16(NBR_STEP)
  }
#define NBR_SUM(i) a0 = _mm512_add_epi32(a0, a##i);
  NBR_EACH16(NBR_SUM)
  return a0;
}

using Walk = __m512i (*)(const uint8_t*, size_t, size_t, const int32_t*);

struct Memory {
  uint8_t* data;
  std::vector<int32_t> x = std::vector<int32_t>(1024, 0x01020304);
  Memory() : data(static_cast<uint8_t*>(std::aligned_alloc(64, kBytes))) { std::memset(data, 3, kBytes); }
  ~Memory() { std::free(data); }
};

// best of 3, ms: each thread walks `burst` bytes of its own (or its L1 block) `kBytes / burst /
// kThreads` times, meeting the other after each
double timed(const Memory& m, Walk f, size_t burst, size_t mask) {
  const size_t count = kBytes / (burst * kThreads), lines = burst / 64;
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    std::atomic<size_t> arrived{0};
    std::vector<std::thread> threads;
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (size_t b = 0; b < count; ++b) {
          const uint8_t* p = mask == kL1 ? m.data + t * 16384 : m.data + (b * kThreads + t) * burst;
          volatile __m512i sink = f(p, lines, mask, m.x.data());
          (void)sink;
          arrived.fetch_add(1);
          while (arrived.load() < (b + 1) * kThreads) _mm_pause();
        }
      });
    for (auto& thread : threads) thread.join();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main() {
  const Memory m;
  const int rows[] = {0, 1, 4, 8, 12, 16, 24, 32};
  const Walk walks[] = {walk<0>, walk<1>, walk<4>, walk<8>, walk<12>, walk<16>, walk<24>, walk<32>};
  const size_t whole = kBytes / kThreads;
  const double stream = timed(m, walk<0>, whole, kAll);
  std::printf("%d threads, %zu MB; ms\n\n| R | stream + compute | compute alone | stream alone | "
              "max | sum | GB/s |\n|---|---|---|---|---|---|---|\n", kThreads, kBytes >> 20);
  for (int i = 0; i < 8; ++i) {
    const double both = timed(m, walks[i], whole, kAll), alone = timed(m, walks[i], whole, kL1);
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", rows[i], both, alone, stream,
                std::max(stream, alone), stream + alone, kBytes / both / 1e6);
  }
  std::printf("\nR = 16 in bursts\n\n| KB a thread a burst | stream + compute | compute alone | "
              "stream alone |\n|---|---|---|---|\n");
  for (size_t kb : {64, 256, 885, 4096}) {
    const size_t burst = kb << 10;
    std::printf("| %zu | %.1f | %.1f | %.1f |\n", kb, timed(m, walk<16>, burst, kAll),
                timed(m, walk<16>, burst, kL1), timed(m, walk<0>, burst, kAll));
  }
}
