// CPU experts of a hybrid (KTransformers-style) MoE layer: one call computes every routed
// (token, CPU expert) pair of a layer, on a thread pool that stays hot between layers.
//
// Decode is bound by host memory bandwidth: each routed expert's weights must be read once per step
// (9.4 MB per Qwen3-30B-A3B expert in bf16), so the kernel reads every weight row exactly once, decodes it
// in registers (bf16 / int8 / int4 / fp8 / mxfp4: a few vector ops per 16 values), and dots it with every
// token routed to that expert, two rows side by side. Work is split by output rows across all
// routed experts (so tasks are equal and no two tasks write the same output):
//   phase A: rows r of gate and up  -> act[pair, r] = silu(gate . x) * (up . x)
//   phase B: rows h of down         -> out[token, h] = sum over the token's pairs of weight * (down . act)
// Products are summed in fp32; bf16 models with BF16 or INT4 experts feed bf16 activations to vdpbf16ps
// (rows_dot_bf16), INT8 experts' gate/up take int8 activations to vpdpbusd (rows_dot_int8, exact int32
// sums), everything else decodes to fp32 and uses FMAs (rows_dot).
//
// Inputs and outputs live in (pinned) host buffers the caller owns. A step can be launched three ways:
//   ktc_run(layer)                      synchronous (CPU-only models, tests)
//   ktc_enqueue_submit / _wait(stream)  on a CUDA stream, stream-ordered (a CUDA graph can capture them; the
//                                       token count is read from memory when the step runs: graph batches
//                                       are padded). The GPU keeps computing its own experts in between.
//     with the doorbell (ktc_engine_create's `doorbell`): two words in pinned memory. Submit is a stream
//       write (cuStreamWriteValue32) of ring = layer index + 1, which an idle pool thread polls for and
//       answers by starting the step; the step's last task writes done = index + 1; wait is a stream wait
//       on it (cuStreamWaitValue32), then a stream write clearing it. The stream never hands control to
//       the host: on the H200 a step with nothing to compute costs 53 us per layer this way, 90 with host
//       functions (benchmark/kt_decode/probe_doorbell.py).
//     else host functions (cuLaunchHostFunc): submit starts the pool and returns, wait blocks the stream
//       until the pool is done.
// Neither makes CUDA calls from the pool nor touches Python (no GIL on the decode path).
// Portable C++20 with GCC vector extensions: -march=native picks AVX-512 / AVX2 / NEON.

#include <dlfcn.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <sched.h>
#include <sys/prctl.h>
#include <vector>

namespace {

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef int8_t v16i8 __attribute__((vector_size(16)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));

enum Format : int { F32 = 0, BF16 = 1, INT8 = 2, INT4 = 3, FP8 = 4, MXFP4 = 5 };

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <typename V>
inline V load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

inline float bf16_to_float(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// float8_e4m3fn: the 7 magnitude bits placed at fp32's exponent/mantissa boundary, then scaled by 2^120
// (the exponent-bias difference, 127 - 7). Subnormals come out right because fp32 keeps them too.
constexpr float kFp8Rescale = 1.329227995784916e36f;  // 2^120
// decode16<FP8> gives value * 2^-8 (fp16's exponent bias is 8 above e4m3's: the AVX-512 path converts through fp16
// with no multiply); the vector loop folds the 2^8 into each group's scale.
constexpr float kFp8VectorUnit = 1.0f / 256.0f;
inline float fp8_to_float(uint8_t b) {
  uint32_t u = (uint32_t(b & 0x80) << 24) | (uint32_t(b & 0x7f) << 20);
  float f;
  std::memcpy(&f, &u, 4);
  return f * kFp8Rescale;
}

constexpr float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline float e8m0_to_float(uint8_t e) {  // 2^(e-127); code 0 reads as 0 (the Python side's rule)
  uint32_t u = uint32_t(e) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// One stacked expert matrix of a layer: [experts, rows, cols] in `format`, plus its scales.
struct Matrix {
  const uint8_t* weight;
  const void* scale;
  int rows, cols;
  int64_t row_bytes;     // bytes of one stored row
  int64_t expert_bytes;  // bytes of one expert's stored matrix
  int scale_rows, scale_cols;  // scale tensor of one expert: [scale_rows, scale_cols]
  int group_n, group_k;        // rows / cols sharing one scale (format-specific)
};

// ---- decoding: 16 stored values (32 for the nibble formats) to floats ----------------------------
// AVX-512 intrinsics where the compiler targets them; GCC vector extensions elsewhere (AVX2, NEON, ...).

template <int FMT>
constexpr int chunk_values() {
  return (FMT == INT4 || FMT == MXFP4) ? 32 : 16;
}

// Values k..k+15 of a row (k a multiple of 16) for the byte-per-value and wider formats, unscaled.
template <int FMT>
inline v16f decode16(const uint8_t* row, int k) {
#if defined(__AVX512F__)
  __m512 v;
  if constexpr (FMT == F32) {
    v = _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (FMT == BF16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
    v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (FMT == INT8) {
    v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k))));
  } else {  // FP8 e4m3 as fp16 bits (value * 2^-8, kFp8VectorUnit): sign-extend, shift the 7 magnitude bits to
            // fp16's bits 13..7, keep the sign in bit 15, then the hardware's fp16 -> fp32 (subnormals exact)
    __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
    v = _mm512_cvtph_ps(h);
  }
  v16f out;
  std::memcpy(&out, &v, 64);
  return out;
#else
  if constexpr (FMT == F32) {
    return load<v16f>(row + 4 * k);
  } else if constexpr (FMT == BF16) {
    return (v16f)(__builtin_convertvector(load<v16u16>(row + 2 * k), v16u) << 16);
  } else if constexpr (FMT == INT8) {
    return __builtin_convertvector(load<v16i8>(row + k), v16f);
  } else {  // FP8: value * 2^-8 as on the AVX-512 path (fp32 bits, rescaled by 2^(120 - 8))
    v16u u = __builtin_convertvector(load<v16u8>(row + k), v16u);
    return (v16f)(((u & 0x80) << 24) | ((u & 0x7f) << 20)) * (kFp8Rescale * kFp8VectorUnit);
  }
#endif
}

// Values k..k+31 of a nibble-packed row (k a multiple of 32): element 2j is byte j's low nibble.
template <int FMT>
inline void decode32(const uint8_t* row, int k, v16f& first, v16f& second) {
  const v16i even = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
  const v16i odd = even + 8;
  v16u8 b = load<v16u8>(row + k / 2);
  v16i lo = __builtin_convertvector(b & 0x0f, v16i), hi = __builtin_convertvector(b >> 4, v16i);
  v16f flo, fhi;
  if constexpr (FMT == INT4) {
    flo = __builtin_convertvector(lo - 8, v16f);
    fhi = __builtin_convertvector(hi - 8, v16f);
  } else {
    const v16f table = load<v16f>(kE2M1);
    flo = __builtin_shuffle(table, lo);
    fhi = __builtin_shuffle(table, hi);
  }
  first = __builtin_shuffle(flo, fhi, even);
  second = __builtin_shuffle(flo, fhi, odd);
}

// One stored value, unscaled (row tails).
template <int FMT>
inline float decode1(const uint8_t* row, int k) {
  if constexpr (FMT == F32) return reinterpret_cast<const float*>(row)[k];
  if constexpr (FMT == BF16) return bf16_to_float(reinterpret_cast<const uint16_t*>(row)[k]);
  if constexpr (FMT == INT8) return float(reinterpret_cast<const int8_t*>(row)[k]);
  if constexpr (FMT == FP8) return fp8_to_float(row[k]);
  const int code = (row[k / 2] >> (4 * (k & 1))) & 0x0f;
  if constexpr (FMT == INT4) return float(code - 8);
  return kE2M1[code];
}

// The scale of the values at column k of row r of expert e (1 for BF16/F32; INT8 scales whole rows).
template <int FMT>
inline float scale_at(const Matrix& m, int e, int r, int k) {
  if constexpr (FMT == F32 || FMT == BF16) return 1.0f;
  if constexpr (FMT == INT8) return static_cast<const float*>(m.scale)[int64_t(e) * m.scale_rows + r];
  const int64_t base = int64_t(e) * m.scale_rows * m.scale_cols;
  if constexpr (FMT == FP8)
    return static_cast<const float*>(m.scale)[base + int64_t(r / m.group_n) * m.scale_cols + k / m.group_k];
  if constexpr (FMT == INT4) return static_cast<const float*>(m.scale)[base + int64_t(r) * m.scale_cols + k / m.group_k];
  return e8m0_to_float(static_cast<const uint8_t*>(m.scale)[base + int64_t(r) * m.scale_cols + k / m.group_k]);
}

inline float hsum(v16f v) {
  float s = 0;
  for (int j = 0; j < 16; ++j) s += v[j];
  return s;
}

// out[j][i] = row rows[j] of expert e (decoded, scaled) . xs[i], for R rows and N vectors at once: each
// row is read once for all vectors, decoded in registers, and R rows stream side by side (more loads in
// flight per core: decode is bound by how many cache misses each core keeps going).
constexpr int kPrefetchBytes = 1024;

template <int FMT, int R, int N>
inline void rows_dot(const Matrix& m, int e, const int* rows, const float* const* xs, float (*out)[4]) {
  const uint8_t* base[R];
  for (int j = 0; j < R; ++j) base[j] = m.weight + e * m.expert_bytes + rows[j] * m.row_bytes;
  const int cols = m.cols;
  constexpr int C = chunk_values<FMT>();
  constexpr bool grouped = FMT == INT4 || FMT == FP8 || FMT == MXFP4;
  constexpr int bytes_per_chunk = FMT == F32 ? 64 : FMT == BF16 ? 32 : 16;
  // Group formats apply their scale per chunk, so a chunk must not straddle two groups.
  const bool vector = !grouped || m.group_k % C == 0;
  v16f acc[R][N] = {};
  int k = 0;
  if (vector) {
    // Group formats: each row's scale is looked up once per group of group_k columns, not per chunk (the lookup
    // divides by the group sizes); FP8's scale also takes decode16's 2^8 (kFp8VectorUnit).
    constexpr float unit = FMT == FP8 ? 1.0f / kFp8VectorUnit : 1.0f;
    float s[R];
    int group_end = 0;
    for (; k + C <= cols; k += C) {
      const int64_t byte = int64_t(k / C) * bytes_per_chunk;
      if constexpr (grouped) {
        if (k == group_end) {
          for (int j = 0; j < R; ++j) s[j] = scale_at<FMT>(m, e, rows[j], k) * unit;
          group_end += m.group_k;
        }
      }
#pragma GCC unroll 2
      for (int j = 0; j < R; ++j) {
        __builtin_prefetch(base[j] + byte + kPrefetchBytes, 0, 3);
        v16f a, b = {};
        if constexpr (C == 32) {
          decode32<FMT>(base[j], k, a, b);
        } else {
          a = decode16<FMT>(base[j], k);
        }
        if constexpr (grouped) {
          a *= s[j];
          if constexpr (C == 32) b *= s[j];
        }
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          acc[j][i] += a * load<v16f>(xs[i] + k);
          if constexpr (C == 32) acc[j][i] += b * load<v16f>(xs[i] + k + 16);
        }
      }
    }
  }
  for (int j = 0; j < R; ++j) {
    float tail[N] = {};
    for (int kk = k; kk < cols; ++kk) {
      const float w = decode1<FMT>(base[j], kk) * (grouped ? scale_at<FMT>(m, e, rows[j], kk) : 1.0f);
      for (int i = 0; i < N; ++i) tail[i] += w * xs[i][kk];
    }
    const float row_scale = FMT == INT8 ? scale_at<FMT>(m, e, rows[j], 0) : 1.0f;
    for (int i = 0; i < N; ++i) out[j][i] = (hsum(acc[j][i]) + tail[i]) * row_scale;
  }
}

