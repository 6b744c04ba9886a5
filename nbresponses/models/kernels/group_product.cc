// GroupProduct (domain ai.nbresponses): x @ W with int8 weights and int8 activations, each
// with one scale per group of input channels, and the few channels kept apart in fp32.
//
// Why: the integer recipe's one scale a row and a column loses most on the MLP's down
// projections, so they were kept in fused-q8's 8-bit blocks of 32 (MatMulNBits, accuracy level
// 4), the largest item of a prefill: 82 of 363 ms on the bundled model, ~0.24 int8 TOPS where
// the other products' u8 x s8 GEMM runs ~0.7. Groups as ONNX operators (a Split, a quantizer
// and a product per group, then the sums) were as faithful but one-row steps 34% slower
// (benchmarks/README.md). Here: one node, the groups' sums in VNNI's vpdpbusd, each group's
// scale applied once per group, not per product. It also beat the per-row path (QuantizeRows,
// MLAS's MatMulIntegerToFloat, OutlierProduct) on the other products, and is more faithful
// there too, so fused-int8-kernel computes every product with it.
//
// Exactness: a row's quantization reads that row only; each group's sum of products is exact
// in int32; each output element is one fixed chain, out = fma(float(sum_g), s_g * w_g, out) for
// g = 0, 1, ... (s_g: the row's scale of group g, w_g: the column's), then the apart channels
// as OutlierProduct adds them (acc = fma(picked[k], w[k], acc), then out + acc). The VNNI code
// and the byte products of builds without VNNI (AVX2's, AVX-512's) compute the same bits, for
// any rows and threads.
//
// Inputs: x [..., K] float; apart [n] int64 (channels multiplied in fp32, left out of the
// groups' scales); weight uint8 [N16 / 16, K / 4, 64]: the int8 weights plus 128 (vpdpbusd's
// unsigned operand; the rows' int8 values are its signed one, so the zero point's share, 128
// times the sum of a row's group, is the row's to subtract, not a column's), N16: N rounded up
// to 16, the padding 128 (zero); each 64 bytes: 4 channels of 16 columns, a column's 4
// together; scales bfloat16 [K / group, N16]; apart_weight bfloat16 [N16 / 16, n, 16] (the
// apart channels' weight rows, 16 columns at a time: a tile reads them in one run, not n rows
// a whole row of columns apart, which one-row steps waited on), multiplied in fp32. Why
// bfloat16: a one-row step streams every weight once and waits on memory; the scales and apart
// rows in fp32 were 100 of a column's 676 bytes (K 576), now 50, and bfloat16 widens to fp32
// exactly (a shift), holds any scale's range, and holds a bfloat16 model's weights as they
// are. Attributes: group (a
// multiple of 4 dividing K), columns (N), optional split (a multiple of 16 below N). Output
// [..., N] float; with split, two: the columns before split and those from it on (the MLP's
// gate and up, written apart rather than copied apart by a Split after the product).
//
// Constant weights (a prepared graph's initializers) are read from a copy in 2 MB pages
// (``Pages``), made when the kernel is created: ONNX Runtime maps each initializer from the
// weights file in 4 KB pages, one mapping each, and a step that streams every weight then
// crosses a page, a TLB miss and a restarted hardware prefetch, every 4 KB (bundled model,
// graph_ab.py, three pairs: one row 6.18-7.09 against 6.84-7.84 ms, 16 rows level to 6% faster;
// benchmarks/README.md). The same bytes: the same bits.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include "simd.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using namespace nbr;

constexpr float kInv127 = static_cast<float>(1.0 / 127.0);
constexpr int64_t kInline = 1 << 16;  // products below which one thread does them all
constexpr int64_t kRowBlock = 48;     // rows a work item takes (a prompt's run: balance)
constexpr int64_t kColumnBlock = 96;  // columns a work item takes (six vectors of 16)
constexpr int64_t kRows = 4;          // rows a tile takes at most
constexpr int64_t kStepTiles = 4;     // row tiles of a block that share out the next prefetch
constexpr int kByteRows = 4;          // rows a tile of byte products takes (builds without VNNI)

