// Sign packing of one chunk on the CPU, shared by the bitpack ops and the fused 1-bit Adam pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tscale {
namespace sign_pack {

// Packs x[lo, hi) (lo % 8 == 0) into the bytes bp[lo / 8 ...] and returns sum |x| (in double).
// SSE2 (every x86-64): two 4-lane compares + movemask give a byte; |x| pairs are added in float,
// then in double lanes.
inline double pack_range(const float* xp, uint8_t* bp, int64_t lo, int64_t hi) {
  int64_t i = lo;
  double abs_sum = 0.0;
#if defined(__SSE2__)
  const __m128 zero = _mm_setzero_ps();
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  __m128d acc_lo = _mm_setzero_pd(), acc_hi = _mm_setzero_pd();
  for (; i + 8 <= hi; i += 8) {
    const __m128 a = _mm_loadu_ps(xp + i), b = _mm_loadu_ps(xp + i + 4);
    const int bits_a = _mm_movemask_ps(_mm_cmpge_ps(a, zero)), bits_b = _mm_movemask_ps(_mm_cmpge_ps(b, zero));
    bp[i >> 3] = static_cast<uint8_t>(bits_a | (bits_b << 4));
    const __m128 pair = _mm_add_ps(_mm_and_ps(a, abs_mask), _mm_and_ps(b, abs_mask));
    acc_lo = _mm_add_pd(acc_lo, _mm_cvtps_pd(pair));
    acc_hi = _mm_add_pd(acc_hi, _mm_cvtps_pd(_mm_movehl_ps(pair, pair)));
  }
  double lanes[2];
  _mm_storeu_pd(lanes, _mm_add_pd(acc_lo, acc_hi));
  abs_sum = lanes[0] + lanes[1];
#endif
  for (; i < hi; i += 8) {
    uint8_t byte = 0;
    const int64_t end = std::min(hi, i + 8);
    for (int64_t j = i; j < end; ++j) {
      abs_sum += std::fabs(xp[j]);
      byte |= static_cast<uint8_t>(xp[j] >= 0.f) << (j - i);
    }
    bp[i >> 3] = byte;
  }
  return abs_sum;
}

// x[lo, hi) -= (x >= 0 ? s : -s): the residual of x after its signs were sent with scale s.
inline void subtract_signs(float* xp, float s, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) xp[i] -= xp[i] >= 0.f ? s : -s;
}

// Packs chunk x[lo, hi) into its sign bytes and returns its scale, mean |x|; with feedback,
// x keeps what the signs failed to carry.
inline float pack_chunk(float* xp, uint8_t* bp, int64_t lo, int64_t hi, bool feedback) {
  const float s = static_cast<float>(pack_range(xp, bp, lo, hi) / static_cast<double>(hi - lo));
  if (feedback) subtract_signs(xp, s, lo, hi);
  return s;
}

}  // namespace sign_pack
}  // namespace tscale
