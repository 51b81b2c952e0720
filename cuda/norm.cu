// One parametric RMSNorm kernel for every norm variant: plain or fused with a residual add
// (compile-time ADD), with weight or Gemma's (1 + weight) (run-time weight_offset), in
// fp32/fp16/bf16 with 16-byte or scalar accesses. All math is fp32.
#include <cuda_runtime.h>

#include "device.h"
#include "launch.cuh"
#include "launch_shape.h"
#include "norm.h"
#include "vec.cuh"

namespace opforge::cuda {
namespace {

// 1 / sqrt(mean of squares + eps) from a row's sum of squares. The mean as a product with the row
// length's reciprocal, worked out on the host: on the device the division (or even a correctly
// rounded reciprocal, with its slow-path check) was scheduled after the reduction, on the
// critical path. A multiply then an add, not one fma: an fma takes only one of its two parameters
// from the constant bank, and the compiler loaded the other (eps) into a register right there, a
// load the block waited on after its reduction (5% of a one-row norm's stall samples); the add
// reads eps from the constant bank itself.
__device__ __forceinline__ float rstd_of(float sum_of_squares, const NormParams& p) {
  return rsqrtf(__fadd_rn(__fmul_rn(sum_of_squares, p.inv_hidden), p.eps));
}

template <int VPT>
constexpr int kMaxThreads = VPT <= 2 ? 1024 : VPT <= 4 ? 512 : 256;  // = norm_max_threads(VPT)

// Register path: the blockDim.x threads of one threadIdx.y own one row and keep it in registers
// (VPT vectors of VEC elements per thread), so every element is read once and written once.
// All loads of a thread (row, residual, weight) are issued back to back before any use, each
// predicated on its vector lying inside the row (zeros otherwise) rather than branched around, so
// nothing serialises the memory round trips.
template <typename T, int VEC, int VPT, bool ADD>
__global__ void __launch_bounds__(kMaxThreads<VPT>) norm_rows_kernel(const NormParams p) {
  wait_for_previous_grid();
  __shared__ float scratch[32];
  const int group = blockDim.x;
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const int lane = threadIdx.x;
  const bool active = row < p.rows;  // rows past the end load nothing and write nothing

  // Column indices and the row length fit in 32 bits: a row held in registers has at most 1024
  // threads x 8 vectors. (64-bit compares cost twice the instructions, all of them ahead of the
  // first load.) Each thread's pointers start at its first vector and step by whole groups: one
  // 64-bit row offset per tensor, then one add per vector (an index per vector made the compiler
  // redo the 64-bit row multiply for each of them, ahead of the first load).
  const int hidden = static_cast<int>(p.hidden);
  const int first = lane * VEC, step = group * VEC;
  const T* in = static_cast<const T*>(p.input) + row * p.input_stride + first;
  const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride + first;
  const T* w = static_cast<const T*>(p.weight) + first;
  T* out = static_cast<T*>(p.out) + row * p.out_stride + first;  // here, while the loads are in flight

  // Vectors past the row's end are zeros, so they add nothing to the sum of squares and no branch
  // sits between the loads and the reduction. The row's vectors go first: the sum waits on them,
  // the weights only the epilogue.
  Vec<T, VEC> xr[VPT], rr[ADD ? VPT : 1], wr[VPT];
  bool ok[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    ok[i] = active && first + i * step < hidden;
    xr[i] = load_vec_or_zero<T, VEC>(in + i * step, ok[i]);
    if constexpr (ADD) rr[i] = load_vec_or_zero<T, VEC>(res + i * step, ok[i]);
  }
#pragma unroll
  for (int i = 0; i < VPT; ++i) wr[i] = load_vec_or_zero<T, VEC, true>(w + i * step, ok[i]);

  // s = x (+ r) in fp32. Recomputed from the raw registers when writing (same bits), which keeps
  // the fp32 copy out of the register budget, except at decode shapes with a residual (below).
  auto sum_at = [&](int i, float (&s)[VEC]) {
    to_floats(xr[i], s);
    if constexpr (ADD) {
      float rv[VEC];
      to_floats(rr[i], rv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) s[j] += rv[j];
    }
  };

  // Decode shapes (at most 2 vectors per thread) store the residual sum as soon as it is known,
  // before the reduction: its write's latency then overlaps the reduction instead of adding to
  // the kernel's tail (a thread writes only elements it has already read, so in-place calls stay
  // safe). With more vectors per thread the compiler would keep every fp32 sum live across the
  // reduction (83 -> 96 registers at 4: a block fewer per SM), so those store it at the end.
  constexpr bool kEarlyResidual = ADD && VPT <= 2;
  // Those also keep the fp32 sums for the output instead of recomputing them from x and r: as
  // many registers as the raw x and r they replace, and 24 fewer instructions per vector.
  float kept[kEarlyResidual ? VPT : 1][VEC];
  T* res_out = static_cast<T*>(p.residual_out) + row * p.residual_out_stride + first;
  // Squares summed in kChains independent chains, folded pairwise at the end: at decode sizes
  // this sum sits between the loads and the reduction, and one chain of VPT * VEC dependent
  // multiply-adds (16 at one row of 4096) was most of that time. Four chains, not one per element:
  // eight cost 15 more registers at 2 vectors per thread (a quarter fewer blocks per SM at mid
  // sizes, measured 5-30% slower there); four cost none. At 8 vectors per thread (only rows of
  // 16384 and more, at big batches, where other warps hide the chain) one chain keeps the
  // register count, and so the blocks per SM, as they were.
  constexpr int kChains = VPT >= 8 ? 1 : VEC < 4 ? VEC : 4;
  float sq[kChains];
#pragma unroll
  for (int j = 0; j < kChains; ++j) sq[j] = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    float s[VEC];
    sum_at(i, s);
    if constexpr (kEarlyResidual) {
      if (ok[i]) store_float<T, VEC>(res_out + i * step, s);
#pragma unroll
      for (int j = 0; j < VEC; ++j) kept[i][j] = s[j];
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) sq[j % kChains] += s[j] * s[j];
  }
#pragma unroll
  for (int width = kChains / 2; width > 0; width /= 2) {
#pragma unroll
    for (int j = 0; j < width; ++j) sq[j] += sq[j + width];
  }
  const float rstd = rstd_of(row_sum</*kFixedSecondStage=*/(VPT >= 4)>(sq[0], scratch), p);