struct Job {
  const float* x;
  const int64_t* apart;
  const float* keep;  // 1 or 0 per channel
  const uint8_t* weight;
  const uint16_t* scales;        // bfloat16
  const uint16_t* apart_weight;  // bfloat16
  int8_t* q;          // [rows, K]
  float* row_scale;   // [rows, groups]
  int32_t* shares;    // [rows, groups]: 128 times the sum of the group's int8 values
  float* picked;   // [rows, n]
  float* out;      // [rows, split]: the columns before split (none when split is 0)
  float* second;  // [rows, N - split]: the columns from split on
  int64_t rows, K, N, N16, n, group, groups, row_blocks, column_blocks, split;

  // where column ``column`` of ``row`` goes, and how many columns its output has from there
  float* at(int64_t row, int64_t column, int64_t* left) const {
    if (column < split) {
      *left = split - column;
      return out + row * split + column;
    }
    *left = N - column;
    return second + row * (N - split) + column - split;
  }
};

// One row: per group, scale = max |x| over the group's channels not apart times 1/127, and
// int8 = round(x / scale) (half to even) clamped to [-127, 127]; a group of zeros gets scale 0
// and zeros. Vectors and the scalar tail compute each element alike.
void quantize_row(void* data, size_t index) {
  const auto& j = *static_cast<const Job*>(data);
  const int64_t row = static_cast<int64_t>(index);
  const float* x = j.x + row * j.K;
  int8_t* q = j.q + row * j.K;
  for (int64_t g = 0; g < j.groups; ++g) {
    const int64_t begin = g * j.group, end = begin + j.group;
    const int64_t full = begin + j.group / kLanes * kLanes;
    Vec peaks = zero();
    for (int64_t k = begin; k < full; k += kLanes)
      peaks = max(abs(mul(load(x + k), load(j.keep + k))), peaks);  // a NaN: skipped
    alignas(64) float lanes[kLanes];
    store(lanes, peaks);
    float peak = 0.f;
    for (int i = 0; i < kLanes; ++i) peak = lanes[i] > peak ? lanes[i] : peak;  // any order
    for (int64_t k = full; k < end; ++k) {
      const float a = std::fabs(x[k] * j.keep[k]);
      peak = a > peak ? a : peak;
    }
    const float scale = peak * kInv127;
    j.row_scale[row * j.groups + g] = scale;
    if (!(scale > 0.f)) {
      std::memset(q + begin, 0, static_cast<size_t>(j.group));
      j.shares[row * j.groups + g] = 0;
      continue;
    }
    const Vec scales = broadcast(scale), low = broadcast(-127.f), high = broadcast(127.f);
    Vec sums = zero();  // integers far below 2^24: exact as floats, in any order
    for (int64_t k = begin; k < full; k += kLanes) {
      const Vec v = round(min(max(div(mul(load(x + k), load(j.keep + k)), scales), low), high));
      store_signed_bytes(q + k, v);
      sums = add(sums, v);
    }
    store(lanes, sums);
    int32_t sum = 0;
    for (int i = 0; i < kLanes; ++i) sum += static_cast<int32_t>(lanes[i]);
    for (int64_t k = full; k < end; ++k) {
      float v = x[k] * j.keep[k] / scale;
      v = v > -127.f ? v : -127.f;
      v = v < 127.f ? v : 127.f;
      q[k] = static_cast<int8_t>(std::nearbyint(v));
      sum += q[k];
    }
    j.shares[row * j.groups + g] = 128 * sum;
  }
  for (int64_t i = 0; i < j.n; ++i) j.picked[row * j.n + i] = x[j.apart[i]];
}

#if defined(__AVX512F__)
// 16 bfloat16 values widened to fp32, exactly
inline __m512 widen16(const uint16_t* p) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
// acc += the dot products of 4 unsigned bytes of u and 4 signed bytes of s per lane, in place:
// GCC's _mm512_dpbusd_epi32 copies the accumulator to a new register and back around every
// instruction (and spilled a 4 x 4 tile's sums to the stack), which halved the throughput
inline void dpbusd(__m512i& acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
}