// Dot products of R rows with n (any count) vectors, four vectors at a time: out[j][i].
template <int FMT, int R>
inline void rows_dots(const Matrix& m, int e, const int* rows, const float* const* xs, int n, float (*out)[64]) {
  float part[R][4];
  for (int i = 0; i < n; i += 4) {
    const int left = n - i;
    switch (left >= 4 ? 4 : left) {
      case 4: rows_dot<FMT, R, 4>(m, e, rows, xs + i, part); break;
      case 3: rows_dot<FMT, R, 3>(m, e, rows, xs + i, part); break;
      case 2: rows_dot<FMT, R, 2>(m, e, rows, xs + i, part); break;
      default: rows_dot<FMT, R, 1>(m, e, rows, xs + i, part); break;
    }
    for (int j = 0; j < R; ++j)
      for (int q = 0; q < 4 && i + q < n; ++q) out[j][i + q] = part[j][q];
  }
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
constexpr bool kHaveBf16Dot = true;

// The bf16 path (bf16 models; BF16 experts, and INT4 experts with groups of 32, 64 or a multiple of 128): bf16
// weights and bf16 activations (as the GPU's MoE kernels use them) go to vdpbf16ps, products summed in fp32: 32
// multiply-adds per instruction. BF16 weights are used as stored; INT4 nibbles become bf16 through one
// 32-entry table lookup (vpermw) per 32 values, the group scale applied to each group's sum. The fp32 path
// spends several instructions per 16 values before its FMAs (for INT4, three times as many).

// Where activation k of a row sits in the bf16 path's buffers: in order (BF16), or the even elements
// first and then the odd ones (INT4: byte j holds elements 2j and 2j+1, so each nibble half of a run of
// bytes meets a contiguous run of activations).
template <int FMT>
inline int64_t act_index(int k, int cols) {
  return FMT == INT4 ? int64_t(k & 1) * (cols / 2) + k / 2 : k;
}

template <int FMT, int R, int N>
inline void rows_dot_bf16(const Matrix& m, int e, const int* rows, const uint16_t* const* xs, float (*out)[8]) {
  const uint8_t* base[R];
  for (int j = 0; j < R; ++j) base[j] = m.weight + e * m.expert_bytes + rows[j] * m.row_bytes;
  const int cols = m.cols;
  __m512 acc[R][N];
  for (int j = 0; j < R; ++j)
    for (int i = 0; i < N; ++i) acc[j][i] = _mm512_setzero_ps();
  int k = 0;
  if constexpr (FMT == BF16) {
    for (; k + 32 <= cols; k += 32) {
      __m512bh w[R];
      for (int j = 0; j < R; ++j) {
        __builtin_prefetch(base[j] + 2 * k + kPrefetchBytes, 0, 3);
        w[j] = (__m512bh)_mm512_loadu_si512(base[j] + 2 * k);
      }
#pragma GCC unroll 8
      for (int i = 0; i < N; ++i) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(xs[i] + k);
        for (int j = 0; j < R; ++j) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], w[j], xv);
      }
    }
  } else {  // INT4, 128 values (64 bytes) at a time
    alignas(64) static const uint16_t kInt4Bf16[32] = {
        0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,  // -8 .. -1
        0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,  //  0 .. 7
        0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,  // (indices 16..31 unused)
        0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0};
    const __m512i table = _mm512_load_si512(kInt4Bf16);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const int half = cols / 2;
    // Which of the 128 values a product lane sums: w[0] x x0 and w[2] x x2 cover values 0-63 (fp32 lanes 0-7 values
    // 0-31, lanes 8-15 values 32-63), w[1] x x1 and w[3] x x3 values 64-127 alike. Groups of 128 or more: one scale
    // for all four; of 64: one for each pair; of 32: one for each half of each pair's lanes.
    const bool one_group = m.group_k % 128 == 0;
    for (; k + 128 <= cols; k += 128) {
      __m512bh w[R][4];
      __m512 scale[R], scale_hi[R];
      for (int j = 0; j < R; ++j) {
        __builtin_prefetch(base[j] + k / 2 + kPrefetchBytes, 0, 3);
        const __m512i b = _mm512_loadu_si512(base[j] + k / 2);
        const __m512i lo = _mm512_and_si512(b, low4), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
        w[j][0] = (__m512bh)_mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(lo)), table);
        w[j][1] = (__m512bh)_mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(lo, 1)), table);
        w[j][2] = (__m512bh)_mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(hi)), table);
        w[j][3] = (__m512bh)_mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(hi, 1)), table);
        scale[j] = _mm512_set1_ps(scale_at<INT4>(m, e, rows[j], k));
        if (one_group) continue;
        if (m.group_k == 64) {
          scale_hi[j] = _mm512_set1_ps(scale_at<INT4>(m, e, rows[j], k + 64));
        } else {  // 32
          scale[j] = _mm512_insertf32x8(scale[j], _mm256_set1_ps(scale_at<INT4>(m, e, rows[j], k + 32)), 1);
          scale_hi[j] = _mm512_insertf32x8(_mm512_set1_ps(scale_at<INT4>(m, e, rows[j], k + 64)),
                                           _mm256_set1_ps(scale_at<INT4>(m, e, rows[j], k + 96)), 1);
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < N; ++i) {
        const uint16_t* even = xs[i] + k / 2;
        const uint16_t* odd = xs[i] + half + k / 2;
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(even), x1 = (__m512bh)_mm512_loadu_si512(even + 32);
        const __m512bh x2 = (__m512bh)_mm512_loadu_si512(odd), x3 = (__m512bh)_mm512_loadu_si512(odd + 32);
        for (int j = 0; j < R; ++j) {
          if (one_group) {
            __m512 group = _mm512_dpbf16_ps(_mm512_setzero_ps(), w[j][0], x0);
            group = _mm512_dpbf16_ps(group, w[j][1], x1);
            group = _mm512_dpbf16_ps(group, w[j][2], x2);
            group = _mm512_dpbf16_ps(group, w[j][3], x3);
            acc[j][i] = _mm512_fmadd_ps(group, scale[j], acc[j][i]);
          } else {
            __m512 lo = _mm512_dpbf16_ps(_mm512_setzero_ps(), w[j][0], x0);
            __m512 hi = _mm512_dpbf16_ps(_mm512_setzero_ps(), w[j][1], x1);
            lo = _mm512_dpbf16_ps(lo, w[j][2], x2);
            hi = _mm512_dpbf16_ps(hi, w[j][3], x3);
            acc[j][i] = _mm512_fmadd_ps(hi, scale_hi[j], _mm512_fmadd_ps(lo, scale[j], acc[j][i]));
          }
        }
      }
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int i = 0; i < N; ++i) {
      float sum = _mm512_reduce_add_ps(acc[j][i]);
      for (int kk = k; kk < cols; ++kk) {
        const float w = decode1<FMT>(base[j], kk) * scale_at<FMT>(m, e, rows[j], kk);
        sum += w * bf16_to_float(xs[i][act_index<FMT>(kk, cols)]);
      }
      out[j][i] = sum;
    }
  }
}

