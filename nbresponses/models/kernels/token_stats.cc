// nbr_token_stats: a row of logits to the logprob, rank and entropy of one token (and, when
// asked, the row's whole log-softmax), in three passes over the row; nbr_top: the k largest of
// a log-softmax, in one; nbr_token_stats_rows: both for many rows, on several threads.
//
// Why here: numpy needs eight passes over the vocabulary for the same numbers (the max, the
// shift, a float64 exp, its sum, the log-softmax, the rank's comparison, the entropy's product
// and its sum): ~110 us a row of 49k logits, a tenth of a scoring run's time and a row's share
// of every step that reports logprobs. Here: ~33 us (benchmarks/README.md).
//
// The numbers are numpy's definition (runtime/sampling.py's ``log_softmax``): s = x - max(x)
// in float32; the normalizer lse = log(sum(exp(s))) with exp and sum in float64; logp =
// s - float32(lse) in float32; the rank counts the logp strictly above the token's; the
// entropy is -sum(p * log p) in float64 (lse - sum(exp(s) * s) / sum(exp(s))). The exp is a
// degree-9 polynomial after range reduction (relative error < 7e-12, far under float32's
// rounding), each term of the sums in one fixed place (16 lane sums per pass over the row, then
// a fixed reduction), so a row's numbers are the same bits from the AVX-512 and the AVX2 code,
// alone or among others. s below -700 counts as -700 (e^-700 cannot move a float64 sum that
// holds exp(0) = 1), which keeps every power of two normal and -inf logits harmless; the tail
// of a row is padded with -inf the same way.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

namespace {

constexpr int kChunk = 16;  // floats per step: two groups of 8 float64 lanes
constexpr double kFloor = -700.0;

#if defined(__AVX512F__)
struct D8 {
  __m512d v;
};
inline D8 shifted(const float* p, float max) {  // x - max in float32, then widened
  return {_mm512_cvtps_pd(_mm256_sub_ps(_mm256_loadu_ps(p), _mm256_set1_ps(max)))};
}
inline D8 set1(double x) { return {_mm512_set1_pd(x)}; }
inline D8 add(D8 a, D8 b) { return {_mm512_add_pd(a.v, b.v)}; }
inline D8 mul(D8 a, D8 b) { return {_mm512_mul_pd(a.v, b.v)}; }
inline D8 fma(D8 a, D8 b, D8 c) { return {_mm512_fmadd_pd(a.v, b.v, c.v)}; }
inline D8 fnma(D8 a, D8 b, D8 c) { return {_mm512_fnmadd_pd(a.v, b.v, c.v)}; }
inline D8 nearest(D8 a) {
  return {_mm512_roundscale_pd(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline D8 times_pow2(D8 p, D8 n) { return {_mm512_scalef_pd(p.v, n.v)}; }  // n integral
inline D8 at_least(D8 x, double floor) { return {_mm512_max_pd(x.v, _mm512_set1_pd(floor))}; }
inline void spill(double* out, D8 a) { _mm512_storeu_pd(out, a.v); }
#else  // AVX2: the same lane-wise operations, four lanes at a time
struct D8 {
  __m256d lo, hi;
};
inline D8 shifted(const float* p, float max) {
  const __m128 m = _mm_set1_ps(max);
  return {_mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(p), m)),
          _mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(p + 4), m))};
}
inline D8 set1(double x) { return {_mm256_set1_pd(x), _mm256_set1_pd(x)}; }
inline D8 add(D8 a, D8 b) { return {_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)}; }
inline D8 mul(D8 a, D8 b) { return {_mm256_mul_pd(a.lo, b.lo), _mm256_mul_pd(a.hi, b.hi)}; }
inline D8 fma(D8 a, D8 b, D8 c) {
  return {_mm256_fmadd_pd(a.lo, b.lo, c.lo), _mm256_fmadd_pd(a.hi, b.hi, c.hi)};
}
inline D8 fnma(D8 a, D8 b, D8 c) {
  return {_mm256_fnmadd_pd(a.lo, b.lo, c.lo), _mm256_fnmadd_pd(a.hi, b.hi, c.hi)};
}
inline D8 nearest(D8 a) {
  constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_pd(a.lo, kMode), _mm256_round_pd(a.hi, kMode)};
}
inline __m256d pow2(__m256d n) {  // 2^n for integral n in the normal range, built exactly
  const __m128i e = _mm_add_epi32(_mm256_cvtpd_epi32(n), _mm_set1_epi32(1023));
  return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_cvtepi32_epi64(e), 52));
}
inline D8 times_pow2(D8 p, D8 n) {
  return {_mm256_mul_pd(p.lo, pow2(n.lo)), _mm256_mul_pd(p.hi, pow2(n.hi))};
}
inline D8 at_least(D8 x, double floor) {
  const __m256d f = _mm256_set1_pd(floor);
  return {_mm256_max_pd(x.lo, f), _mm256_max_pd(x.hi, f)};
}
inline void spill(double* out, D8 a) {
  _mm256_storeu_pd(out, a.lo);
  _mm256_storeu_pd(out + 4, a.hi);
}
#endif