// R rows x C vectors of 16 columns (rows r0.., column vectors v0..), whole (``next``: weights
// to prefetch into L2 as it goes, C vectors' worth, or nullptr; with Slice, only the first
// ``lines`` 64-byte lines from ``next``): per group its int32
// sums in registers, then its scaled sum added to the fp32 outputs, also in registers (no pass
// through memory per group), then the apart channels (every element's own chain over k), added
// to the groups' sum, stored.
template <int R, int C, bool Slice>  // not inlined: a prompt's prefill ran 3% slower inlined
__attribute__((noinline)) void tile(const Job& j, int64_t r0, int64_t v0, const uint8_t* next,
                                    int64_t lines) {
  const int64_t quads = j.K / 4, group_quads = j.group / 4;
  const int8_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = j.q + (r0 + r) * j.K;
  const uint8_t* w[C];
  for (int c = 0; c < C; ++c) w[c] = j.weight + (v0 + c) * quads * 64;
  __m512 out[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm512_setzero_ps();
  for (int64_t g = 0; g < j.groups; ++g) {
    __m512i acc[R][C];
    for (int r = 0; r < R; ++r) {  // start from minus the zero point's share
      const __m512i start = _mm512_set1_epi32(-j.shares[(r0 + r) * j.groups + g]);
      for (int c = 0; c < C; ++c) acc[r][c] = start;
    }
    for (int64_t t = g * group_quads; t < (g + 1) * group_quads; ++t) {
      __m512i wv[C];
      if (next != nullptr)
        for (int c = 0; c < C; ++c)
          if (!Slice || c * quads + t < lines)  // (a prompt's tiles: no test in their loop)
            _mm_prefetch(reinterpret_cast<const char*>(next + (c * quads + t) * 64), _MM_HINT_T1);
      for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_si512(w[c] + t * 64);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, x[r] + t * 4, 4);
        const __m512i xb = _mm512_set1_epi32(four);
        for (int c = 0; c < C; ++c) dpbusd(acc[r][c], wv[c], xb);
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m512 ws = widen16(j.scales + g * j.N16 + (v0 + c) * 16);
      for (int r = 0; r < R; ++r) {
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(j.row_scale[(r0 + r) * j.groups + g]), ws);
        out[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][c]), s, out[r][c]);
      }
    }
  }
  __m512 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < j.n; ++k) {
    __m512 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = widen16(j.apart_weight + ((v0 + c) * j.n + k) * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(j.picked[(r0 + r) * j.n + k]);
      for (int c = 0; c < C; ++c) a[r][c] = _mm512_fmadd_ps(p, wv[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const __m512 o = _mm512_add_ps(out[r][c], a[r][c]);
      int64_t left;
      float* dst = j.at(r0 + r, (v0 + c) * 16, &left);
      if (left >= 16) {
        _mm512_storeu_ps(dst, o);
      } else {
        _mm512_mask_storeu_ps(dst, static_cast<__mmask16>((1u << left) - 1), o);
      }
    }
}

template <int C, bool Slice>
void rows_tile(const Job& j, int64_t r0, int64_t count, int64_t v0, const uint8_t* next,
               int64_t lines) {
  switch (count) {
    case 1: tile<1, C, Slice>(j, r0, v0, next, lines); break;
    case 2: tile<2, C, Slice>(j, r0, v0, next, lines); break;
    case 3: tile<3, C, Slice>(j, r0, v0, next, lines); break;
    default: tile<4, C, Slice>(j, r0, v0, next, lines);
  }
}

// ``count`` rows from r0 by ``wide`` vectors from v
template <bool Slice>
void any_tile(const Job& j, int64_t r0, int64_t count, int64_t v, int64_t wide,
              const uint8_t* next, int64_t lines) {
  if (wide == 6) {
    if (count == 1) {
      tile<1, 6, Slice>(j, r0, v, next, lines);
    } else {
      tile<2, 6, Slice>(j, r0, v, next, lines);
    }
  } else if (wide == 3) {
    rows_tile<3, Slice>(j, r0, count, v, next, lines);
  } else if (wide == 2) {
    rows_tile<2, Slice>(j, r0, count, v, next, lines);
  } else {
    rows_tile<1, Slice>(j, r0, count, v, next, lines);
  }
}

// One block of rows and columns in tiles: four or three rows by three vectors, or (a step's
// few rows) one or two rows by six, so that at least six chains of vpdpbusd are in flight
// (its latency) and the sums, outputs and weights fit the 32 registers. Each tile all of K;
// a column tile's rows one tile after another, so that its weights come from memory once, and
// while the rows after the first read them from L1, the next tile's weights are prefetched into
// L2 (a step of 16 rows otherwise waited on memory for its first rows and computed the others
// with the memory idle: benchmarks/README.md). A step's block of 2-4 row tiles (5-16 rows)
// shares that out, a slice of the next tile's lines each, the first tile included, so the
// memory streams through the whole column tile (all of it in the second tile: an 8-row step's
// products took 10-17% longer); a prompt's block (more tiles) prefetches it in each tile after
// the first (in slices: its prefill 2-3% slower).
void product(void* data, size_t index) {
  const auto& j = *static_cast<const Job*>(data);
  const int64_t rb = static_cast<int64_t>(index) / j.column_blocks;
  const int64_t cb = static_cast<int64_t>(index) % j.column_blocks;
  const int64_t row_begin = rb * kRowBlock, row_end = std::min(j.rows, row_begin + kRowBlock);
  const int64_t v_begin = cb * (kColumnBlock / 16);
  const int64_t v_end = std::min(j.N16 / 16, v_begin + kColumnBlock / 16);
  const int64_t quads = j.K / 4, vectors = j.N16 / 16;
  const int64_t tiles = (row_end - row_begin + kRows - 1) / kRows;
  const bool sliced = tiles > 1 && tiles <= kStepTiles;
  for (int64_t v = v_begin; v < v_end;) {
    const int64_t wide =
        row_end - row_begin <= 2 && v + 6 <= v_end ? 6 : std::min<int64_t>(3, v_end - v);
    // the weights after this tile's: the next tile's, or the next block's
    const uint8_t* after = v + wide < vectors ? j.weight + (v + wide) * quads * 64 : nullptr;
    const int64_t total = after ? std::min(wide, vectors - v - wide) * quads : 0;  // lines
    const int64_t slice = (total + tiles - 1) / tiles;
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
      const int64_t count = std::min<int64_t>(kRows, row_end - r0);
      if (sliced) {
        const int64_t from = std::min(total, (r0 - row_begin) / kRows * slice);
        const int64_t lines = std::min(total, from + slice) - from;
        any_tile<true>(j, r0, count, v, wide, lines > 0 ? after + from * 64 : nullptr, lines);
      } else {
        any_tile<false>(j, r0, count, v, wide, r0 > row_begin ? after : nullptr, 0);
      }
    }
    v += wide;
  }
}
#else
// Without AVX512-VNNI (AVX2 CPUs, and AVX-512 ones before VNNI): the same int32 sums, exact,
// and the same chain of fp32 operations per element, 8 columns to a vector. AVX2 multiplies
// unsigned by signed bytes in pairs into saturating int16 (vpmaddubsw): |w| (at most 128, an
// unsigned byte) times x with w's sign (x is within [-127, 127], the rows' quantization clamps
// it, so no byte overflows), a pair at most 2 x 128 x 127 = 32,512, below int16's limit; then
// vpmaddwd sums each column's two pairs into int32. A tile is R rows by one vector of 16
// columns (two halves of 8), all of K; a block's row tiles in turn, so a vector's weights come
// from memory once and from L1 for the rows after, the first prefetching the next vector's.
// The bundled model's products at one row / 16 / 64 rows: 4.4-7.5 / 22-25 / 78-89 ms (AVX-512's
// bytes below: 4.9-5.4 / 18-20 / 68-71), where the plain loop this replaced took 103 ms / 1.5 s
// / 6.1 s and VNNI takes ~5 / ~11 / ~36 (benchmarks/README.md, "GroupProduct without VNNI").

// 8 bfloat16 values widened to fp32, exactly
inline __m256 widen8(const uint16_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

template <int R>
__attribute__((noinline)) void tile8(const Job& j, int64_t r0, int64_t v, const uint8_t* next) {
  const int64_t quads = j.K / 4, group_quads = j.group / 4;
  const int8_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = j.q + (r0 + r) * j.K;
  const uint8_t* w = j.weight + v * quads * 64;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));  // stored w + 128 -> int8 w
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 out[R][2];
  for (int r = 0; r < R; ++r) out[r][0] = out[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < j.groups; ++g) {
    __m256i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t t = g * group_quads; t < (g + 1) * group_quads; ++t) {
      if (next != nullptr) _mm_prefetch(reinterpret_cast<const char*>(next + t * 64), _MM_HINT_T1);
      __m256i sw[2], aw[2];  // the weights as int8, and their magnitudes
      for (int h = 0; h < 2; ++h) {
        sw[h] = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t * 64 + h * 32)), flip);
        aw[h] = _mm256_abs_epi8(sw[h]);
      }
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, x[r] + t * 4, 4);
        const __m256i xb = _mm256_set1_epi32(four);
        for (int h = 0; h < 2; ++h) {
          const __m256i pairs = _mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(xb, sw[h]));
          acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 ws = widen8(j.scales + g * j.N16 + v * 16 + h * 8);
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_mul_ps(_mm256_set1_ps(j.row_scale[(r0 + r) * j.groups + g]), ws);
        out[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][h]), s, out[r][h]);
      }
    }
  }
  __m256 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < j.n; ++k)
    for (int h = 0; h < 2; ++h) {
      const __m256 wv = widen8(j.apart_weight + (v * j.n + k) * 16 + h * 8);
      for (int r = 0; r < R; ++r)
        a[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(j.picked[(r0 + r) * j.n + k]), wv, a[r][h]);
    }
  for (int r = 0; r < R; ++r) {
    alignas(32) float o[16];
    for (int h = 0; h < 2; ++h) _mm256_store_ps(o + 8 * h, _mm256_add_ps(out[r][h], a[r][h]));
    int64_t left;
    float* dst = j.at(r0 + r, v * 16, &left);
    std::memcpy(dst, o, static_cast<size_t>(std::min<int64_t>(16, left)) * sizeof(float));
  }
}

