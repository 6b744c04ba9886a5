// KVAttention (domain ai.nbresponses): attention read straight from the KV buffers.
//
// Why a custom operator: in standard ONNX operators a decode step's attention casts an fp16 KV
// to fp32 copies, multiplies every row's queries with a packed copy of its keys, and masks and
// softmaxes the buffer's whole width; here each token reads its own columns once, as stored
// (benchmarks/kv_kernel.py measures both on the same buffers).
//
// Exactness by construction: a token's output is computed by one thread from its query, its
// position and the columns it sees, in one fixed order (each score: lane-wise products over the
// head, then a fixed reduction; softmax and the weighted sum of values column by column), with
// nothing shared with other tokens. So its bits do not depend on the batch, the step's length,
// the buffer's width or the thread count.
//
// Inputs: q [B, S, heads * head_dim] float; keys, values [B, kv_heads, W, head_dim] float or
// float16; position_ids [B, S] int64; optional new_keys, new_values [B, S, kv_heads * head_dim]
// float; optional cos, sin [positions, rotary_dim / 2] float. Outputs: [B, S, heads * head_dim]
// float; with new keys and values, the buffers with them written (present keys, present
// values). Attributes: heads, scale, softcap (0: none), window (0: none; else a token at p sees
// columns p - window + 1 .. p); optional kv_heads: q is the projection of q, k and v packed,
// [B, S, (heads + 2 * kv_heads) * head_dim], and holds the new keys and values.
//
// Without new keys and values the buffers are read as given (a graph wrote them). With them,
// each token's key and value are written at its position first, as the graph's writes did
// (Clip to float16's range, Cast, ScatterND: one node each, eight a layer, gone): rounded to
// nearest even when the buffers are float16 (clipped first: a NaN stays NaN), and in place
// when the present buffers are the past ones (bound to the same memory, as the engine binds
// them); other present buffers get a copy of the past first. With cos and sin, the queries and
// the new keys are rotated at their positions first, with the operations of ONNX Runtime's
// RotaryEmbedding (non-interleaved; the first 2 * half dimensions), and packed heads are taken
// apart where they lie (Split and two RotaryEmbedding nodes a layer, gone; the same bits).
// With packed heads, optional q_norm and k_norm [head_dim] float (inputs 8, 9; attribute
// epsilon): each query and key head is RMS-normed first, as Qwen3 and Gemma 3 norm them, with
// the operations of ONNX Runtime's SimplifiedLayerNormalization (``head_norm``): a Reshape, a
// Split, two norms and three Reshapes a layer, gone; the same bits.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace nbr;

#if defined(__AVX512F__)
// exp of 16 lanes: x = n ln2 + r (|r| <= ln2 / 2), e^r by its degree-7 Taylor polynomial
// (relative error ~2e-7 there, under fp32's rounding of the sum), times 2^n (scalef: underflows
// to 0 smoothly). Only ever called on x <= 0 (scores minus their maximum).
inline Vec exp16(Vec x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));
  const Vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  Vec p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// 16 vectors' lane sums at once, each in reduce()'s order (halves, then quarters, ...): lane