// e^x for kFloor <= x <= 0 (x = n ln2 + r, |r| <= ln2 / 2; the Taylor polynomial of degree 9
// of e^r: relative error < 7e-12).
inline D8 exp8(D8 x) {
  const D8 n = nearest(mul(x, set1(1.4426950408889634)));
  D8 r = fnma(n, set1(6.93147180369123816490e-01), x);  // ln2 in two parts (Cody and Waite)
  r = fnma(n, set1(1.90821492927058770002e-10), r);
  static constexpr double kInverseFactorials[] = {
      1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2,
      1.0,          1.0};
  D8 p = set1(kInverseFactorials[0]);
  for (int i = 1; i < 10; ++i) p = fma(p, r, set1(kInverseFactorials[i]));
  return times_pow2(p, n);
}

// The 8 lanes summed in one order: halves, quarters, neighbours.
inline double reduce(D8 a) {
  double lanes[8];
  spill(lanes, a);
  const double q[4] = {lanes[0] + lanes[4], lanes[1] + lanes[5], lanes[2] + lanes[6],
                       lanes[3] + lanes[7]};
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// The row's maximum (any order gives the same) and whether it holds a NaN. In vectors: the
// compiler leaves a scalar max alone (its NaN rules differ from the instruction's).
inline float max_of(const float* x, int64_t n, bool* nan) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(best);
  __mmask16 unordered = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    m = _mm512_max_ps(m, v);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  best = _mm512_reduce_max_ps(m);
  *nan = unordered != 0;
#else
  __m256 m = _mm256_set1_ps(best), unordered = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    m = _mm256_max_ps(m, v);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  for (float lane : lanes) best = lane > best ? lane : best;
  *nan = _mm256_movemask_ps(unordered) != 0;
#endif
  for (; i < n; ++i) {
    best = x[i] > best ? x[i] : best;
    *nan |= x[i] != x[i];
  }
  return best;
}

}  // namespace

// ``logits`` [vocab] float32; ``target`` in [0, vocab). Writes the token's logprob and the
// entropy (nats), and the whole log-softmax into ``logp`` unless it is null; returns the rank
// (1 + the number of tokens with a larger logprob). A NaN among the logits gives NaNs.
extern "C" int64_t nbr_token_stats(const float* logits, int64_t vocab, int64_t target,
                                   float* logp, float* logprob, double* entropy) {
  bool nan = false;
  const float max = max_of(logits, vocab, &nan);
  if (nan || !std::isfinite(max)) {  // numpy's log-softmax is NaN throughout then
    *logprob = std::numeric_limits<float>::quiet_NaN();
    *entropy = std::numeric_limits<double>::quiet_NaN();
    if (logp != nullptr) std::fill(logp, logp + vocab, *logprob);
    return 1;
  }
  D8 total[2] = {set1(0.0), set1(0.0)};
  D8 weighted[2] = {set1(0.0), set1(0.0)};  // sum of exp(s) * s
  alignas(64) float tail[kChunk];  // the last chunk, padded with -inf (exp 0, product 0)
  for (int64_t start = 0; start < vocab; start += kChunk) {
    const float* x = logits + start;
    if (start + kChunk > vocab) {
      for (int i = 0; i < kChunk; ++i)
        tail[i] = start + i < vocab ? logits[start + i] : -std::numeric_limits<float>::infinity();
      x = tail;
    }
    for (int half = 0; half < 2; ++half) {
      const D8 wide = at_least(shifted(x + 8 * half, max), kFloor);
      const D8 e = exp8(wide);
      total[half] = add(total[half], e);
      weighted[half] = fma(e, wide, weighted[half]);
    }
  }
  const double sum = reduce(add(total[0], total[1]));
  const double lse = std::log(sum);
  const float normalizer = static_cast<float>(lse);
  *entropy = lse - reduce(add(weighted[0], weighted[1])) / sum;
  const float own = (logits[target] - max) - normalizer;
  *logprob = own;
  int64_t above = 0;  // the loops are vectorised by the compiler: a count, in any order
  if (logp == nullptr) {
    for (int64_t i = 0; i < vocab; ++i) above += ((logits[i] - max) - normalizer) > own;
  } else {
    for (int64_t i = 0; i < vocab; ++i) {
      logp[i] = (logits[i] - max) - normalizer;
      above += logp[i] > own;
    }
  }
  return 1 + above;
}