#if defined(__AVX512BW__)
// The same with AVX-512's 64 bytes (AVX-512 CPUs before VNNI): a vector of 16 columns in one
// register. AVX-512 has no vpsignb: x is negated where w is negative (a masked subtraction from
// zero; where w is 0 its |w| makes the product 0 anyway).

template <int R>
__attribute__((noinline)) void tile64(const Job& j, int64_t r0, int64_t v, const uint8_t* next) {
  const int64_t quads = j.K / 4, group_quads = j.group / 4;
  const int8_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = j.q + (r0 + r) * j.K;
  const uint8_t* w = j.weight + v * quads * 64;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80)), zero = _mm512_setzero_si512();
  const __m512i ones = _mm512_set1_epi16(1);
  __m512 out[R];
  for (int r = 0; r < R; ++r) out[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < j.groups; ++g) {
    __m512i acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
    for (int64_t t = g * group_quads; t < (g + 1) * group_quads; ++t) {
      if (next != nullptr) _mm_prefetch(reinterpret_cast<const char*>(next + t * 64), _MM_HINT_T1);
      const __m512i sw = _mm512_xor_si512(_mm512_loadu_si512(w + t * 64), flip);
      const __m512i aw = _mm512_abs_epi8(sw);
      const __mmask64 negative = _mm512_movepi8_mask(sw);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, x[r] + t * 4, 4);
        const __m512i xb = _mm512_set1_epi32(four);
        const __m512i sx = _mm512_mask_sub_epi8(xb, negative, zero, xb);
        acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), ones));
      }
    }
    const __m512 ws = widen16(j.scales + g * j.N16 + v * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(j.row_scale[(r0 + r) * j.groups + g]), ws);
      out[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), s, out[r]);
    }
  }
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < j.n; ++k) {
    const __m512 wv = widen16(j.apart_weight + (v * j.n + k) * 16);
    for (int r = 0; r < R; ++r)
      a[r] = _mm512_fmadd_ps(_mm512_set1_ps(j.picked[(r0 + r) * j.n + k]), wv, a[r]);
  }
  for (int r = 0; r < R; ++r) {
    int64_t left;
    float* dst = j.at(r0 + r, v * 16, &left);
    const __mmask16 lanes = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    _mm512_mask_storeu_ps(dst, lanes, _mm512_add_ps(out[r], a[r]));
  }
}
#endif