// i of the result holds the sum of v[kReduced[i]] (a token's score is the same bits whichever
// way it is reduced, alone or among 15 others).
inline Vec reduce16(const Vec* v) {
  Vec w[8], x[4], y[2];
  for (int m = 0; m < 8; ++m)  // + lanes 8 apart: [v2m, v2m+1] x 8
    w[m] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int m = 0; m < 4; ++m)  // + lanes 4 apart
    x[m] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int m = 0; m < 2; ++m)  // + lanes 2 apart
    y[m] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * m], x[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(x[2 * m], x[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),  // + neighbours
                       _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#define NBR_REDUCE16 1
#endif

constexpr int64_t kMaxHeadDim = 512;
constexpr int64_t kPositions = 16;  // a step's positions per work item (prompt runs: balance)

// The lanes summed in one fixed order (pairs, then pairs of pairs).
inline float reduce(Vec v) {
  alignas(64) float lanes[kLanes];
  store(lanes, v);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  return lanes[0];
}

#ifdef NBR_REDUCE16
// which of reduce16's 16 inputs each output lane sums (found once by reducing marked inputs)
const int* reduced_order() {
  static int order[16];
  static const bool done = [] {
    Vec v[16];
    for (int i = 0; i < 16; ++i) v[i] = broadcast(static_cast<float>(i));
    alignas(64) float out[16];
    store(out, reduce16(v));
    for (int i = 0; i < 16; ++i) order[i] = static_cast<int>(out[i] / 16.f);
    return true;
  }();
  (void)done;
  return order;
}
const int* const kReduced = reduced_order();

// reduce16's lanes put back in column order: lane c takes the lane that summed column c
inline Vec in_column_order(Vec v) {
  static const __m512i order = [] {
    alignas(64) int32_t lane[16];
    for (int i = 0; i < 16; ++i) lane[kReduced[i]] = i;
    return _mm512_load_si512(lane);
  }();
  return _mm512_permutexvar_ps(order, v);
}
#endif

// T: the keys' type (float, or float16's bits), V: the values' (the same, or int8: each column
// its hd values and then its fp32 scale's 4 bytes)
template <typename T, typename V>
struct Job {
  const float* q;
  const T* keys;
  const V* values;
  const int64_t* positions;
  float* out;
  int64_t B, S, heads, kv, W, hd, window, blocks;
  int64_t vs;  // a value column's elements: hd, or hd + 4 (int8 and its scale)
  float scale, softcap;
  int64_t per_task;  // consecutive work items a task takes (``attend``)
};

// Bytes to prefetch into L2 while other work computes (none when begin == end).
struct Span {
  const char* begin = nullptr;
  const char* end = nullptr;
};

// [from, to) into L2, a line at a time
template <typename T>
inline void prefetch(const T* from, const T* to) {
  for (auto* x = reinterpret_cast<const char*>(from); x < reinterpret_cast<const char*>(to); x += 64)
    _mm_prefetch(x, _MM_HINT_T1);
}

// A value column's weight: p / sum, times the column's scale when the values are int8 (the
// scale's bytes follow its hd values)
template <typename V>
inline float weighted(float w, const V* column, int64_t hd) {
  if constexpr (std::is_same_v<V, int8_t>) {
    float scale;
    std::memcpy(&scale, column + hd, sizeof scale);
    return w * scale;
  } else {
    (void)column, (void)hd;
    return w;
  }
}

// Up to four query heads of one KV head at one position: their scores share each key's loads,
// their weighted sums each value's (each score and each sum is still its own chain of
// operations in the order attend() describes, so sharing changes no bit). ``Chunks``: the
// head's vectors when known at compile time (their sums then stay in registers), else 0.
// ``fetch_values``: prefetch the values while the scores compute; ``ahead``: memory (the next
// work item's keys) to prefetch while the weighted sum computes. A 16-row step reads every
// row's keys and values from memory (92 MB at 250 tokens): read on demand, each phase waited on
// memory and then computed with it idle (benchmarks/README.md).
template <typename T, typename V, int Chunks, int H>
void attend_heads(const Job<T, V>& j, int64_t b, int64_t s, int64_t head0, int64_t begin, int64_t end,
                  float* scores, float* tail, bool fetch_values, Span ahead) {
  const int64_t h = head0 / (j.heads / j.kv);
  const int64_t full = Chunks ? Chunks * kLanes : j.hd / kLanes * kLanes;
  const T* keys = j.keys + (b * j.kv + h) * j.W * j.hd;
  const V* values = j.values + (b * j.kv + h) * j.W * j.vs;
  const float* q[H];
  float* p[H];
  float top[H], inv[H];
  for (int g = 0; g < H; ++g) {
    q[g] = j.q + ((b * j.S + s) * j.heads + head0 + g) * j.hd;
    p[g] = scores + g * j.W;
    top[g] = -INFINITY;
  }
  auto finish = [&](int g, int64_t c, float x) {  // the head's tail, the scale, the cap
    const T* k = keys + c * j.hd;
    for (int64_t d = full; d < j.hd; ++d) x += q[g][d] * scalar(k[d]);
    x *= j.scale;
    if (j.softcap > 0.f) x = std::tanh(x / j.softcap) * j.softcap;
    p[g][c] = x;
    top[g] = std::max(top[g], x);
  };
#ifdef NBR_REDUCE16
  // without a softcap or a head's scalar tail, finish() is one product and a maximum: done on
  // the 16 reduced sums at once (put back in column order), the same bits
  const bool vector_finish = full == j.hd && j.softcap == 0.f;
  const Vec scale = broadcast(j.scale);
  Vec tops[H];
  for (int g = 0; g < H; ++g) tops[g] = broadcast(-INFINITY);
  for (int64_t c0 = begin; c0 < end; c0 += 16) {  // 16 columns' sums reduced together
    const int64_t count = std::min<int64_t>(16, end - c0);
    if (fetch_values) prefetch(values + c0 * j.vs, values + (c0 + count) * j.vs);
    // four columns at a time: four independent chains of products in flight per head (each
    // column's sum is still its own products in head order); past the last column, the first
    // column's keys are read and their sums dropped
    Vec sums[H][16];
    for (int64_t t = 0; t < 16; t += 4) {
      const T* k0 = keys + (c0 + t) * j.hd;
      const T* k1 = t + 1 < count ? k0 + j.hd : k0;
      const T* k2 = t + 2 < count ? k0 + 2 * j.hd : k0;
      const T* k3 = t + 3 < count ? k0 + 3 * j.hd : k0;
      if (t >= count) k0 = k1 = k2 = k3 = keys + c0 * j.hd;
      Vec a[H][4];
      for (int g = 0; g < H; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = zero();
      for (int64_t d = 0; d < full; d += kLanes) {
        const Vec x0 = load(k0 + d), x1 = load(k1 + d), x2 = load(k2 + d), x3 = load(k3 + d);
        for (int g = 0; g < H; ++g) {
          const Vec qd = load(q[g] + d);
          a[g][0] = fma(qd, x0, a[g][0]);
          a[g][1] = fma(qd, x1, a[g][1]);
          a[g][2] = fma(qd, x2, a[g][2]);
          a[g][3] = fma(qd, x3, a[g][3]);
        }
      }
      for (int g = 0; g < H; ++g)
        for (int i = 0; i < 4; ++i) sums[g][t + i] = a[g][i];
    }
    for (int g = 0; g < H; ++g) {
      for (int64_t t = count; t < 16; ++t) sums[g][t] = zero();
      if (vector_finish) {  // finish()'s operations, 16 columns at once in column order
        const __mmask16 lanes = static_cast<__mmask16>((1u << count) - 1);
        const Vec x = mul(in_column_order(reduce16(sums[g])), scale);
        _mm512_mask_storeu_ps(p[g] + c0, lanes, x);
        tops[g] = _mm512_mask_max_ps(tops[g], lanes, x, tops[g]);
        continue;
      }
      alignas(64) float reduced[16];
      store(reduced, reduce16(sums[g]));
      for (int i = 0; i < 16; ++i)
        if (kReduced[i] < count) finish(g, c0 + kReduced[i], reduced[i]);
    }
  }
  if (vector_finish)
    for (int g = 0; g < H; ++g) {
      alignas(64) float lanes[16];
      store(lanes, tops[g]);
      for (int i = 0; i < 16; ++i) top[g] = std::max(top[g], lanes[i]);  // a maximum: any order
    }
  for (int g = 0; g < H; ++g) {
    const Vec shift = broadcast(top[g]);
    Vec sum = zero();  // lane i: the columns begin + i, begin + 16 + i, ...
    for (int64_t c0 = begin; c0 < end; c0 += 16) {
      const __mmask16 lanes = static_cast<__mmask16>((1u << std::min<int64_t>(16, end - c0)) - 1);
      const Vec x = _mm512_maskz_loadu_ps(lanes, p[g] + c0);
      const Vec e = _mm512_maskz_mov_ps(lanes, exp16(_mm512_sub_ps(x, shift)));
      _mm512_mask_storeu_ps(p[g] + c0, lanes, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv[g] = 1.f / reduce(sum);
  }
#else
  for (int g = 0; g < H; ++g) {
    for (int64_t c = begin; c < end; ++c) {
      if (fetch_values && g == 0) prefetch(values + c * j.vs, values + (c + 1) * j.vs);
      const T* k = keys + c * j.hd;
      Vec sum = zero();
      for (int64_t d = 0; d < full; d += kLanes) sum = fma(load(q[g] + d), load(k + d), sum);
      finish(g, c, reduce(sum));
    }
    float total = 0.f;
    for (int64_t c = begin; c < end; ++c) {
      p[g][c] = std::exp(p[g][c] - top[g]);
      total += p[g][c];
    }
    inv[g] = 1.f / total;
  }
#endif
  // per head two sums (the columns at even and odd distance from begin), then their sum: twice
  // the independent additions in flight
  constexpr int64_t kVecs = Chunks ? Chunks : kMaxHeadDim / kLanes;
  Vec acc[H][kVecs], acc2[H][kVecs];
  const int64_t rest = j.hd - full;
  for (int g = 0; g < H; ++g) {
    for (int64_t d = 0; d < full; d += kLanes) acc[g][d / kLanes] = acc2[g][d / kLanes] = zero();
    std::fill(tail + g * rest, tail + (g + 1) * rest, 0.f);
  }
  // ``ahead`` spread evenly over the pairs of columns
  const int64_t lines = (ahead.end - ahead.begin + 63) / 64;
  const int64_t per_pair = lines / std::max<int64_t>(1, (end - begin + 1) / 2) + 1;
  for (int64_t c = begin; c < end; c += 2) {
    for (int64_t i = 0; i < per_pair && ahead.begin < ahead.end; ++i, ahead.begin += 64)
      _mm_prefetch(ahead.begin, _MM_HINT_T1);
    const bool pair = c + 1 < end;
    const V* v0 = values + c * j.vs;
    const V* v1 = pair ? v0 + j.vs : v0;  // u1 = 0: adds exact zeros
    float u0[H], u1[H];
    Vec w0[H], w1[H];
    for (int g = 0; g < H; ++g) {
      u0[g] = weighted(p[g][c] * inv[g], v0, j.hd);
      u1[g] = pair ? weighted(p[g][c + 1] * inv[g], v1, j.hd) : 0.f;
      w0[g] = broadcast(u0[g]);
      w1[g] = broadcast(u1[g]);
    }
    for (int64_t d = 0; d < full; d += kLanes) {
      const Vec x0 = load(v0 + d), x1 = load(v1 + d);
      for (int g = 0; g < H; ++g) {
        acc[g][d / kLanes] = fma(w0[g], x0, acc[g][d / kLanes]);
        acc2[g][d / kLanes] = fma(w1[g], x1, acc2[g][d / kLanes]);
      }
    }
    for (int g = 0; g < H; ++g) {
      float* t = tail + g * rest;
      for (int64_t d = full; d < j.hd; ++d) t[d - full] += u0[g] * scalar(v0[d]);
      if (pair)
        for (int64_t d = full; d < j.hd; ++d) t[d - full] += u1[g] * scalar(v1[d]);
    }
  }
  for (int g = 0; g < H; ++g) {
    float* o = j.out + ((b * j.S + s) * j.heads + head0 + g) * j.hd;
    for (int64_t d = 0; d < full; d += kLanes)
      store(o + d, add(acc[g][d / kLanes], acc2[g][d / kLanes]));
    for (int64_t d = full; d < j.hd; ++d) o[d] = tail[g * rest + d - full];
  }
}

// The columns a token at position s of row b sees: [begin, end) (clamped to the buffer:
// padding positions)
template <typename T, typename V>
std::pair<int64_t, int64_t> seen(const Job<T, V>& j, int64_t b, int64_t s) {
  const int64_t end = std::clamp<int64_t>(j.positions[b * j.S + s] + 1, 1, j.W);
  return {j.window > 0 ? std::max<int64_t>(end - j.window, 0) : 0, end};
}

// One work item (row, KV head, up to kPositions positions): every query head of the group, four
// at a time. A token's output is computed from its own query, position and columns only.
// ``ahead``: the next item's keys, prefetched during this item's last weighted sum.
template <typename T, typename V, int Chunks>
void attend_item(const Job<T, V>& j, int64_t index, Span ahead, float* scores, float* tail) {
  const int64_t block = index % j.blocks;
  const int64_t b = index / j.blocks / j.kv;
  const int64_t h = index / j.blocks % j.kv;
  const int64_t group = j.heads / j.kv;
  const int64_t first = block * kPositions, last = std::min(j.S, first + kPositions) - 1;
  for (int64_t s = first; s <= last; ++s) {
    const auto [begin, end] = seen(j, b, s);
    for (int64_t g = 0; g < group; g += 4) {
      const int64_t head0 = h * group + g;
      // the values from memory once: the item's first position reads the most
      const bool fetch = s == first && g == 0;
      const Span next = s == last && g + 4 >= group ? ahead : Span{};
      switch (std::min<int64_t>(4, group - g)) {
        case 4: attend_heads<T, V, Chunks, 4>(j, b, s, head0, begin, end, scores, tail, fetch, next); break;
        case 3: attend_heads<T, V, Chunks, 3>(j, b, s, head0, begin, end, scores, tail, fetch, next); break;
        case 2: attend_heads<T, V, Chunks, 2>(j, b, s, head0, begin, end, scores, tail, fetch, next); break;
        default: attend_heads<T, V, Chunks, 1>(j, b, s, head0, begin, end, scores, tail, fetch, next);
      }
    }
  }
}

// A task: ``per_task`` consecutive work items, each prefetching the next one's keys (a thread
// that took items one at a time would not know its next).
template <typename T, typename V, int Chunks>
void attend(void* data, size_t task) {
  const Job<T, V> j = *static_cast<const Job<T, V>*>(data);  // a copy: no aliasing with the outputs
  const int64_t items = j.B * j.kv * j.blocks;
  const int64_t first = static_cast<int64_t>(task) * j.per_task;
  const int64_t last = std::min(items, first + j.per_task) - 1;
  std::vector<float> scores(static_cast<size_t>(4 * j.W));
  std::vector<float> tail(static_cast<size_t>(4 * (j.hd % kLanes)));
  for (int64_t index = first; index <= last; ++index) {
    Span ahead;
    if (index < last) {
      const int64_t next = index + 1, b = next / j.blocks / j.kv, h = next / j.blocks % j.kv;
      const auto [begin, end] = seen(j, b, std::min(j.S - 1, next % j.blocks * kPositions));
      const T* keys = j.keys + (b * j.kv + h) * j.W * j.hd;
      ahead = {reinterpret_cast<const char*>(keys + begin * j.hd),
               reinterpret_cast<const char*>(keys + end * j.hd)};
    }
    attend_item<T, V, Chunks>(j, index, ahead, scores.data(), tail.data());
  }
}

// A rotary embedding of one head: the first 2 * half dimensions as pairs (i, i + half) turned
// by the position's angles, the rest copied. The operations are ONNX Runtime's RotaryEmbedding's
// on this CPU (MLAS: real * cos - imag * sin and real * sin + imag * cos, each one fused
// multiply-add of the other product rounded): its graph node's bits, one element at a time.
void rotate(const float* x, float* out, const float* cos, const float* sin, int64_t half,
            int64_t hd) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 re = _mm256_loadu_ps(x + i), im = _mm256_loadu_ps(x + i + half);
    const __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
    const __m256 r = _mm256_fmsub_ps(re, c, _mm256_mul_ps(im, s));
    const __m256 m = _mm256_fmadd_ps(re, s, _mm256_mul_ps(im, c));
    _mm256_storeu_ps(out + i, r);
    _mm256_storeu_ps(out + i + half, m);
  }
  for (; i < half; ++i) {
    const __m128 re = _mm_set_ss(x[i]), im = _mm_set_ss(x[i + half]);
    const __m128 c = _mm_set_ss(cos[i]), s = _mm_set_ss(sin[i]);
    const float r = _mm_cvtss_f32(_mm_fmsub_ss(re, c, _mm_mul_ss(im, s)));
    const float m = _mm_cvtss_f32(_mm_fmadd_ss(re, s, _mm_mul_ss(im, c)));
    out[i] = r;
    out[i + half] = m;
  }
  if (out != x) std::memcpy(out + 2 * half, x + 2 * half, static_cast<size_t>(hd - 2 * half) * 4);
}

// RMSNorm of one head [hd], hd a multiple of 8: the operations of ONNX Runtime's
// SimplifiedLayerNormalization on these CPUs (MLAS, measured bit for bit by
// tests/models/test_kernel_attention.py): the squares summed by fused multiply-adds in 8 lanes,
// the lanes added in halves (4 + 4, 2 + 2, 1 + 1), root = sqrt(sum / hd + epsilon), then each
// element times 1 / root, times its gamma. ``out`` may be ``x``.
void head_norm(const float* x, float* out, const float* gamma, int64_t hd, float epsilon) {
  __m256 squares = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; d += 8) {
    const __m256 v = _mm256_loadu_ps(x + d);
    squares = _mm256_fmadd_ps(v, v, squares);
  }
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(squares), _mm256_extractf128_ps(squares, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  const float root = std::sqrt(_mm_cvtss_f32(h) / static_cast<float>(hd) + epsilon);
  const __m256 inverse = _mm256_set1_ps(1.f / root);
  for (int64_t d = 0; d < hd; d += 8)
    _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + d), inverse),
                                            _mm256_loadu_ps(gamma + d)));
}