// Dot products of R rows with n (any count) bf16 vectors, eight at a time: out[j][i].
template <int FMT, int R>
inline void rows_dots_bf16(const Matrix& m, int e, const int* rows, const uint16_t* const* xs, int n,
                           float (*out)[64]) {
  float part[R][8];
  for (int i = 0; i < n; i += 8) {
    switch (std::min(8, n - i)) {
      case 8: rows_dot_bf16<FMT, R, 8>(m, e, rows, xs + i, part); break;
      case 7: rows_dot_bf16<FMT, R, 7>(m, e, rows, xs + i, part); break;
      case 6: rows_dot_bf16<FMT, R, 6>(m, e, rows, xs + i, part); break;
      case 5: rows_dot_bf16<FMT, R, 5>(m, e, rows, xs + i, part); break;
      case 4: rows_dot_bf16<FMT, R, 4>(m, e, rows, xs + i, part); break;
      case 3: rows_dot_bf16<FMT, R, 3>(m, e, rows, xs + i, part); break;
      case 2: rows_dot_bf16<FMT, R, 2>(m, e, rows, xs + i, part); break;
      default: rows_dot_bf16<FMT, R, 1>(m, e, rows, xs + i, part); break;
    }
    for (int j = 0; j < R; ++j)
      for (int q = 0; q < 8 && i + q < n; ++q) out[j][i + q] = part[j][q];
  }
}
#else
constexpr bool kHaveBf16Dot = false;
#endif

// A row of a quantized buffer: a 64-byte header holding its scale (a float), then the bytes. Outside the VNNI block:
// the engine lays out its buffers with it on every CPU (without it the kernel did not build on AVX2-only hosts).
constexpr int kInt8RowHeader = 64;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr bool kHaveInt8Dot = true;

// The int8 path (INT8 experts, KTConfig.cpu_int8_activations): each token's activations are quantized once
// per step to int8 with one scale per token (max |x| / 127, round to nearest even), stored as unsigned bytes
// q + 128, so that vpdpbusd (unsigned x signed bytes, 64 multiply-adds per instruction, exact int32 sums)
// takes them against the stored int8 weights as they are: no decoding at all.
// sum((q + 128) * w) - 128 * sum(w) = sum(q * w); the 128 * sum(w) term is one more vpdpbusd per 64 weights,
// shared by every token of the call. The fp32 path decodes each 16 weights with two conversions before its
// FMAs. down_proj's inputs (silu(gate) * up, one row per pair) are complete only once phase A is, so a middle
// phase quantizes them, one scale per pair.
inline float int8_row_scale(const uint8_t* x) { return *reinterpret_cast<const float*>(x - kInt8RowHeader); }