  if (!active) return;
  // y = s * rstd * (w + offset) as s * fma(w, rstd, rstd * offset): two instructions per element
  // instead of three.
  const float rstd_offset = rstd * p.weight_offset;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (!ok[i]) continue;
    float s[VEC], wv[VEC], y[VEC];
    if constexpr (kEarlyResidual) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) s[j] = kept[i][j];
    } else {
      sum_at(i, s);
    }
    if constexpr (ADD && !kEarlyResidual) store_float<T, VEC>(res_out + i * step, s);
    to_floats(wr[i], wv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) y[j] = s[j] * fmaf(wv[j], rstd, rstd_offset);
    store_float<T, VEC>(out + i * step, y);
  }
}

// Streaming path for rows too long for registers: one block per row, a first pass for the sum
// of squares and a second pass that re-reads the row (from L2) to write it. With a residual, the
// first pass writes nothing, so in-place use stays safe: the second pass reads input and residual
// before the same thread overwrites them.
template <typename T, int VEC, bool ADD>
__global__ void __launch_bounds__(1024) norm_rows_streaming_kernel(const NormParams p) {
  wait_for_previous_grid();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* in = static_cast<const T*>(p.input) + row * p.input_stride;
  const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride;
  const int64_t step = int64_t(blockDim.x) * VEC;

  float ss = 0.f;
#pragma unroll 4
  for (int64_t c = int64_t(threadIdx.x) * VEC; c < p.hidden; c += step) {
    float x[VEC];
    to_floats(load_vec<T, VEC>(in + c), x);
    if constexpr (ADD) {
      float r[VEC];
      to_floats(load_vec<T, VEC>(res + c), r);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] += r[j];
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += x[j] * x[j];
  }
  const float rstd = rstd_of(row_sum(ss, scratch), p);

  const float rstd_offset = rstd * p.weight_offset;  // as the register path does
  const T* w = static_cast<const T*>(p.weight);
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
  T* res_out = static_cast<T*>(p.residual_out) + row * p.residual_out_stride;
#pragma unroll 4
  for (int64_t c = int64_t(threadIdx.x) * VEC; c < p.hidden; c += step) {
    float x[VEC], wv[VEC];
    to_floats(load_vec<T, VEC>(in + c), x);
    to_floats(load_vec_reused<T, VEC>(w + c), wv);
    if constexpr (ADD) {
      float r[VEC];
      to_floats(load_vec<T, VEC>(res + c), r);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] += r[j];
      store_float<T, VEC>(res_out + c, x);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) x[j] = x[j] * fmaf(wv[j], rstd, rstd_offset);
    store_float<T, VEC>(out + c, x);
  }
}