// R rows by one vector of 16 columns, in AVX-512's bytes where the build has them
template <int R>
inline void byte_tile(const Job& j, int64_t r0, int64_t v, const uint8_t* next) {
#if defined(__AVX512BW__)
  tile64<R>(j, r0, v, next);
#else
  tile8<R>(j, r0, v, next);
#endif
}

void product(void* data, size_t index) {
  const auto& j = *static_cast<const Job*>(data);
  const int64_t rb = static_cast<int64_t>(index) / j.column_blocks;
  const int64_t cb = static_cast<int64_t>(index) % j.column_blocks;
  const int64_t row_begin = rb * kRowBlock, row_end = std::min(j.rows, row_begin + kRowBlock);
  const int64_t v_end = std::min(j.N16 / 16, (cb + 1) * (kColumnBlock / 16));
  const int64_t quads = j.K / 4, vectors = j.N16 / 16;
  for (int64_t v = cb * (kColumnBlock / 16); v < v_end; ++v) {
    // the next vector's weights into L2 while the first row tile reads this one's
    const uint8_t* next = v + 1 < vectors ? j.weight + (v + 1) * quads * 64 : nullptr;
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kByteRows) {
      const uint8_t* ahead = r0 == row_begin ? next : nullptr;
      switch (std::min<int64_t>(kByteRows, row_end - r0)) {
        case 1: byte_tile<1>(j, r0, v, ahead); break;
        case 2: byte_tile<2>(j, r0, v, ahead); break;
        case 3: byte_tile<3>(j, r0, v, ahead); break;
        default: byte_tile<kByteRows>(j, r0, v, ahead);
      }
    }
  }
}
#endif