// Quantize n floats to q + 128 bytes with one scale, stored in the row's header.
inline void quantize_row_int8(const float* x, int n, uint8_t* row) {
  float amax = 0.0f;
  for (int k = 0; k < n; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
  *reinterpret_cast<float*>(row - kInt8RowHeader) = scale;
  for (int k = 0; k < n; ++k) row[k] = uint8_t(int(std::nearbyint(x[k] / scale)) + 128);
}

template <int R, int N>
inline void rows_dot_int8(const Matrix& m, int e, const int* rows, const uint8_t* const* xs, float (*out)[8]) {
  const uint8_t* base[R];
  for (int j = 0; j < R; ++j) base[j] = m.weight + e * m.expert_bytes + rows[j] * m.row_bytes;
  const int cols = m.cols;
  const __m512i offset = _mm512_set1_epi8(char(0x80));
  __m512i acc[R][N], corr[R];
  for (int j = 0; j < R; ++j) {
    corr[j] = _mm512_setzero_si512();
    for (int i = 0; i < N; ++i) acc[j][i] = _mm512_setzero_si512();
  }
  // The last chunk of a row shorter than 64 is a masked load: its missing weights read as 0, so they add
  // nothing to either sum. (No scalar tail loop: GCC 12 at -O3 -march=native miscompiled the sum of
  // (u8 - 128) * s8 products.)
  for (int k = 0; k < cols; k += 64) {
    const __mmask64 mask = cols - k >= 64 ? ~__mmask64(0) : (__mmask64(1) << (cols - k)) - 1;
    __m512i w[R];
    for (int j = 0; j < R; ++j) {
      __builtin_prefetch(base[j] + k + kPrefetchBytes, 0, 3);
      w[j] = _mm512_maskz_loadu_epi8(mask, base[j] + k);
      corr[j] = _mm512_dpbusd_epi32(corr[j], offset, w[j]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      const __m512i xv = _mm512_maskz_loadu_epi8(mask, xs[i] + k);
      for (int j = 0; j < R; ++j) acc[j][i] = _mm512_dpbusd_epi32(acc[j][i], xv, w[j]);
    }
  }
  for (int j = 0; j < R; ++j) {
    const float row_scale = scale_at<INT8>(m, e, rows[j], 0);
    const int32_t c = _mm512_reduce_add_epi32(corr[j]);
    for (int i = 0; i < N; ++i) {
      const int32_t dot = _mm512_reduce_add_epi32(acc[j][i]) - c;
      out[j][i] = float(dot) * int8_row_scale(xs[i]) * row_scale;
    }
  }
}

template <int FMT, int R>
inline void rows_dots_int8(const Matrix& m, int e, const int* rows, const uint8_t* const* xs, int n,
                           float (*out)[64]) {
  float part[R][8];
  for (int i = 0; i < n; i += 8) {
    switch (std::min(8, n - i)) {
      case 8: rows_dot_int8<R, 8>(m, e, rows, xs + i, part); break;
      case 7: rows_dot_int8<R, 7>(m, e, rows, xs + i, part); break;
      case 6: rows_dot_int8<R, 6>(m, e, rows, xs + i, part); break;
      case 5: rows_dot_int8<R, 5>(m, e, rows, xs + i, part); break;
      case 4: rows_dot_int8<R, 4>(m, e, rows, xs + i, part); break;
      case 3: rows_dot_int8<R, 3>(m, e, rows, xs + i, part); break;
      case 2: rows_dot_int8<R, 2>(m, e, rows, xs + i, part); break;
      default: rows_dot_int8<R, 1>(m, e, rows, xs + i, part); break;
    }
    for (int j = 0; j < R; ++j)
      for (int q = 0; q < 8 && i + q < n; ++q) out[j][i + q] = part[j][q];
  }
}
#else
constexpr bool kHaveInt8Dot = false;
#endif

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

struct Layer;

constexpr int kHeader = 16;  // int32 words before the first token row (the first row starts 64-byte aligned)

// The per-model state: the pool, the caller's I/O buffers, the routing of the running step.
struct Engine {
  int hidden, inter, top_k, num_experts, expert_offset, capacity;
  // The step's inputs, one block so that a GPU fills it with one copy: kHeader int32 (the token count,
  // read when the step runs, first), then per token a row of hidden activations (fp32), top_k routing
  // weights (fp32) and top_k global expert ids (int32; ids < expert_offset belong to the GPU).
  float* in;
  int64_t in_row;  // hidden + 2 * top_k
  float* out;      // [capacity, hidden] the CPU experts' mixture (fp32)

  int count() const { return *reinterpret_cast<const int32_t*>(in); }
  const float* token_x(int t) const { return in + kHeader + t * in_row; }
  float token_weight(int t, int j) const { return in[kHeader + t * in_row + hidden + j]; }
  int32_t token_id(int t, int j) const {
    return reinterpret_cast<const int32_t*>(in)[kHeader + t * in_row + hidden + top_k + j];
  }
  int spin_us;

  // Routing of the running step (written by submit, read by the tasks).
  int tokens = 0;
  std::vector<int32_t> expert_start;  // [num_experts + 1] first pair of each expert
  std::vector<int32_t> active;        // experts with at least one pair
  int num_active = 0;
  std::vector<int32_t> pair_token;    // [capacity * top_k]
  std::vector<float> pair_weight;
  std::vector<float> act;             // [capacity * top_k, inter]
  std::vector<uint16_t> x_bf16;       // [capacity, hidden]: the bf16 path's activations
  std::vector<uint16_t> act_bf16;     // [capacity * top_k, inter]
  std::vector<uint8_t> x_int8;        // [capacity, kInt8RowHeader + hidden rounded up to 64]: the int8 path's
  int64_t x_int8_row = 0;             //   quantized tokens (scale header, then q + 128 bytes); bytes per row
  std::vector<uint8_t> act_int8;      // [capacity * top_k, kInt8RowHeader + inter rounded up]: quantized act
  int64_t act_int8_row = 0;
  std::vector<int32_t> fill;

  // Task bookkeeping of the running step.
  Layer* layer = nullptr;
  int rows_a = 1, rows_b = 1, tasks_a = 0, tasks_b = 0, tasks_q = 0;  // fixed per engine
  int step_tasks_q = 0, step_tasks_total = 0;  // this step's: quantize tasks only on the int8 path
  std::atomic<int> next_task{0};
  std::atomic<int> done_a{0};
  std::atomic<int> done_q{0};
  std::atomic<int> done_total{0};
  std::atomic<uint64_t> generation{0};  // steps started (workers wake on a change)
  std::atomic<uint64_t> completed{0};   // steps finished (the waiter wakes on a change)
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  int64_t submit_ns = 0;
  std::atomic<int64_t> finish_ns{0};

  // The doorbell (nullptr: host functions): the stream writes *ring = index + 1 of the layer whose inputs
  // are in place; a pool thread swaps it back to 0 and submits that layer; the step's last task writes
  // *done = index + 1 (step_ring), which the stream waits for and clears. Separate cache lines.
  int32_t* ring = nullptr;
  int32_t* done_word = nullptr;
  int32_t step_ring = 0;        // the running step's ring value (0: submitted by a host function / ktc_run)
  std::vector<Layer*> layers;   // registration order: ring value i + 1 names layers[i]

  // Totals for the benchmark's profile.
  std::atomic<int64_t> steps{0}, pairs{0}, experts_read{0}, bytes_read{0};
  std::atomic<int64_t> compute_ns{0}, wait_blocked_ns{0};
};

struct Layer {
  Engine* engine;
  int index;  // in engine->layers
  int format;
  bool bf16_dot;  // activations in bf16, vdpbf16ps (see rows_dot_bf16)
  bool int8_dot;  // gate/up with int8 activations, vpdpbusd (see rows_dot_int8)
  Matrix w13, w2;  // w13: [2 * inter, hidden] (gate rows then up rows), w2: [hidden, inter]
  int64_t expert_bytes;  // weight + scale bytes of one expert (what a step reads per routed expert)
};

// Pairs of one expert are taken in blocks of up to 64 (the dots of a row with a block share one read).
constexpr int kPairBlock = 64;

// The ways a layer's dots read activations: fp32 (weights decoded to fp32, FMAs), bf16 (vdpbf16ps;
// activations converted once per step in submit, act stored as bf16 in the layout act_index gives) or int8
// (Int8Activations, below).
// Phase A (gate/up) reads XT rows of the tokens (token) and stores act values (act_out, act_at, store);
// phase B (down) reads ActT rows of act (act_row). dots_a / dots_b are the two phases' dots.
struct Fp32Activations {
  using XT = float;
  using StoreT = float;
  using ActT = float;
  static const float* token(const Engine& eng, int t) { return eng.token_x(t); }
  static float* act_out(Engine& eng) { return eng.act.data(); }
  static const float* act_row(const Engine& eng, int p) { return eng.act.data() + int64_t(p) * eng.inter; }
  template <int FMT>
  static int64_t act_at(int r, int) { return r; }
  static float store(float v) { return v; }
  template <int FMT, int R>
  static void dots_a(const Matrix& m, int e, const int* rows, const float* const* xs, int n, float (*out)[64]) {
    rows_dots<FMT, R>(m, e, rows, xs, n, out);
  }
  template <int FMT, int R>
  static void dots_b(const Matrix& m, int e, const int* rows, const float* const* xs, int n, float (*out)[64]) {
    rows_dots<FMT, R>(m, e, rows, xs, n, out);
  }
};

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// INT8 experts: tokens quantized in submit; act stored in fp32 by phase A, quantized per pair by the
// quantize phase between A and B (quantize_task), read as int8 by phase B.
struct Int8Activations : Fp32Activations {
  using XT = uint8_t;
  using ActT = uint8_t;
  static const uint8_t* token(const Engine& eng, int t) {
    return eng.x_int8.data() + int64_t(t) * eng.x_int8_row + kInt8RowHeader;
  }
  static const uint8_t* act_row(const Engine& eng, int p) {
    return eng.act_int8.data() + int64_t(p) * eng.act_int8_row + kInt8RowHeader;
  }
  template <int FMT, int R>
  static void dots_a(const Matrix& m, int e, const int* rows, const uint8_t* const* xs, int n, float (*out)[64]) {
    rows_dots_int8<FMT, R>(m, e, rows, xs, n, out);
  }
  template <int FMT, int R>
  static void dots_b(const Matrix& m, int e, const int* rows, const uint8_t* const* xs, int n, float (*out)[64]) {
    rows_dots_int8<FMT, R>(m, e, rows, xs, n, out);
  }
};
#endif

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
struct Bf16Activations {
  using XT = uint16_t;
  using StoreT = uint16_t;
  using ActT = uint16_t;
  static const uint16_t* token(const Engine& eng, int t) { return eng.x_bf16.data() + int64_t(t) * eng.hidden; }
  static uint16_t* act_out(Engine& eng) { return eng.act_bf16.data(); }
  static const uint16_t* act_row(const Engine& eng, int p) { return eng.act_bf16.data() + int64_t(p) * eng.inter; }
  template <int FMT>
  static int64_t act_at(int r, int inter) { return act_index<FMT>(r, inter); }
  static uint16_t store(float v) { return float_to_bf16(v); }
  template <int FMT, int R>
  static void dots_a(const Matrix& m, int e, const int* rows, const uint16_t* const* xs, int n, float (*out)[64]) {
    rows_dots_bf16<FMT, R>(m, e, rows, xs, n, out);
  }
  template <int FMT, int R>
  static void dots_b(const Matrix& m, int e, const int* rows, const uint16_t* const* xs, int n, float (*out)[64]) {
    rows_dots_bf16<FMT, R>(m, e, rows, xs, n, out);
  }
};
#endif

template <int FMT, typename A>
void run_task_as(Engine& eng, Layer& L, int task) {
  const int H = eng.hidden, I = eng.inter;
  float dots[2][kPairBlock];
  if (task < eng.tasks_a) {
    typename A::StoreT* act = A::act_out(eng);
    const typename A::XT* vecs[kPairBlock];
    // Gate row r and up row I + r side by side: act = silu(gate . x) * (up . x).
    const int r0 = task * eng.rows_a, r1 = std::min(I, r0 + eng.rows_a);
    for (int a = 0; a < eng.num_active; ++a) {
      const int e = eng.active[a];
      for (int p0 = eng.expert_start[e]; p0 < eng.expert_start[e + 1]; p0 += kPairBlock) {
        const int n = std::min(kPairBlock, eng.expert_start[e + 1] - p0);
        for (int i = 0; i < n; ++i) vecs[i] = A::token(eng, eng.pair_token[p0 + i]);
        for (int r = r0; r < r1; ++r) {
          const int rows[2] = {r, I + r};
          A::template dots_a<FMT, 2>(L.w13, e, rows, vecs, n, dots);
          const int64_t at = A::template act_at<FMT>(r, I);
          for (int i = 0; i < n; ++i) act[int64_t(p0 + i) * I + at] = A::store(silu(dots[0][i]) * dots[1][i]);
        }
      }
    }
    return;
  }
  // Down rows h, h + 1 side by side: out[token, h] += weight * (down . act).
  const typename A::ActT* vecs[kPairBlock];
  const int h0 = (task - eng.tasks_a - eng.step_tasks_q) * eng.rows_b, h1 = std::min(H, h0 + eng.rows_b);
  for (int t = 0; t < eng.tokens; ++t) std::memset(eng.out + int64_t(t) * H + h0, 0, sizeof(float) * (h1 - h0));
  for (int a = 0; a < eng.num_active; ++a) {
    const int e = eng.active[a];
    for (int p0 = eng.expert_start[e]; p0 < eng.expert_start[e + 1]; p0 += kPairBlock) {
      const int n = std::min(kPairBlock, eng.expert_start[e + 1] - p0);
      for (int i = 0; i < n; ++i) vecs[i] = A::act_row(eng, p0 + i);
      for (int h = h0; h < h1; h += 2) {
        const int rows[2] = {h, h + 1};
        const int pair_rows = std::min(2, h1 - h);
        if (pair_rows == 2) {
          A::template dots_b<FMT, 2>(L.w2, e, rows, vecs, n, dots);
        } else {
          A::template dots_b<FMT, 1>(L.w2, e, rows, vecs, n, dots);
        }
        for (int j = 0; j < pair_rows; ++j)
          for (int i = 0; i < n; ++i)
            eng.out[int64_t(eng.pair_token[p0 + i]) * H + h + j] += eng.pair_weight[p0 + i] * dots[j][i];
      }
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// The int8 path's middle phase: quantize act (complete once phase A is) per pair, one scale each.
void quantize_task(Engine& eng, int q) {
  const int pairs = eng.expert_start[eng.num_experts];
  const int p0 = int64_t(pairs) * q / eng.step_tasks_q, p1 = int64_t(pairs) * (q + 1) / eng.step_tasks_q;
  for (int p = p0; p < p1; ++p)
    quantize_row_int8(eng.act.data() + int64_t(p) * eng.inter, eng.inter,
                      eng.act_int8.data() + int64_t(p) * eng.act_int8_row + kInt8RowHeader);
}
#endif

void run_task(Engine& eng, int task) {
  Layer& L = *eng.layer;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  if (L.bf16_dot) {
    if (L.format == INT4) {
      run_task_as<INT4, Bf16Activations>(eng, L, task);
    } else {
      run_task_as<BF16, Bf16Activations>(eng, L, task);
    }
    return;
  }
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (L.int8_dot) {
    if (task >= eng.tasks_a && task < eng.tasks_a + eng.step_tasks_q) {
      quantize_task(eng, task - eng.tasks_a);
    } else {
      run_task_as<INT8, Int8Activations>(eng, L, task);
    }
    return;
  }
#endif
  switch (L.format) {
    case F32: run_task_as<F32, Fp32Activations>(eng, L, task); break;
    case BF16: run_task_as<BF16, Fp32Activations>(eng, L, task); break;
    case INT8: run_task_as<INT8, Fp32Activations>(eng, L, task); break;
    case INT4: run_task_as<INT4, Fp32Activations>(eng, L, task); break;
    case FP8: run_task_as<FP8, Fp32Activations>(eng, L, task); break;
    case MXFP4: run_task_as<MXFP4, Fp32Activations>(eng, L, task); break;
  }
}

// Take tasks until none are left. Phase-B tasks start once every phase-A task has finished.
void work(Engine& eng) {
  for (;;) {
    const int task = eng.next_task.fetch_add(1, std::memory_order_acq_rel);
    if (task >= eng.step_tasks_total) return;
    const int phase_b = eng.tasks_a + eng.step_tasks_q;  // first phase-B task
    if (task >= eng.tasks_a)
      while (eng.done_a.load(std::memory_order_acquire) < eng.tasks_a) cpu_relax();
    if (task >= phase_b)
      while (eng.done_q.load(std::memory_order_acquire) < eng.step_tasks_q) cpu_relax();
    run_task(eng, task);
    if (task < eng.tasks_a) {
      eng.done_a.fetch_add(1, std::memory_order_acq_rel);
    } else if (task < phase_b) {
      eng.done_q.fetch_add(1, std::memory_order_acq_rel);
    }
    if (eng.done_total.fetch_add(1, std::memory_order_acq_rel) + 1 == eng.step_tasks_total) {
      const int64_t finish = now_ns();
      eng.finish_ns.store(finish, std::memory_order_relaxed);
      eng.compute_ns.fetch_add(finish - eng.submit_ns, std::memory_order_relaxed);
      // The stream waits for this word (first: it is the GPU's critical path); every task's outputs were
      // written before it (the acq_rel count above). A new step may start right after it.
      if (eng.step_ring != 0) __atomic_store_n(eng.done_word, eng.step_ring, __ATOMIC_RELEASE);
      eng.completed.fetch_add(1, std::memory_order_release);  // publishes the outputs and finish_ns
      eng.completed.notify_all();
    }
  }
}

// Spin-wait helper: pause, and every 64 polls let the OS run someone else (the pool may share cores with
// the scheduler's thread and the CUDA driver's callback thread; a spinner must never starve them).
inline void poll_pause(int& polls) {
  cpu_relax();
  if (++polls % 64 == 0) sched_yield();
}

void submit(Layer* layer, int32_t ring);

// The doorbell: if the stream rang, take the ring (one thread wins the swap) and submit that layer.
bool answer_doorbell(Engine& eng) {
  int32_t ring = __atomic_load_n(eng.ring, __ATOMIC_ACQUIRE);
  if (ring == 0 || !__atomic_compare_exchange_n(eng.ring, &ring, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return false;
  if (ring < 1 || ring > int32_t(eng.layers.size())) {  // only our own enqueue writes it: a broken invariant
    std::fprintf(stderr, "KT CPU experts: doorbell rang for layer %d of %zu\n", ring - 1, eng.layers.size());
    std::abort();  // the stream would wait forever on a step nobody runs: fail loudly instead
  }
  submit(eng.layers[ring - 1], ring);
  return true;
}

void worker_loop(Engine* eng, bool watcher) {
  if (watcher) prctl(PR_SET_TIMERSLACK, 1000UL);  // its naps end within microseconds, not the default 50
  uint64_t seen = 0;
  for (;;) {
    // Spin for spin_us after each step (the next layer's work comes within microseconds), then sleep. With
    // the doorbell one thread (the watcher) never sleeps on the futex -- a stream write wakes nobody -- but
    // naps, 20 us at first and up to 1 ms when idle for long, between looks at the ring.
    const int64_t deadline = now_ns() + int64_t(eng->spin_us) * 1000;
    uint64_t gen;
    int polls = 0;
    int64_t nap_ns = 20000;
    while ((gen = eng->generation.load(std::memory_order_acquire)) == seen) {
      if (eng->stop.load(std::memory_order_relaxed)) return;
      if (eng->ring != nullptr && answer_doorbell(*eng)) continue;
      poll_pause(polls);
      if (polls % 256 == 0 && now_ns() > deadline) {
        if (eng->ring == nullptr || !watcher) {
          eng->generation.wait(seen, std::memory_order_acquire);
        } else {
          std::this_thread::sleep_for(std::chrono::nanoseconds(nap_ns));
          nap_ns = std::min<int64_t>(1000000, nap_ns * 2);
        }
      }
    }
    seen = gen;
    if (eng->stop.load(std::memory_order_relaxed)) return;
    work(*eng);
  }
}

// Route the step's (token, CPU expert) pairs, then wake the pool. Runs on the submitting thread (a host
// function's, ktc_run's, or the pool thread that answered the doorbell: ring is then its value, else 0).
void submit(Layer* layer, int32_t ring) {
  Engine& eng = *layer->engine;
  eng.step_ring = ring;
  eng.submit_ns = now_ns();
  const int T = std::clamp(eng.count(), 0, eng.capacity);
  const int K = eng.top_k, E = eng.num_experts;
  std::fill(eng.expert_start.begin(), eng.expert_start.end(), 0);
  for (int i = 0; i < T * K; ++i) {
    const int e = eng.token_id(i / K, i % K) - eng.expert_offset;
    if (e >= 0 && e < E) ++eng.expert_start[e + 1];
  }
  eng.num_active = 0;
  for (int e = 0; e < E; ++e) {
    if (eng.expert_start[e + 1] > 0) eng.active[eng.num_active++] = e;
    eng.expert_start[e + 1] += eng.expert_start[e];
  }
  std::copy(eng.expert_start.begin(), eng.expert_start.end() - 1, eng.fill.begin());
  for (int i = 0; i < T * K; ++i) {
    const int e = eng.token_id(i / K, i % K) - eng.expert_offset;
    if (e < 0 || e >= E) continue;
    const int p = eng.fill[e]++;
    eng.pair_token[p] = i / K;
    eng.pair_weight[p] = eng.token_weight(i / K, i % K);
  }
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  if (layer->bf16_dot) {  // exact: a bf16 model's activations arrive as bf16 values
    const int H = eng.hidden;
    for (int t = 0; t < T; ++t) {
      uint16_t* row = eng.x_bf16.data() + int64_t(t) * H;
      for (int h = 0; h < H; ++h)
        row[layer->format == INT4 ? act_index<INT4>(h, H) : h] = float_to_bf16(eng.token_x(t)[h]);
    }
  }
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (layer->int8_dot) {
    for (int t = 0; t < T; ++t)
      quantize_row_int8(eng.token_x(t), eng.hidden, eng.x_int8.data() + int64_t(t) * eng.x_int8_row + kInt8RowHeader);
  }
#endif
  eng.tokens = T;
  eng.layer = layer;
  eng.steps.fetch_add(1, std::memory_order_relaxed);
  eng.pairs.fetch_add(eng.expert_start[E], std::memory_order_relaxed);
  eng.experts_read.fetch_add(eng.num_active, std::memory_order_relaxed);
  eng.bytes_read.fetch_add(int64_t(eng.num_active) * layer->expert_bytes, std::memory_order_relaxed);
  eng.step_tasks_q = layer->int8_dot ? eng.tasks_q : 0;
  eng.step_tasks_total = eng.tasks_a + eng.step_tasks_q + eng.tasks_b;
  eng.done_a.store(0, std::memory_order_relaxed);
  eng.done_q.store(0, std::memory_order_relaxed);
  eng.done_total.store(0, std::memory_order_relaxed);
  eng.next_task.store(0, std::memory_order_release);  // publishes everything above to task takers
  eng.generation.fetch_add(1, std::memory_order_release);
  eng.generation.notify_all();
}

// Block until the step submitted last has finished: spin (yielding) for up to spin_us, then sleep. The pool
// does the work; this thread (the CUDA driver's callback thread, or the caller of ktc_run) only waits, so
// --kt-cpuinfer threads compute and nobody else competes with them.
void wait_done(Layer* layer) {
  Engine& eng = *layer->engine;
  const int64_t start = now_ns();
  const uint64_t target = eng.generation.load(std::memory_order_relaxed);  // steps submitted (stop aside)
  const int64_t deadline = start + int64_t(eng.spin_us) * 1000;  // a sleeping waiter wakes tens of us late
  int polls = 0;
  uint64_t done;
  while ((done = eng.completed.load(std::memory_order_acquire)) < target) {
    poll_pause(polls);
    if (polls % 256 == 0 && now_ns() > deadline) eng.completed.wait(done, std::memory_order_acquire);
  }
  const int64_t finish = eng.finish_ns.load(std::memory_order_relaxed);
  eng.wait_blocked_ns.fetch_add(std::max<int64_t>(0, finish - start), std::memory_order_relaxed);
}

void host_submit(void* layer) { submit(static_cast<Layer*>(layer), 0); }
void host_wait(void* layer) { wait_done(static_cast<Layer*>(layer)); }

// Driver entry points, looked up on first use (the library itself needs no CUDA to build).
void* cuda_symbol(const char* name) {
  static void* lib = [] {
    void* l = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return l != nullptr ? l : dlopen("libcuda.so.1", RTLD_NOW);
  }();
  return lib == nullptr ? nullptr : dlsym(lib, name);
}

typedef int (*LaunchHostFunc)(void* stream, void (*fn)(void*), void* data);
typedef int (*StreamValue32)(void* stream, uint64_t addr, uint32_t value, unsigned flags);
constexpr unsigned kWaitValueEq = 1;  // CU_STREAM_WAIT_VALUE_EQ; writes use the default (fenced) flags

LaunchHostFunc launch_host_func() {
  static LaunchHostFunc fn = reinterpret_cast<LaunchHostFunc>(cuda_symbol("cuLaunchHostFunc"));
  return fn;
}
StreamValue32 stream_write_value() {
  static StreamValue32 fn = reinterpret_cast<StreamValue32>(cuda_symbol("cuStreamWriteValue32_v2"));
  return fn;
}
StreamValue32 stream_wait_value() {
  static StreamValue32 fn = reinterpret_cast<StreamValue32>(cuda_symbol("cuStreamWaitValue32_v2"));
  return fn;
}
// The doorbell's words are pinned host memory, which UVA maps for the GPU at the same address.
uint64_t device_address(const int32_t* word) { return reinterpret_cast<uint64_t>(word); }

Matrix make_matrix(int format, const void* weight, const void* scale, int experts, int rows, int cols, int group_n,
                   int group_k) {
  Matrix m{};
  m.weight = static_cast<const uint8_t*>(weight);
  m.scale = scale;
  m.rows = rows;
  m.cols = cols;
  m.group_n = std::max(1, group_n);
  m.group_k = std::max(1, group_k);
  switch (format) {
    case F32: m.row_bytes = int64_t(cols) * 4; break;
    case BF16: m.row_bytes = int64_t(cols) * 2; break;
    case INT8: case FP8: m.row_bytes = cols; break;
    default: m.row_bytes = cols / 2; break;
  }
  m.expert_bytes = m.row_bytes * rows;
  if (format == INT8) {
    m.scale_rows = rows;
    m.scale_cols = 1;
  } else if (format == INT4 || format == MXFP4) {
    m.scale_rows = rows;
    m.scale_cols = (cols + m.group_k - 1) / m.group_k;
  } else if (format == FP8) {
    m.scale_rows = (rows + m.group_n - 1) / m.group_n;
    m.scale_cols = (cols + m.group_k - 1) / m.group_k;
  }
  (void)experts;
  return m;
}

int64_t scale_bytes(int format, const Matrix& m) {
  const int64_t n = int64_t(m.scale_rows) * m.scale_cols;
  return format == MXFP4 ? n : (format == F32 || format == BF16) ? 0 : n * 4;
}

}  // namespace

extern "C" {

// doorbell: nullptr (stream steps use host functions), or 32 zeroed int32 of pinned host memory: the ring
// (word 0) and done (word 16) words of the doorbell.
void* ktc_engine_create(int threads, int hidden, int inter, int top_k, int num_experts, int expert_offset,
                        int capacity, float* in, float* out, int spin_us, int32_t* doorbell) {
  Engine* eng = new Engine();
  eng->ring = doorbell;
  eng->done_word = doorbell == nullptr ? nullptr : doorbell + 16;
  eng->hidden = hidden;
  eng->inter = inter;
  eng->top_k = top_k;
  eng->num_experts = num_experts;
  eng->expert_offset = expert_offset;
  eng->capacity = capacity;
  eng->in = in;
  eng->in_row = hidden + 2 * top_k;
  eng->out = out;
  eng->spin_us = spin_us;
  eng->expert_start.assign(num_experts + 1, 0);
  eng->active.assign(num_experts, 0);
  eng->fill.assign(num_experts, 0);
  eng->pair_token.assign(int64_t(capacity) * top_k, 0);
  eng->pair_weight.assign(int64_t(capacity) * top_k, 0.0f);
  eng->act.assign(int64_t(capacity) * top_k * inter, 0.0f);
  if (kHaveBf16Dot) {
    eng->x_bf16.assign(int64_t(capacity) * hidden, 0);
    eng->act_bf16.assign(int64_t(capacity) * top_k * inter, 0);
  }
  if (kHaveInt8Dot) {
    eng->x_int8_row = kInt8RowHeader + (int64_t(hidden) + 63) / 64 * 64;
    eng->x_int8.assign(int64_t(capacity) * eng->x_int8_row, 128);
    eng->act_int8_row = kInt8RowHeader + (int64_t(inter) + 63) / 64 * 64;
    eng->act_int8.assign(int64_t(capacity) * top_k * eng->act_int8_row, 128);
  }
  // About eight tasks per thread and phase keeps the pool balanced (the last tasks of a phase are what
  // the others wait for); each task still reads whole rows, several KB each.
  const int t = std::max(1, threads);
  eng->rows_a = std::max(1, (inter + 8 * t - 1) / (8 * t));
  eng->rows_b = std::max(2, (hidden + 8 * t - 1) / (8 * t) + 1) / 2 * 2;  // even: rows go two at a time
  eng->tasks_a = (inter + eng->rows_a - 1) / eng->rows_a;
  eng->tasks_b = (hidden + eng->rows_b - 1) / eng->rows_b;
  eng->tasks_q = kHaveInt8Dot ? t : 0;  // the int8 path's act quantization: pairs split over the threads
  for (int i = 0; i < t; ++i) eng->workers.emplace_back(worker_loop, eng, i == 0);
  return eng;
}

// One stream memory operation on a pinned word (the Python side's self-test): write `value`, or wait for
// it. Returns the CUresult, or -1 without a CUDA driver.
int ktc_stream_write_value(void* stream, int32_t* word, int value) {
  StreamValue32 fn = stream_write_value();
  return fn == nullptr ? -1 : fn(stream, device_address(word), uint32_t(value), 0);
}
int ktc_stream_wait_value(void* stream, int32_t* word, int value) {
  StreamValue32 fn = stream_wait_value();
  return fn == nullptr ? -1 : fn(stream, device_address(word), uint32_t(value), kWaitValueEq);
}

void ktc_engine_destroy(void* handle) {
  Engine* eng = static_cast<Engine*>(handle);
  eng->stop.store(true);
  eng->generation.fetch_add(1, std::memory_order_release);
  eng->generation.notify_all();
  for (auto& w : eng->workers) w.join();
  delete eng;
}

// bf16_activations: the model computes in bf16; BF16 layers, and INT4 layers with groups of 32, 64 or a multiple of
// 128, then take the bf16 path where the CPU has vdpbf16ps (ktc_layer_uses_bf16_dot tells).
void* ktc_layer_create(void* engine, int format, const void* w13, const void* w13_scale, const void* w2,
                       const void* w2_scale, int group_n, int group_k, int bf16_activations, int int8_activations) {
  Engine* eng = static_cast<Engine*>(engine);
  Layer* layer = new Layer();
  layer->engine = eng;
  layer->index = int(eng->layers.size());
  eng->layers.push_back(layer);
  layer->format = format;
  // BF16 weights go to vdpbf16ps as stored, with no decoding at all. INT8 does not take the bf16 path:
  // widening int8 to bf16 pairs costs as many shuffles as the FMAs it saves (it measured slower on the H200
  // host); it has its own int8 path below.
  layer->bf16_dot = kHaveBf16Dot && bf16_activations &&
                    (format == BF16 || (format == INT4 && (group_k % 128 == 0 || group_k == 32 || group_k == 64)));
  // INT8 experts may take int8 activations (rows_dot_int8; asked for by the caller: it changes the numerics).
  layer->int8_dot = kHaveInt8Dot && int8_activations && format == INT8;
  layer->w13 = make_matrix(format, w13, w13_scale, eng->num_experts, 2 * eng->inter, eng->hidden, group_n, group_k);
  layer->w2 = make_matrix(format, w2, w2_scale, eng->num_experts, eng->hidden, eng->inter, group_n, group_k);
  layer->expert_bytes = layer->w13.expert_bytes + layer->w2.expert_bytes + scale_bytes(format, layer->w13) +
                        scale_bytes(format, layer->w2);
  // Per-expert strides of the scale tensors are scale_rows * scale_cols (INT8: rows).
  return layer;
}

void ktc_layer_destroy(void* layer) { delete static_cast<Layer*>(layer); }

int ktc_layer_uses_bf16_dot(void* layer) { return static_cast<Layer*>(layer)->bf16_dot ? 1 : 0; }

int ktc_layer_uses_int8_dot(void* layer) { return static_cast<Layer*>(layer)->int8_dot ? 1 : 0; }

void ktc_run(void* layer) {
  submit(static_cast<Layer*>(layer), 0);
  wait_done(static_cast<Layer*>(layer));
}

// Enqueue the step's start / its end on a CUDA stream. Returns the CUresult, or -1 without a CUDA driver.
int ktc_enqueue_submit(void* handle, void* stream) {
  Layer* layer = static_cast<Layer*>(handle);
  if (layer->engine->ring != nullptr) return ktc_stream_write_value(stream, layer->engine->ring, layer->index + 1);
  LaunchHostFunc fn = launch_host_func();
  return fn == nullptr ? -1 : fn(stream, host_submit, layer);
}

int ktc_enqueue_wait(void* handle, void* stream) {
  Layer* layer = static_cast<Layer*>(handle);
  Engine* eng = layer->engine;
  if (eng->ring != nullptr) {  // wait for done = index + 1, then clear it (the next step may be this layer's)
    const int waited = ktc_stream_wait_value(stream, eng->done_word, layer->index + 1);
    return waited != 0 ? waited : ktc_stream_write_value(stream, eng->done_word, 0);
  }
  LaunchHostFunc fn = launch_host_func();
  return fn == nullptr ? -1 : fn(stream, host_wait, layer);
}

// steps, (token, expert) pairs, experts read, weight bytes read, compute ns (submit to last task),
// ns the waiting thread was blocked after the GPU reached it.
void ktc_engine_stats(void* engine, int64_t* out) {
  Engine* eng = static_cast<Engine*>(engine);
  out[0] = eng->steps.load();
  out[1] = eng->pairs.load();
  out[2] = eng->experts_read.load();
  out[3] = eng->bytes_read.load();
  out[4] = eng->compute_ns.load();
  out[5] = eng->wait_blocked_ns.load();
}

// STREAM-style read of `bytes` from `data` by `threads` threads: each thread sums its contiguous share with
// vector loads, as `streams` interleaved runs (1: front to back; more: its share cut into that many runs read
// side by side with software prefetch 1 KB ahead, as the kernel reads its rows). Returns seconds for `reps`
// passes. Memory-level parallelism per core differs between CPUs: the benchmark takes the best of several.
double ktc_read_seconds(const void* data, int64_t bytes, int threads, int reps, int streams) {
  const int64_t n = bytes / 64;
  const int runs = std::clamp(streams, 1, 8);
  std::vector<uint32_t> sink(threads, 0);
  const int64_t start = now_ns();
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const int64_t b = n * t / threads, e = n * (t + 1) / threads, len = (e - b) / runs;
        const uint8_t* p = static_cast<const uint8_t*>(data);
        v16u acc[8] = {};  // integer adds: no float assists whatever the bytes are
        if (runs == 1) {
          int64_t i = b;
          for (; i + 2 <= e; i += 2) {
            acc[0] += load<v16u>(p + i * 64);
            acc[1] += load<v16u>(p + (i + 1) * 64);
          }
          if (i < e) acc[0] += load<v16u>(p + i * 64);
        } else {
          for (int64_t i = 0; i < len; ++i) {
            for (int r = 0; r < runs; ++r) {
              const uint8_t* q = p + (b + r * len + i) * 64;
              __builtin_prefetch(q + kPrefetchBytes, 0, 3);
              acc[r] += load<v16u>(q);
            }
          }
          for (int64_t i = b + runs * len; i < e; ++i) acc[0] += load<v16u>(p + i * 64);
        }
        v16u sum = {};
        for (int r = 0; r < 8; ++r) sum += acc[r];
        uint32_t s = 0;
        for (int k = 0; k < 16; ++k) s += sum[k];
        sink[t] = s;
      });
    for (auto& th : pool) th.join();
  }
  const double seconds = (now_ns() - start) * 1e-9;
  volatile uint32_t keep = sink[0];
  (void)keep;
  return seconds;
}

}  // extern "C"