// The k largest values of ``logp`` [vocab] into ``ids`` and ``values`` (room for k), largest
// first, equal values by lower index, NaNs left out: runtime/sampling.py's ``top_k``. Returns
// how many (min(k, vocab) but for NaNs).
//
// Why here: numpy's ``top_k`` (a bound from strided maxima, a partition, a selection, a sort)
// took ~25 us a row of 49k and building the pairs ~12 more, the larger part of a row's
// logprobs with top_logprobs=20 (benchmarks/README.md). Here: one pass that compares 16 values
// at a time against the k-th best so far and inserts the rare few above it.
extern "C" int64_t nbr_top(const float* logp, int64_t vocab, int64_t k, int64_t* ids,
                           float* values) {
  if (k <= 0) return 0;
  int64_t count = 0;
  // a value above the k-th (or any while fewer than k) moves the smaller ones down one place;
  // an equal one stays after them (its index is higher: the scan goes up the row)
  auto insert = [&](int64_t i, float v) {
    int64_t at = count < k ? count++ : k - 1;
    for (; at > 0 && values[at - 1] < v; --at) {
      values[at] = values[at - 1];
      ids[at] = ids[at - 1];
    }
    values[at] = v;
    ids[at] = i;
  };
  int64_t i = 0;
  for (; i < vocab && count < k; ++i)
    if (logp[i] == logp[i]) insert(i, logp[i]);
#if defined(__AVX512F__)
  for (; i + 16 <= vocab; i += 16) {
    __mmask16 above = _mm512_cmp_ps_mask(_mm512_loadu_ps(logp + i),
                                         _mm512_set1_ps(values[k - 1]), _CMP_GT_OQ);
    for (; above != 0; above &= above - 1) {
      const int64_t at = i + __builtin_ctz(above);
      if (logp[at] > values[k - 1]) insert(at, logp[at]);  // the bar may have risen since
    }
  }
#else
  for (; i + 8 <= vocab; i += 8) {
    int above = _mm256_movemask_ps(
        _mm256_cmp_ps(_mm256_loadu_ps(logp + i), _mm256_set1_ps(values[k - 1]), _CMP_GT_OQ));
    for (; above != 0; above &= above - 1) {
      const int64_t at = i + __builtin_ctz(above);
      if (logp[at] > values[k - 1]) insert(at, logp[at]);
    }
  }
#endif
  for (; i < vocab; ++i)
    if (logp[i] > values[k - 1]) insert(i, logp[i]);
  return count;
}

// Many rows at once: row r of ``logits`` (``stride`` floats apart) and its token ``targets[r]``
// to ``logprob[r]``, ``entropy[r]`` and ``rank[r]`` as nbr_token_stats gives them, its
// log-softmax into row r of ``logp`` (``vocab`` apart) unless null, and with k > 0 its k best
// into ``ids`` / ``values`` (k apart; ``logp`` required) and their number into ``counts[r]``.
//
// Why: a scoring run's positions and a decode step's rows are independent rows, and between
// two graph runs both cores are idle: ``threads`` contiguous shares of the rows, each computed
// exactly as alone (a row's numbers never depend on the others, the split or the threads), on
// threads started here (a few microseconds each against ~35 a row of 49k). One call instead of
// two a row also spares the Python of a call (ctypes' conversions) per row.
extern "C" void nbr_token_stats_rows(const float* logits, int64_t rows, int64_t vocab,
                                     int64_t stride, const int64_t* targets, float* logp,
                                     float* logprob, double* entropy, int64_t* rank, int64_t k,
                                     int64_t* ids, float* values, int64_t* counts,
                                     int64_t threads) {
  auto share = [=](int64_t from, int64_t to) {
    for (int64_t r = from; r < to; ++r) {
      float* out = logp == nullptr ? nullptr : logp + r * vocab;
      rank[r] = nbr_token_stats(logits + r * stride, vocab, targets[r], out, logprob + r,
                                entropy + r);
      if (k > 0) counts[r] = nbr_top(out, vocab, k, ids + r * k, values + r * k);
    }
  };
  const int64_t parts = std::max<int64_t>(1, std::min(threads, rows));
  std::vector<std::thread> others;
  int64_t p = 1;
  try {  // a thread that cannot start leaves its shares to this one (no exception leaves C)
    for (; p < parts; ++p) others.emplace_back(share, rows * p / parts, rows * (p + 1) / parts);
  } catch (...) {
  }
  share(0, rows / parts);
  share(rows * p / parts, rows);  // the shares no thread took (none when all started)
  for (auto& t : others) t.join();
}