// Copies of constant weights in transparent 2 MB pages, shared by every kernel of the process:
// regions of 32 MB (or one tensor's size, rounded up to 2 MB) at a 2 MB boundary, advised
// MADV_HUGEPAGE, filled one tensor after another, unmapped when their last tensor's kernels are
// gone. Equal tensors (the same bytes: the engine's and the lens's sessions of one model) share
// one copy. Where the system grants no huge pages (THP "never") nothing is copied.
class Pages {
 public:
  static Pages& get() {  // never destroyed: a session freed late in the process's exit
    static Pages* pages = new Pages;  // still gives its copies back to it
    return *pages;
  }

  // A copy of ``bytes`` bytes at ``data`` in 2 MB pages (64-byte aligned), or nullptr: read
  // ``data`` itself. Each call is matched by one ``release``.
  const void* copy(const void* data, size_t bytes) {
    if (!enabled_ || bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t key = fingerprint(data, bytes);
    auto [first, last] = copies_.equal_range(key);
    for (auto it = first; it != last; ++it)
      if (it->second.bytes == bytes && std::memcmp(it->second.at, data, bytes) == 0) {
        it->second.users += 1;
        let_go(data, bytes);
        return it->second.at;
      }
    size_t region = 0;
    char* at = take(bytes, &region);
    if (at == nullptr) return nullptr;
    std::memcpy(at, data, bytes);
    let_go(data, bytes);
    copies_.emplace(key, Copy{at, bytes, region, 1});
    return at;
  }

  void release(const void* at) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = copies_.begin(); it != copies_.end(); ++it)
      if (it->second.at == at) {
        if (--it->second.users > 0) return;
        Region& r = regions_[it->second.region];
        copies_.erase(it);
        if (--r.tensors == 0) {
          munmap(r.mapped, r.mapped_bytes);
          r.mapped = r.base = nullptr;
        }
        return;
      }
  }

 private:
  static constexpr size_t kHuge = size_t(2) << 20;
  static constexpr size_t kRegion = size_t(32) << 20;
  struct Region {
    char* mapped;  // what mmap gave (munmap takes it back)
    char* base;    // its first 2 MB boundary
    size_t mapped_bytes, size, used, tensors;
  };
  struct Copy {
    char* at;
    size_t bytes, region, users;
  };

  Pages() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    const std::string modes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    enabled_ = modes.find("[always]") != std::string::npos ||
               modes.find("[madvise]") != std::string::npos;
  }

  // The original's whole pages (the weights file's, in this process's mapping) are no longer
  // read: a hint to reclaim them rather than hold the weights twice. A hint only: the memory
  // keeps its contents whatever it maps (file pages are read again if touched; anonymous ones
  // stay, or go to swap).
  static void let_go(const void* data, size_t bytes) {
    const uintptr_t page = 4096, from = reinterpret_cast<uintptr_t>(data);
    const uintptr_t begin = (from + page - 1) / page * page, end = (from + bytes) / page * page;
#ifdef MADV_PAGEOUT  // Linux 5.4: older systems keep both
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
    (void)begin, (void)end;
#endif
  }

  // the size and 64 bytes from each end: copies with the same fingerprint are compared whole
  static uint64_t fingerprint(const void* data, size_t bytes) {
    const auto* b = static_cast<const unsigned char*>(data);
    uint64_t h = 1469598103934665603ull ^ bytes;
    const size_t n = std::min<size_t>(64, bytes);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    for (size_t i = bytes - n; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
  }

  char* take(size_t bytes, size_t* region) {
    const size_t want = (bytes + 63) / 64 * 64;
    for (size_t i = 0; i < regions_.size(); ++i) {
      Region& r = regions_[i];
      if (r.base != nullptr && r.size - r.used >= want) {
        char* at = r.base + r.used;
        r.used += want;
        r.tensors += 1;
        *region = i;
        return at;
      }
    }
    const size_t size = std::max(kRegion, (want + kHuge - 1) / kHuge * kHuge);
    void* mapped = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return nullptr;
    char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mapped) + kHuge - 1) / kHuge * kHuge);
    madvise(base, size, MADV_HUGEPAGE);
    regions_.push_back({static_cast<char*>(mapped), base, size + kHuge, size, want, 1});
    *region = regions_.size() - 1;
    return base;
  }

  bool enabled_ = false;
  std::mutex mutex_;
  std::vector<Region> regions_;
  std::unordered_multimap<uint64_t, Copy> copies_;
};