// Launches the kernel for `l` (choose_norm_launch of the rows in VEC-element vectors). kNarrow:
// only the 2-vectors-per-thread kernel exists (norm_narrow_access).
template <typename T, int VEC, bool ADD, bool kNarrow = false>
int launch_shaped(const NormParams& p, const RowLaunch& l, cudaStream_t stream) {
  // Register path: a row along x (group threads), l.threads / group rows along y.
  const dim3 grid(static_cast<unsigned>(l.blocks));
  const dim3 block(static_cast<unsigned>(l.group), static_cast<unsigned>(l.group > 0 ? l.threads / l.group : 1));
  cudaError_t err;
  if constexpr (kNarrow) {
    if (l.vecs_per_thread != 2) return static_cast<int>(cudaErrorInvalidConfiguration);  // never chosen
    err = launch_kernel(norm_rows_kernel<T, VEC, 2, ADD>, grid, block, 0, stream, p.pdl, p);
    return err != cudaSuccess ? static_cast<int>(err) : last_launch_status();
  }
  switch (l.vecs_per_thread) {
    case -1: return static_cast<int>(cudaErrorInvalidConfiguration);  // an override that cannot fit
    case 0: err = launch_kernel(norm_rows_streaming_kernel<T, VEC, ADD>, grid, block, 0, stream, p.pdl, p); break;
    case 1: err = launch_kernel(norm_rows_kernel<T, VEC, 1, ADD>, grid, block, 0, stream, p.pdl, p); break;
    case 2: err = launch_kernel(norm_rows_kernel<T, VEC, 2, ADD>, grid, block, 0, stream, p.pdl, p); break;
    case 4: err = launch_kernel(norm_rows_kernel<T, VEC, 4, ADD>, grid, block, 0, stream, p.pdl, p); break;
    case 8: err = launch_kernel(norm_rows_kernel<T, VEC, 8, ADD>, grid, block, 0, stream, p.pdl, p); break;
    default: return static_cast<int>(cudaErrorInvalidConfiguration);
  }
  return err != cudaSuccess ? static_cast<int>(err) : last_launch_status();
}

template <typename T>
int launch_typed(const NormParams& p, int device, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int es = sizeof(T);
  const bool add = p.residual != nullptr;
  const int sms = sm_count(device);
  // Accesses of `width` elements need whole vectors per row and every pointer and row stride
  // aligned to them.
  auto aligned = [&](int width) {
    return p.hidden % width == 0 && vec_aligned(p.input, p.input_stride, width, es) &&
           vec_aligned(p.out, p.out_stride, width, es) && vec_aligned(p.weight, 0, width, es) &&
           (!add || (vec_aligned(p.residual, p.residual_stride, width, es) &&
                     vec_aligned(p.residual_out, p.residual_out_stride, width, es)));
  };
  if constexpr (sizeof(T) == 2) {
    constexpr int kNarrow = 8 / sizeof(T);
    RowLaunch l;
    if (norm_narrow_launch(p.rows, p.hidden, es, sms, p.force_vpt, &l) && aligned(kNarrow)) {
      return add ? launch_shaped<T, kNarrow, true, true>(p, l, stream)
                 : launch_shaped<T, kNarrow, false, true>(p, l, stream);
    }
  }
  // 16-byte accesses where everything is aligned for them; otherwise the scalar kernel serves
  // (odd hidden sizes, offset views).
  const bool wide = aligned(kVec);
  const RowLaunch l = choose_norm_launch(p.rows, p.hidden / (wide ? kVec : 1), sms, p.force_vpt);
  if (add) return wide ? launch_shaped<T, kVec, true>(p, l, stream) : launch_shaped<T, 1, true>(p, l, stream);
  return wide ? launch_shaped<T, kVec, false>(p, l, stream) : launch_shaped<T, 1, false>(p, l, stream);
}

// Whether this file's code loaded for `device` (the current device) waits for the previous grid
// (launch.cuh): its kernels are all compiled for the same archs, so one of them tells.
bool code_waits_for_previous_grid(int device) {
  return image_waits_for_previous_grid<norm_rows_streaming_kernel<float, 1, false>>(device);
}

}  // namespace

bool norm_launches_with_pdl(int device) {
  DeviceGuard guard(device);
  return code_waits_for_previous_grid(device);
}

int launch_norm(const NormParams& p, int device, void* stream_ptr) {
  if (p.rows == 0) return 0;
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  NormParams q = p;
  q.inv_hidden = 1.f / static_cast<float>(p.hidden);  // correctly rounded, as on the device
  q.pdl = p.pdl && code_waits_for_previous_grid(device);  // else a plain launch, serialised on the stream
  return dispatch_dtype(q.dtype, [&](auto tag) { return launch_typed<decltype(tag)>(q, device, stream); });
}

}  // namespace opforge::cuda
