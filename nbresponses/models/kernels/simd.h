#pragma once
// The vector helpers our operators share: AVX-512 where the build has it, else AVX2 with F16C
// and FMA (-march=native picks; the tests also build the AVX2 code on AVX-512 machines).
#include <immintrin.h>

#include <cstdint>

namespace nbr {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using Vec = __m512;
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Vec load(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec broadcast(float x) { return _mm512_set1_ps(x); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }  // a NaN in a: b
inline Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline Vec abs(Vec a) { return _mm512_abs_ps(a); }
inline Vec round(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
constexpr int kLanes = 8;
using Vec = __m256;
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Vec load(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec broadcast(float x) { return _mm256_set1_ps(x); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }  // a NaN in a: b
inline Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline Vec abs(Vec a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), a); }
inline Vec round(Vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }  // half to even
#else
#error "nbresponses' operators need AVX2 with F16C and FMA, or AVX-512"
#endif

// kLanes lanes' quantized values (integers as floats, within [-128, 127]) plus
// the zero point, stored as kLanes bytes
inline void store_bytes(uint8_t* q, Vec v) {
#if defined(__AVX512F__)
  const __m512i x = _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(128));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(x));
#else
  const __m256i x = _mm256_add_epi32(_mm256_cvtps_epi32(v), _mm256_set1_epi32(128));
  const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packus_epi16(words, words));
#endif
}

// kLanes lanes' values (integers as floats, within [-128, 127]) stored as kLanes signed bytes
inline void store_signed_bytes(int8_t* q, Vec v) {
#if defined(__AVX512F__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
#else
  const __m256i x = _mm256_cvtps_epi32(v);
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(words, words));
#endif
}

inline float scalar(float x) { return x; }
inline float scalar(uint16_t h) { return _cvtsh_ss(h); }
inline float scalar(int8_t b) { return static_cast<float>(b); }

}  // namespace nbr