struct Kernel {
  int64_t group, columns, split;
  const void* copies[5] = {};  // inputs 2-4 (weight, scales, apart_weight) when constant

  Kernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo i(info);
    group = i.GetAttribute<int64_t>("group");
    columns = i.GetAttribute<int64_t>("columns");
    split = 0;  // optional: a graph with one output does not name it
    try {
      split = i.GetAttribute<int64_t>("split");
    } catch (const Ort::Exception&) {
    }
    for (size_t input = 2; input < 5; ++input) {
      int constant = 0;
      Ort::ConstValue value{nullptr};
      try {
        value = i.GetTensorConstantInput(input, &constant);
      } catch (const Ort::Exception&) {
        constant = 0;
      }
      if (!constant) continue;
      const size_t bytes = value.GetTensorTypeAndShapeInfo().GetElementCount() * (input == 2 ? 1 : 2);
      copies[input] = Pages::get().copy(value.GetTensorRawData(), bytes);
    }
  }

  ~Kernel() {
    for (const void* at : copies)
      if (at != nullptr) Pages::get().release(at);
  }

  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  template <typename T>
  const T* read(const Ort::ConstValue& value, size_t input) const {
    return copies[input] ? static_cast<const T*>(copies[input]) : value.GetTensorData<T>();
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const auto x = ctx.GetInput(0), apart = ctx.GetInput(1), weight = ctx.GetInput(2);
    const auto scales = ctx.GetInput(3), apart_weight = ctx.GetInput(4);
    auto shape = x.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t n = static_cast<int64_t>(apart.GetTensorTypeAndShapeInfo().GetElementCount());
    const auto ws = weight.GetTensorTypeAndShapeInfo().GetShape();
    const auto ss = scales.GetTensorTypeAndShapeInfo().GetShape();
    const auto as = apart_weight.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t K = shape.empty() ? 0 : shape.back(), N16 = (columns + 15) / 16 * 16;
    if (shape.empty() || group <= 0 || group % 4 != 0 || K % group != 0 || ws.size() != 3 ||
        ws[0] != N16 / 16 || ws[1] != K / 4 || ws[2] != 64 || ss.size() != 2 ||
        ss[0] != K / group || ss[1] != N16 || as.size() != 3 || as[0] != N16 / 16 ||
        as[1] != n || as[2] != 16 || split < 0 || split % 16 != 0 || split >= columns)
      ORT_CXX_API_THROW("GroupProduct: x [..., K] with K a multiple of group (a multiple of 4), "
                        "weight [N16 / 16, K / 4, 64], scales [K / group, N16], "
                        "apart_weight [N16 / 16, n, 16] (N16: columns rounded up to 16), "
                        "split a multiple of 16 below columns",
                        ORT_INVALID_ARGUMENT);
    const int64_t* channels = apart.GetTensorData<int64_t>();
    std::vector<float> keep(static_cast<size_t>(K), 1.f);
    for (int64_t i = 0; i < n; ++i) {
      if (channels[i] < 0 || channels[i] >= K)
        ORT_CXX_API_THROW("GroupProduct: apart holds a channel outside x's last axis",
                          ORT_INVALID_ARGUMENT);
      keep[static_cast<size_t>(channels[i])] = 0.f;
    }
    const int64_t rows = K ? static_cast<int64_t>(x.GetTensorTypeAndShapeInfo().GetElementCount()) / K : 0;
    shape.back() = split > 0 ? split : columns;
    float* first = ctx.GetOutput(0, shape).GetTensorMutableData<float>();
    float* second = first;
    if (split > 0) {
      shape.back() = columns - split;
      second = ctx.GetOutput(1, shape).GetTensorMutableData<float>();
    }
    if (rows == 0) return;
    std::vector<int8_t> q(static_cast<size_t>(rows * K));
    std::vector<float> row_scale(static_cast<size_t>(rows * (K / group)));
    std::vector<int32_t> shares(static_cast<size_t>(rows * (K / group)));
    std::vector<float> picked(static_cast<size_t>(rows * n));
    Job j{x.GetTensorData<float>(), channels, keep.data(), read<uint8_t>(weight, 2),
          read<uint16_t>(scales, 3), read<uint16_t>(apart_weight, 4), q.data(),
          row_scale.data(), shares.data(), picked.data(), first, second, rows, K, columns, N16,
          n, group, K / group, (rows + kRowBlock - 1) / kRowBlock,
          (columns + kColumnBlock - 1) / kColumnBlock, split};
    const int64_t items = j.row_blocks * j.column_blocks;
    if (rows * K < kInline) {
      for (int64_t row = 0; row < rows; ++row) quantize_row(&j, static_cast<size_t>(row));
    } else {
      ctx.ParallelFor(quantize_row, static_cast<size_t>(rows), 0, &j);
    }
    if (rows * K * columns < kInline) {
      for (int64_t i = 0; i < items; ++i) product(&j, static_cast<size_t>(i));
    } else {
      ctx.ParallelFor(product, static_cast<size_t>(items), 0, &j);
    }
  }
};

struct Op : Ort::CustomOpBase<Op, Kernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return "GroupProduct"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 5; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    switch (i) {
      case 1: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
      case 2: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
      case 3:
      case 4: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
      default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    }
  }
  size_t GetOutputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i >= 1 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                  : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
};

}  // namespace

// the operator, for register.cc
const OrtCustomOp* GroupProductOp() {
  static const Op op;
  return &op;
}
