// Hand-written AVX-512 int8_outlier compress and decompress: a yardstick
// for what any code can do on this CPU, not a codec path (bench only; see
// bench_codec_bound.py). The payload is the codec's, bit for bit:
// kernels/int_outlier.py documents the format.
//
// One pass per row: a row of float32 (a few KiB) stays in L1 between a
// group's statistics and its codes, so the value is read from memory once,
// and every select is a mask register, not a vector.

#include <torch/extension.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kGroup = 64;   // int8_outlier's channels per group
constexpr float kQmax = 127.f;
constexpr float kSpecialLimit = 125.5f;  // IntFormat.special_limit (int8)
constexpr float kMinScale = 1.17549435e-38f;  // 2^-126

// Lanes of the regular (not outlier) channels, 16 per mask.
std::vector<__mmask16> regular_masks(const torch::Tensor& index, int64_t channels) {
  std::vector<__mmask16> masks(channels / 16, 0xFFFF);
  const int32_t* idx = index.data_ptr<int32_t>();
  for (int64_t k = 0; k < index.size(0); ++k) masks[idx[k] / 16] &= ~(1u << (idx[k] % 16));
  return masks;
}

void check(const torch::Tensor& x, const torch::Tensor& index) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "a contiguous float32 [rows, channels] value");
  TORCH_CHECK(x.size(1) % kGroup == 0, "channels a multiple of 64 (no padding group)");
  TORCH_CHECK(index.scalar_type() == torch::kInt32 && index.dim() == 1, "an int32 index");
}

}  // namespace

std::vector<torch::Tensor> compress(torch::Tensor x, torch::Tensor index) {
  check(x, index);
  const int64_t rows = x.size(0), channels = x.size(1), groups = channels / kGroup, slots = index.size(0);
  auto codes = torch::empty({rows, channels}, torch::kInt8);
  auto scales = torch::empty({rows, groups}, torch::kBFloat16);
  auto values = torch::empty({rows, slots}, torch::kFloat32);
  const std::vector<__mmask16> regular = regular_masks(index, channels);
  const int32_t* idx = index.data_ptr<int32_t>();
  const float* xp = x.data_ptr<float>();
  int8_t* cp = codes.data_ptr<int8_t>();
  auto* sp = reinterpret_cast<uint16_t*>(scales.data_ptr<at::BFloat16>());
  float* vp = values.data_ptr<float>();
  const __m512 inf = _mm512_set1_ps(INFINITY), lo = _mm512_set1_ps(-kQmax), hi = _mm512_set1_ps(kQmax);
  const __m512 nan_code = _mm512_set1_ps(-kQmax - 1.f);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xp + r * channels;
    for (int64_t g = 0; g < groups; ++g) {
      const float* p = row + g * kGroup;
      const __mmask16* reg = regular.data() + g * 4;
      __m512 v[4];
      __m512 top = _mm512_setzero_ps();
      __mmask16 special = 0;
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm512_loadu_ps(p + 16 * j);
        const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v[j]), magnitude));
        const __mmask16 finite = _mm512_cmp_ps_mask(a, inf, _CMP_LT_OQ);
        special |= reg[j] & static_cast<__mmask16>(~finite);
        top = _mm512_mask_max_ps(top, reg[j] & finite, top, a);
      }
      // The reference: bfloat16 truncation of (largest / limit), at least MIN_SCALE.
      float scale = _mm512_reduce_max_ps(top) / (special ? kSpecialLimit : kQmax);
      uint32_t bits;
      std::memcpy(&bits, &scale, 4);
      bits &= 0xFFFF0000u;
      std::memcpy(&scale, &bits, 4);
      scale = scale < kMinScale ? kMinScale : scale;
      const __m512 reciprocal = _mm512_set1_ps(1.f / scale);
      for (int j = 0; j < 4; ++j) {
        __m512 y = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v[j], reciprocal), lo), hi);
        y = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(v[j], v[j], _CMP_UNORD_Q), nan_code);
        y = _mm512_maskz_mov_ps(reg[j], y);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(cp + r * channels + g * kGroup + 16 * j),
                         _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(y)));
      }
      const float stored = special ? -scale : scale;
      std::memcpy(&bits, &stored, 4);
      sp[r * groups + g] = static_cast<uint16_t>(bits >> 16);
    }
    for (int64_t k = 0; k < slots; ++k) vp[r * slots + k] = row[idx[k]];
  }
  return {codes, scales, index, values};
}

torch::Tensor decompress(torch::Tensor codes, torch::Tensor scales, torch::Tensor index, torch::Tensor values) {
  TORCH_CHECK(codes.scalar_type() == torch::kInt8 && codes.is_contiguous(), "int8 codes");
  TORCH_CHECK(scales.scalar_type() == torch::kBFloat16 && scales.is_contiguous(), "bfloat16 scales");
  const int64_t rows = codes.size(0), channels = codes.size(1), groups = channels / kGroup, slots = index.size(0);
  TORCH_CHECK(channels % kGroup == 0, "channels a multiple of 64 (no padding group)");
  auto out = torch::empty({rows, channels}, torch::kFloat32);
  const int32_t* idx = index.data_ptr<int32_t>();
  const int8_t* cp = codes.data_ptr<int8_t>();
  const auto* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>());
  const float* vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const __m512 inf = _mm512_set1_ps(INFINITY), nan = _mm512_set1_ps(NAN);
  const __m512 reserved = _mm512_set1_ps(kQmax - 0.5f), nan_below = _mm512_set1_ps(-kQmax - 0.5f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const uint32_t bits = static_cast<uint32_t>(sp[r * groups + g]) << 16;
      float s;
      std::memcpy(&s, &bits, 4);
      const bool special = bits >> 31;
      const __m512 scale = _mm512_set1_ps(std::fabs(s));
      for (int j = 0; j < 4; ++j) {
        const int64_t at = r * channels + g * kGroup + 16 * j;
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(cp + at));
        const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
        __m512 factor = scale;
        if (special) {  // the aten form's reserved codes: q * (NaN or Inf)
          const __m512 a = _mm512_abs_ps(q);
          const __mmask16 flagged = _mm512_cmp_ps_mask(a, reserved, _CMP_GT_OQ);
          const __mmask16 is_nan = _mm512_cmp_ps_mask(q, nan_below, _CMP_LT_OQ);
          factor = _mm512_mask_mov_ps(factor, flagged, _mm512_mask_mov_ps(inf, is_nan, nan));
        }
        _mm512_storeu_ps(op + at, _mm512_mul_ps(q, factor));
      }
    }
    for (int64_t k = 0; k < slots; ++k) op[r * channels + idx[k]] = vp[r * slots + k];
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("compress", &compress, "int8_outlier compress, one pass (AVX-512)");
  m.def("decompress", &decompress, "int8_outlier decompress (AVX-512)");
}