// One head's key or value [hd] into its buffer's column: as is, or rounded to float16 (nearest
// even, clipped to its range first: a NaN stays NaN), as the graph's Clip and Cast did.
void store_column(const float* x, void* to, int64_t offset, int64_t hd, bool half) {
  if (!half) {
    std::memcpy(static_cast<float*>(to) + offset, x, static_cast<size_t>(hd) * sizeof(float));
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(to) + offset;
  const __m256 low = _mm256_set1_ps(-65504.f), high = _mm256_set1_ps(65504.f);
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8) {  // max/min with the bound first: a NaN passes through
    const __m256 v = _mm256_min_ps(high, _mm256_max_ps(low, _mm256_loadu_ps(x + d)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + d),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; d < hd; ++d) {
    const float v = x[d] != x[d] ? x[d] : std::min(65504.f, std::max(-65504.f, x[d]));
    out[d] = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
}

constexpr float kInv127 = static_cast<float>(1.0 / 127.0);

// One head's value [hd] into an int8 buffer's column: scale = max |v| / 127 (times 1 / 127, as
// GroupProduct scales its rows), each value round(v / scale) (half to even) within [-127, 127],
// then the scale's 4 bytes. A head of zeros: scale 0 and zeros; a head holding an inf or a NaN:
// scale NaN (every output that weighs the column is NaN, as a NaN stored in a float buffer
// makes it).
void store_int8_column(const float* x, int8_t* out, int64_t hd) {
  const int64_t full = hd / kLanes * kLanes;
  Vec peaks = zero(), poison = zero();  // poison: x * 0 summed, NaN iff a value is not finite
  for (int64_t d = 0; d < full; d += kLanes) {
    const Vec v = load(x + d);
    peaks = max(abs(v), peaks);
    poison = add(poison, mul(v, zero()));
  }
  alignas(64) float lanes[kLanes], bad[kLanes];
  store(lanes, peaks);
  store(bad, poison);
  float peak = 0.f, nonfinite = 0.f;
  for (int i = 0; i < kLanes; ++i) {
    peak = lanes[i] > peak ? lanes[i] : peak;
    nonfinite += bad[i];
  }
  for (int64_t d = full; d < hd; ++d) {
    const float a = std::fabs(x[d]);
    peak = a > peak ? a : peak;
    nonfinite += x[d] * 0.f;
  }
  const float scale = nonfinite == 0.f ? peak * kInv127 : NAN;
  if (!(scale > 0.f)) {
    std::memset(out, 0, static_cast<size_t>(hd));
  } else {
    const Vec scales = broadcast(scale), low = broadcast(-127.f), high = broadcast(127.f);
    for (int64_t d = 0; d < full; d += kLanes)
      store_signed_bytes(out + d, round(min(max(div(load(x + d), scales), low), high)));
    for (int64_t d = full; d < hd; ++d) {
      const float v = std::min(127.f, std::max(-127.f, x[d] / scale));
      out[d] = static_cast<int8_t>(std::nearbyint(v));
    }
  }
  std::memcpy(out + hd, &scale, sizeof scale);
}

// A step's new tokens made ready, one token per work item: its query heads rotated into the
// output (where the attention reads them, and overwrites each head after reading it), its keys
// rotated and written with its values at its position of the present buffers.
struct Tokens {
  const float* q;  // the first token's query heads; nullptr: read in place (no rotary)
  const float* k;  // its keys and values [kv * hd]
  const float* v;
  int64_t q_stride, kv_stride;  // floats from one token's to the next's
  float* q_out;                 // [B, S, heads * hd]
  void* keys;                   // [B, kv, W, hd]
  void* values;
  const int64_t* positions;
  const float* cos;  // [positions, half]; nullptr: no rotary
  const float* sin;
  const float* q_norm;  // [hd] each, or nullptr: no head norms
  const float* k_norm;
  float epsilon;
  int64_t half, S, heads, kv, W, hd;
  bool fp16;         // the keys (and values, unless int8) as float16
  bool int8_values;  // the values as int8 columns of hd + 4 bytes (``store_int8_column``)
};

void prepare_token(void* data, size_t index) {
  const auto& t = *static_cast<const Tokens*>(data);
  const int64_t token = static_cast<int64_t>(index), b = token / t.S, at = t.positions[token];
  const float* cos = t.cos ? t.cos + at * t.half : nullptr;
  const float* sin = t.cos ? t.sin + at * t.half : nullptr;
  if (t.q != nullptr) {
    const float* x = t.q + token * t.q_stride;
    float* out = t.q_out + token * t.heads * t.hd;
    for (int64_t h = 0; h < t.heads; ++h, x += t.hd, out += t.hd) {
      const float* from = x;
      if (t.q_norm) {  // normed into the output, rotated there
        head_norm(x, out, t.q_norm, t.hd, t.epsilon);
        from = out;
      }
      if (cos)
        rotate(from, out, cos, sin, t.half, t.hd);
      else if (from != out)
        std::memcpy(out, from, static_cast<size_t>(t.hd) * sizeof(float));
    }
  }
  alignas(64) float normed[kMaxHeadDim];
  alignas(64) float rotated[kMaxHeadDim];
  const float* k = t.k + token * t.kv_stride;
  const float* v = t.v + token * t.kv_stride;
  for (int64_t h = 0; h < t.kv; ++h, k += t.hd, v += t.hd) {
    const int64_t offset = ((b * t.kv + h) * t.W + at) * t.hd;
    const float* key = k;
    if (t.k_norm) {
      head_norm(k, normed, t.k_norm, t.hd, t.epsilon);
      key = normed;
    }
    if (cos) rotate(key, rotated, cos, sin, t.half, t.hd);
    store_column(cos ? rotated : key, t.keys, offset, t.hd, t.fp16);
    if (t.int8_values)
      store_int8_column(v, static_cast<int8_t*>(t.values) + offset / t.hd * (t.hd + 4), t.hd);
    else
      store_column(v, t.values, offset, t.hd, t.fp16);
  }
}

struct Kernel {
  int64_t heads, window, packed_kv;
  float scale, softcap, epsilon;

  Kernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo i(info);
    heads = i.GetAttribute<int64_t>("heads");
    scale = i.GetAttribute<float>("scale");
    softcap = i.GetAttribute<float>("softcap");
    window = i.GetAttribute<int64_t>("window");
    packed_kv = 0;  // optional: a graph with q, k and v apart does not name it
    try {
      packed_kv = i.GetAttribute<int64_t>("kv_heads");
    } catch (const Ort::Exception&) {
    }
    epsilon = 0.f;  // optional: a graph without head norms does not name it
    try {
      epsilon = i.GetAttribute<float>("epsilon");
    } catch (const Ort::Exception&) {
    }
  }

  template <typename T, typename V>
  void run(Ort::KernelContext& ctx, Job<T, V> job, const void* keys, const void* values) {
    job.keys = static_cast<const T*>(keys);
    job.values = static_cast<const V*>(values);
    if (job.S == 0) return;
    // the common head sizes compiled for their exact width; the same operations in any case
    void (*kernel)(void*, size_t) = attend<T, V, 0>;
    if (job.hd == 4 * kLanes) kernel = attend<T, V, 4>;
    if (job.hd == 8 * kLanes) kernel = attend<T, V, 8>;
    if (job.hd == 16 * kLanes) kernel = attend<T, V, 16>;
    // a step's items in tasks of consecutive ones, about four a thread (16 rows: 48 items, all
    // alike); a prompt's one at a time (its later blocks of positions see more columns: tasks
    // of several would leave a thread the heaviest at the end)
    const int64_t items = job.B * job.kv * job.blocks;
    // once a process: glibc reads /sys for it, and this runs every layer of every step
    static const int64_t threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
    job.per_task = job.blocks > 1 ? 1 : std::max<int64_t>(1, items / (4 * threads));
    const int64_t tasks = (items + job.per_task - 1) / job.per_task;
    ctx.ParallelFor(kernel, static_cast<size_t>(tasks), 0, &job);
  }

  static bool given(Ort::KernelContext& ctx, size_t i) {
    return ctx.GetInputCount() > i && ctx.GetInput(i) != nullptr;
  }

  // The step's new tokens (``Tokens``) into the present buffers (the past ones when bound to
  // the same memory, else a copy of them) and, when rotated or packed, their queries into
  // ``q_out``; returns the present buffers.
  std::pair<const void*, const void*> write(Ort::KernelContext& ctx, const std::vector<int64_t>& qs,
                                            const std::vector<int64_t>& ks,
                                            const std::vector<int64_t>& vs, float* q_out) {
    const auto q = ctx.GetInput(0), past_k = ctx.GetInput(1), past_v = ctx.GetInput(2);
    const bool half =
        past_k.GetTensorTypeAndShapeInfo().GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    const bool int8_values =
        past_v.GetTensorTypeAndShapeInfo().GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    const size_t key_bytes = static_cast<size_t>(ks[0] * ks[1] * ks[2] * ks[3]) * (half ? 2 : 4);
    const size_t value_bytes = int8_values ? static_cast<size_t>(vs[0] * vs[1] * vs[2] * vs[3])
                                           : key_bytes;
    const int64_t kv = ks[1], hd = ks[3];
    const int64_t* positions = ctx.GetInput(3).GetTensorData<int64_t>();
    Tokens t{};
    t.positions = positions;
    t.S = qs[1];
    t.heads = heads;
    t.kv = kv;
    t.W = ks[2];
    t.hd = hd;
    t.fp16 = half;
    t.int8_values = int8_values;
    t.q_out = q_out;
    if (packed_kv > 0) {  // [q heads | k heads | v heads] per token
      t.q = q.GetTensorData<float>();
      t.k = t.q + heads * hd;
      t.v = t.k + kv * hd;
      t.q_stride = t.kv_stride = (heads + 2 * kv) * hd;
    } else {
      const std::vector<int64_t> news = {qs[0], qs[1], kv * hd};
      for (size_t i = 4; i < 6; ++i)
        if (ctx.GetInput(i).GetTensorTypeAndShapeInfo().GetShape() != news)
          ORT_CXX_API_THROW("KVAttention: new keys and values must be [B, S, kv_heads * head_dim]",
                            ORT_INVALID_ARGUMENT);
      t.q = given(ctx, 6) ? q.GetTensorData<float>() : nullptr;  // unrotated: read in place
      t.q_stride = heads * hd;
      t.k = ctx.GetInput(4).GetTensorData<float>();
      t.v = ctx.GetInput(5).GetTensorData<float>();
      t.kv_stride = kv * hd;
    }
    if (given(ctx, 8) || given(ctx, 9)) {
      const std::vector<int64_t> head = {hd};
      if (packed_kv == 0 || !given(ctx, 8) || !given(ctx, 9) || hd % 8 != 0 ||
          ctx.GetInput(8).GetTensorTypeAndShapeInfo().GetShape() != head ||
          ctx.GetInput(9).GetTensorTypeAndShapeInfo().GetShape() != head)
        ORT_CXX_API_THROW("KVAttention: q_norm and k_norm come together, each [head_dim] with "
                          "head_dim a multiple of 8, with q, k and v packed (kv_heads)",
                          ORT_INVALID_ARGUMENT);
      t.q_norm = ctx.GetInput(8).GetTensorData<float>();
      t.k_norm = ctx.GetInput(9).GetTensorData<float>();
      t.epsilon = epsilon;
    }
    int64_t limit = ks[2];  // positions must have a column (and an angle, when rotated)
    if (given(ctx, 6)) {
      const auto cos = ctx.GetInput(6), sin = ctx.GetInput(7);
      const auto shape = cos.GetTensorTypeAndShapeInfo().GetShape();
      if (ctx.GetInputCount() < 8 || ctx.GetInput(7) == nullptr || shape.size() != 2 ||
          sin.GetTensorTypeAndShapeInfo().GetShape() != shape || 2 * shape[1] > hd)
        ORT_CXX_API_THROW("KVAttention: cos and sin must both be [positions, rotary_dim / 2] "
                          "with rotary_dim at most head_dim",
                          ORT_INVALID_ARGUMENT);
      t.cos = cos.GetTensorData<float>();
      t.sin = sin.GetTensorData<float>();
      t.half = shape[1];
      limit = std::min(limit, shape[0]);
    }
    for (int64_t i = 0; i < qs[0] * qs[1]; ++i)
      if (positions[i] < 0 || positions[i] >= limit)
        ORT_CXX_API_THROW("KVAttention: a position is outside the buffers' columns or the "
                          "rotary tables",
                          ORT_INVALID_ARGUMENT);
    void* to[2];
    for (int which = 0; which < 2; ++which) {  // shapes and types checked by Compute
      const auto past = which == 0 ? past_k : past_v;
      auto present = ctx.GetOutput(1 + which, which == 0 ? ks : vs);
      if (present.GetTensorTypeAndShapeInfo().GetElementType() !=
          past.GetTensorTypeAndShapeInfo().GetElementType())
        ORT_CXX_API_THROW("KVAttention: the present buffers must have the past buffers' type",
                          ORT_INVALID_ARGUMENT);
      to[which] = present.GetTensorMutableRawData();
      if (to[which] != past.GetTensorRawData())
        std::memcpy(to[which], past.GetTensorRawData(), which == 0 ? key_bytes : value_bytes);
    }
    t.keys = to[0];
    t.values = to[1];
    ctx.ParallelFor(prepare_token, static_cast<size_t>(qs[0] * qs[1]), 0, &t);
    return {to[0], to[1]};
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const auto q = ctx.GetInput(0), ids = ctx.GetInput(3);
    const auto k = ctx.GetInput(1), v = ctx.GetInput(2);
    const auto ks = k.GetTensorTypeAndShapeInfo().GetShape();  // [B, kv, W, hd]
    const auto vs = v.GetTensorTypeAndShapeInfo().GetShape();  // the same, or [B, kv, W, hd + 4]
    auto qs = q.GetTensorTypeAndShapeInfo().GetShape();        // [B, S, (heads [+ 2 kv]) * hd]
    const auto key_type = k.GetTensorTypeAndShapeInfo().GetElementType();
    const auto value_type = v.GetTensorTypeAndShapeInfo().GetElementType();
    const bool int8_values = value_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    const int64_t kv = ks.size() == 4 ? ks[1] : 0, hd = ks.size() == 4 ? ks[3] : 0;
    const int64_t width = packed_kv > 0 ? heads + 2 * packed_kv : heads;
    if (qs.size() != 3 || ks.size() != 4 || ks[0] != qs[0] || kv == 0 || heads % kv != 0 ||
        qs[2] != width * hd || hd > kMaxHeadDim || (packed_kv > 0 && packed_kv != kv))
      ORT_CXX_API_THROW("KVAttention: q must be [B, S, heads * head_dim] (with kv_heads: q, k "
                        "and v packed, [B, S, (heads + 2 * kv_heads) * head_dim]) and the "
                        "buffers [B, kv_heads, W, head_dim] with heads a multiple of kv_heads "
                        "and head_dim at most 512",
                        ORT_INVALID_ARGUMENT);
    std::vector<int64_t> want = ks;
    if (int8_values) want[3] += 4;
    if ((key_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT &&
         key_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) ||
        (!int8_values && value_type != key_type) || vs != want)
      ORT_CXX_API_THROW("KVAttention: the keys must be float or float16 [B, kv_heads, W, "
                        "head_dim], the values the same, or int8 [B, kv_heads, W, head_dim + 4] "
                        "(each column's values, then its float scale's bytes)",
                        ORT_INVALID_ARGUMENT);
    qs[2] = heads * hd;
    auto out = ctx.GetOutput(0, qs);
    const bool writes = packed_kv > 0 || given(ctx, 4);
    if (!writes && given(ctx, 6))
      ORT_CXX_API_THROW("KVAttention: rotary tables need the new keys (inputs 4 and 5, or q, k "
                        "and v packed): the buffers' keys were rotated by whoever wrote them",
                        ORT_INVALID_ARGUMENT);
    // queries read in place, or from the output where the writes put them (rotated, unpacked)
    const float* queries = packed_kv > 0 || given(ctx, 6) ? out.GetTensorData<float>()
                                                          : q.GetTensorData<float>();
    std::pair<const void*, const void*> buffers = {k.GetTensorRawData(), v.GetTensorRawData()};
    if (writes) buffers = write(ctx, qs, ks, vs, out.GetTensorMutableData<float>());
    auto fill = [&](auto job) {
      job.q = queries;
      job.positions = ids.GetTensorData<int64_t>();
      job.out = out.GetTensorMutableData<float>();
      job.B = qs[0];
      job.S = qs[1];
      job.heads = heads;
      job.kv = kv;
      job.W = ks[2];
      job.hd = hd;
      job.vs = vs[3];
      job.window = window;
      job.blocks = (qs[1] + kPositions - 1) / kPositions;
      job.scale = scale;
      job.softcap = softcap;
      return job;
    };
    const bool half = key_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    if (half && int8_values)
      run(ctx, fill(Job<uint16_t, int8_t>{}), buffers.first, buffers.second);
    else if (half)
      run(ctx, fill(Job<uint16_t, uint16_t>{}), buffers.first, buffers.second);
    else if (int8_values)
      run(ctx, fill(Job<float, int8_t>{}), buffers.first, buffers.second);
    else
      run(ctx, fill(Job<float, float>{}), buffers.first, buffers.second);
  }
};

// Two registrations of one kernel: ONNX Runtime gives a custom operator's outputs of undeclared
// type the type of its first such input, so the present values can differ in type from the
// keys only where the operator declares them: KVAttentionInt8Values (the values int8).
template <bool Int8Values>
struct Op : Ort::CustomOpBase<Op<Int8Values>, Kernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return Int8Values ? "KVAttentionInt8Values" : "KVAttention"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 10; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i == 0 || i >= 4) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    if (i == 3) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    if (i == 2 && Int8Values) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // the buffers: float or float16
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i >= 4 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                  : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    if (i == 0) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    if (i == 2 && Int8Values) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i >= 1 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                  : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
};

}  // namespace

// the operators, for register.cc
const OrtCustomOp* KVAttentionOp() {
  static const Op<false> op;
  return &op;
}
const OrtCustomOp* KVAttentionInt8ValuesOp() {
  static const Op<true> op;
  return &op;
}
