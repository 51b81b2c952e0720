// Binding of nvfp4_gemv (batched GEMV of NVFP4 operands) and its CPU implementation. The CUDA
// kernels are in cuda/nvfp4_gemv.cu; the format is described in python/opforge/ops/nvfp4_format.py.
#include <nanobind/nanobind.h>

#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cpu_kernels.h"
#include "nvfp4_gemv.h"
#include "tensor_view.h"
#ifdef OPFORGE_WITH_CUDA
#include "device.h"
#endif

namespace opforge {
namespace {

using cuda::Nvfp4GemvParams;
using cuda::Nvfp4GemvPlan;
using Code = nb::dlpack::dtype_code;

const OpContext kCtx{"nvfp4_gemv"};
const std::string kPrefix = "opforge.nvfp4_gemv: ";

// --- CPU implementation -----------------------------------------------------------------------

// Twice the E2M1 value of each code: integers in [-12, 12], so a 16-value block's dot product is
// an exact int32 (4 * sum of a * b, at most 16 * 144 in magnitude).
constexpr std::array<int8_t, 16> kE2M1Twice = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Both nibbles of a byte decoded at once (the low nibble is the even element).
constexpr std::array<std::array<int8_t, 2>, 256> make_pair_table() {
  std::array<std::array<int8_t, 2>, 256> t{};
  for (int byte = 0; byte < 256; ++byte) t[byte] = {kE2M1Twice[byte & 15], kE2M1Twice[byte >> 4]};
  return t;
}
constexpr auto kE2M1Pairs = make_pair_table();

// E4M3 (FN: no infinities; S.1111.111 is NaN) byte -> its exact float value.
constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int byte = 0; byte < 256; ++byte) {
    const int exponent = (byte >> 3) & 15, mantissa = byte & 7;
    float v = 0.f;
    if ((byte & 0x7F) == 0x7F) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else {
      // exponent 0: subnormal, mantissa * 2^-9; else (8 + mantissa) * 2^(exponent - 10)
      v = exponent == 0 ? float(mantissa) : float(8 + mantissa);
      for (int e = exponent == 0 ? 9 : 10 - exponent; e > 0; --e) v *= 0.5f;
      for (int e = exponent == 0 ? 0 : exponent - 10; e > 0; --e) v *= 2.f;
    }
    t[byte] = (byte & 0x80) ? -v : v;
  }
  return t;
}
constexpr auto kE4M3 = make_e4m3_table();

// c[m, 0, l] = sum over blocks j of dot_j * scale_a[m, j, l] * scale_b[0, j, l], where dot_j is
// the exact dot product of the block's E2M1 values. Each block's term is exact in fp32 too (a
// 12-bit integer times a product of two 4-bit mantissas), so the only roundings are the fp32
// additions across blocks and the final fp16 rounding, as on the GPU. Order: block j goes into
// partial sum j % 8, and the 8 partials are added pairwise at the end; that keeps the rounding
// error well below the fp16 result's for any K, and lets the compiler vectorise.
void nvfp4_gemv_cpu(const Nvfp4GemvParams& p) {
  const int64_t blocks = p.k / 16, bytes = p.k / 2;
  const auto* a = static_cast<const uint8_t*>(p.a);
  const auto* b = static_cast<const uint8_t*>(p.b);
  const auto* sa = static_cast<const uint8_t*>(p.scale_a);
  const auto* sb = static_cast<const uint8_t*>(p.scale_b);
  auto* out = static_cast<cpu::Half*>(p.out);
  std::vector<int8_t> a_vals(static_cast<size_t>(p.k)), b_vals(static_cast<size_t>(p.k));
  std::vector<float> b_scale(static_cast<size_t>(blocks));
  const auto decode_row = [bytes](const uint8_t* row, std::vector<int8_t>& values) {
    for (int64_t i = 0; i < bytes; ++i) {
      values[2 * i] = kE2M1Pairs[row[i]][0];
      values[2 * i + 1] = kE2M1Pairs[row[i]][1];
    }
  };
  for (int64_t l = 0; l < p.l; ++l) {
    decode_row(b + l * p.b_stride_l, b_vals);
    // The quarter undoes the doubled codes of A and B (exact: a power of two).
    for (int64_t j = 0; j < blocks; ++j) b_scale[j] = kE4M3[sb[l * p.sb_stride_l + j]] * 0.25f;
    for (int64_t m = 0; m < p.m; ++m) {
      const uint8_t* a_row = a + m * p.a_stride_m + l * p.a_stride_l;
      const uint8_t* sa_row = sa + m * p.sa_stride_m + l * p.sa_stride_l;
      decode_row(a_row, a_vals);
      const int8_t* av = a_vals.data();
      const int8_t* bv = b_vals.data();
      float partial[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int64_t j = 0; j < blocks; ++j) {
        int32_t dot = 0;
        for (int i = 0; i < 16; ++i) dot += int32_t(av[16 * j + i]) * int32_t(bv[16 * j + i]);
        partial[j & 7] += float(dot) * (kE4M3[sa_row[j]] * b_scale[j]);
      }
      const float c = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                      ((partial[4] + partial[5]) + (partial[6] + partial[7]));
      out[m * p.out_stride_m + l * p.out_stride_l] = cpu::from_float<cpu::Half>(c);
    }
  }
}

// --- validation -------------------------------------------------------------------------------

bool is_fp4x2(nb::dlpack::dtype dt) { return dt.code == uint8_t(Code::Float4_E2M1FN) && dt.bits * dt.lanes == 8; }
bool is_e4m3(nb::dlpack::dtype dt) { return has_dtype(dt, Code::Float8_E4M3FN, 8); }
bool is_uint8(nb::dlpack::dtype dt) { return has_dtype(dt, Code::UInt, 8); }

enum class Kind { kFp4, kScale, kOut, kWorkspace };

struct Operand : SizedArg {
  Kind kind;
};

void check_dtype(const Operand& o) {
  const nb::dlpack::dtype dt = o.t.dtype();
  const std::string given = kPrefix + o.name() + " has dtype " + dtype_name(dt) + "; accepted: ";
  switch (o.kind) {
    case Kind::kFp4:
      if (is_fp4x2(dt)) return;
      if (is_uint8(dt)) {
        throw_type_error(given + "float4_e2m1fn_x2 (two FP4 E2M1 codes per byte, the even element in the low "
                                 "nibble); pass uint8 bytes holding packed codes as " + o.name() +
                         ".view(torch.float4_e2m1fn_x2)");
      }
      throw_type_error(given + "float4_e2m1fn_x2 (two FP4 E2M1 codes per byte)");
    case Kind::kScale:
      if (is_e4m3(dt)) return;
      if (is_uint8(dt)) {
        throw_type_error(given + "float8_e4m3fn; pass uint8 bytes holding E4M3 scales as " + o.name() +
                         ".view(torch.float8_e4m3fn)");
      }
      throw_type_error(given + "float8_e4m3fn (the NVFP4 block scales)");
    case Kind::kOut:
      if (has_dtype(dt, Code::Float, 16)) return;
      throw_type_error(given + "float16");
    case Kind::kWorkspace:
      if (has_dtype(dt, Code::Float, 32)) return;
      throw_type_error(given + "float32");
  }
}

// `layout` names the expected shape in error messages, e.g. "[M, K/2, L]".
Operand operand(nb::handle obj, const char* name, Kind kind, const char* layout) {
  Operand o{{tensor_arg(kCtx, obj, name), kind == Kind::kOut ? 2 : kind == Kind::kWorkspace ? 4 : 1}, kind};
  check_dtype(o);
  const size_t want = kind == Kind::kWorkspace ? 1 : 3;
  if (kind == Kind::kScale && o.t.ndim() == 6) {
    throw_value_error(kPrefix + name + " has shape " + shape_string(o.t) + "; expected a 3-d tensor " + layout +
                      " (the plain layout; this looks like the blocked 128x4 one, which "
                      "opforge.ops.nvfp4_format.from_blocked converts)");
  }
  check_rank(kCtx, o, want, layout);
  return o;
}

// Whether two elements of out share memory, exactly (overlaps_itself is conservative). For
// [M, 1, L] with strides s_m, s_l >= 0, offsets m * s_m + l * s_l meet iff some (dm, dl) != 0 with
// |dm| < M, |dl| < L has dm * s_m = -dl * s_l; the smallest such pair is (s_l / g, s_m / g) with
// g = gcd(s_m, s_l).
bool out_overlaps_itself(const Operand& out) {
  const int64_t m = out.shape(0), l = out.shape(2), sm = out.stride(0), sl = out.stride(2);
  if (m > 1 && sm == 0) return true;
  if (l > 1 && sl == 0) return true;
  if (m <= 1 || l <= 1) return false;
  const int64_t g = std::gcd(sm, sl);
  return sl / g < m && sm / g < l;
}

// Dimension 1 (K) must be contiguous wherever it has more than one element.
void check_k_contiguous(const Operand& o) {
  if (o.shape(1) > 1 && o.stride(1) != 1) {
    throw_value_error(kPrefix + o.name() + " has stride " + std::to_string(o.stride(1)) +
                      " along K (dimension 1); K must be contiguous (stride 1), the M and L strides are free: "
                      "e.g. " + o.name() + ".permute(2, 0, 1).contiguous().permute(1, 2, 0) keeps it as [L, rows, K]");
  }
}

Nvfp4GemvPlan forced_or_chosen_plan(int64_t m, int64_t k, int64_t l, int sms, int rows, int group, int splits,
                                    int blocks_per_sm) {
  if (rows < 0 && group < 0 && splits < 0) {  // the heuristic's plan, its occupancy forced or not
    const Nvfp4GemvPlan chosen = cuda::choose_nvfp4_gemv_plan(m, k, l, sms);
    if (blocks_per_sm < 0 || chosen.rows == 0) return chosen;
    rows = chosen.rows, group = chosen.group, splits = chosen.splits;
  }
  const Nvfp4GemvPlan plan = cuda::nvfp4_gemv_plan(m, k, l, sms, rows, group, splits, blocks_per_sm < 0 ? -1 : blocks_per_sm);
  if (plan.rows == 0) {
    throw_value_error(kPrefix + "plan (rows=" + std::to_string(rows) + ", group=" + std::to_string(group) +
                      ", splits=" + std::to_string(splits) + ", blocks_per_sm=" + std::to_string(blocks_per_sm) +
                      ") is not valid; accepted: rows 1, 2 or 4, group a power of two up to " +
                      std::to_string(cuda::kNvfp4Threads) + ", splits 1.." + std::to_string(cuda::kNvfp4MaxSplits) +
                      " (all three given), blocks_per_sm " + std::to_string(cuda::kNvfp4DeepBlocksPerSm) + " or " +
                      std::to_string(cuda::kNvfp4WideBlocksPerSm) + " (-1: chosen by the row length)");
  }
  return plan;
}

// Validates everything, then computes into `out` (launch) or only validates (the "torch"
// backend). Returns 0 when done, or, for a CUDA plan that splits K and no workspace given, the
// fp32 elements of workspace to call again with (nothing is written then).
int64_t nvfp4_gemv(nb::handle out_obj, nb::handle a_obj, nb::handle b_obj, nb::handle scale_a_obj,
                   nb::handle scale_b_obj, nb::handle workspace_obj, std::optional<uintptr_t> stream, bool launch, int rows, int group,
                   int splits, int blocks_per_sm) {
  const Operand a = operand(a_obj, "a", Kind::kFp4, "[M, K/2, L]");
  check_device_supported(kCtx, a.device_view());
  const Operand b = operand(b_obj, "b", Kind::kFp4, "[1, K/2, L]");
  check_same_device(kCtx, a, b);
  const Operand sa = operand(scale_a_obj, "scale_a", Kind::kScale, "[M, K/16, L]");
  check_same_device(kCtx, a, sa);
  const Operand sb = operand(scale_b_obj, "scale_b", Kind::kScale, "[1, K/16, L]");
  check_same_device(kCtx, a, sb);
  const Operand out = operand(out_obj, "out", Kind::kOut, "[M, 1, L]");
  check_same_device(kCtx, a, out);

  const int64_t m = a.shape(0), half_k = a.shape(1), l = a.shape(2), k = 2 * half_k;
  if (b.shape(0) != 1) {
    throw_value_error(kPrefix + "b has shape " + shape_string(b.t) + "; expected [1, K/2, L] = " +
                      dims_string({1, half_k, l}) + ": one vector per batch");
  }
  if (b.shape(1) != half_k) {
    throw_value_error(kPrefix + "b has shape " + shape_string(b.t) + " but a has shape " + shape_string(a.t) +
                      "; their K/2 (dimension 1) must be equal");
  }
  if (b.shape(2) != l) {
    throw_value_error(kPrefix + "b has shape " + shape_string(b.t) + " but a has shape " + shape_string(a.t) +
                      "; their L (dimension 2, the batch) must be equal");
  }
  if (k % 64 != 0) {
    throw_value_error(kPrefix + "a has shape " + shape_string(a.t) + ", so K = " + std::to_string(k) +
                      " values, which is not a multiple of 64; accepted: K a multiple of 64 (16-value scale "
                      "blocks, 4 per scale tile)");
  }
  check_dims(kCtx, sa, {m, k / 16, l}, "[M, K/16, L]");
  check_dims(kCtx, sb, {1, k / 16, l}, "[1, K/16, L]");
  check_dims(kCtx, out, {m, 1, l}, "[M, 1, L]");
  for (const Operand* o : {&a, &b, &sa, &sb}) check_k_contiguous(*o);
  if (out_overlaps_itself(out)) {
    throw_value_error(kPrefix + "out has strides " + dims_string({out.stride(0), out.stride(1), out.stride(2)}) +
                      " for shape " + shape_string(out.t) + ", so some of its elements overlap (an expanded or "
                      "broadcast tensor cannot be written)");
  }
  for (const Operand* o : {&a, &b, &sa, &sb}) check_separate(kCtx, out, *o);
  int64_t outputs = 0;
  if (__builtin_mul_overflow(m, l, &outputs) || outputs > INT32_MAX) {
    throw_value_error(kPrefix + "a has shape " + shape_string(a.t) + ": M * L outputs; accepted: fewer than 2^31");
  }

  Nvfp4GemvParams p;
  p.out = out.data();
  p.a = a.data();
  p.b = b.data();
  p.scale_a = sa.data();
  p.scale_b = sb.data();
  p.m = m;
  p.k = k;
  p.l = l;
  p.a_stride_m = a.stride(0);
  p.a_stride_l = a.stride(2);
  p.b_stride_l = b.stride(2);
  p.sa_stride_m = sa.stride(0);
  p.sa_stride_l = sa.stride(2);
  p.sb_stride_l = sb.stride(2);
  p.out_stride_m = out.stride(0);
  p.out_stride_l = out.stride(2);
  if (!launch || m == 0 || l == 0) return 0;  // launch=false: validate only

  if (!a.device_view().is_cuda()) {
    std::optional<nb::gil_scoped_release> release;
    if (m * l * k >= cpu::kReleaseGilElems) release.emplace();
    nvfp4_gemv_cpu(p);
  } else {
#ifdef OPFORGE_WITH_CUDA
    const int device = a.t.device_id();
    const Nvfp4GemvPlan plan = forced_or_chosen_plan(m, k, l, cuda::sm_count(device), rows, group, splits, blocks_per_sm);
    if (cuda::nvfp4_gemv_tasks(m, l, plan.rows, plan.splits) > INT32_MAX) {
      throw_value_error(kPrefix + "M * L = " + std::to_string(m * l) + " outputs times " +
                        std::to_string(plan.splits) + " splits of K exceed the kernel's 31-bit task index");
    }
    const int64_t need = cuda::nvfp4_gemv_workspace_elems(plan, m, l);
    if (need > 0) {
      if (workspace_obj.is_none()) return need;
      const Operand ws = operand(workspace_obj, "workspace", Kind::kWorkspace, "[n]");
      check_same_device(kCtx, a, ws);
      if (ws.shape(0) < need || (ws.shape(0) > 1 && ws.stride(0) != 1)) {
        throw_value_error(kPrefix + "workspace has shape " + shape_string(ws.t) + "; expected a contiguous "
                          "float32 tensor of at least " + std::to_string(need) + " elements");
      }
      check_separate(kCtx, ws, out);
      for (const Operand* o : {&a, &b, &sa, &sb}) check_separate(kCtx, ws, *o);
      p.workspace = reinterpret_cast<float*>(ws.data());
    }
    check_launch(kCtx, cuda::launch_nvfp4_gemv(p, plan, device, launch_stream(stream, device)), device);
#endif
  }
  mark_written({out_obj});
  return 0;
}

nb::dict plan_dict(int64_t m, int64_t k, int64_t l, int sms, int rows, int group, int splits, int blocks_per_sm) {
  if (m < 0 || k < 0 || l < 0 || k % 64 != 0 || sms < 1) {
    throw_value_error(kPrefix + "plan needs M, L >= 0, K a multiple of 64 and sms >= 1");
  }
  const Nvfp4GemvPlan plan = forced_or_chosen_plan(m, k, l, sms, rows, group, splits, blocks_per_sm);
  nb::dict d;
  d["rows"] = plan.rows;
  d["group"] = plan.group;
  d["splits"] = plan.splits;
  d["blocks_per_sm"] = plan.blocks_per_sm;
  d["blocks"] = plan.blocks;
  d["workspace"] = cuda::nvfp4_gemv_workspace_elems(plan, m, l);
  return d;
}

}  // namespace

void bind_nvfp4_gemv(nb::module_& m) {
  m.def("nvfp4_gemv", &nvfp4_gemv, nb::arg("out"), nb::arg("a"), nb::arg("b"), nb::arg("scale_a"),
        nb::arg("scale_b"), nb::arg("workspace").none(), nb::arg("stream").none(), nb::arg("launch"), nb::arg("rows") = -1,
        nb::arg("group") = -1, nb::arg("splits") = -1, nb::arg("blocks_per_sm") = -1,
        "c = A @ B per batch for NVFP4 operands, into `out`; see opforge.ops.nvfp4. Returns 0, or the float32\n"
        "workspace elements a CUDA plan that splits K needs (call again with it; nothing was written).\n"
        "rows/group/splits force the CUDA plan (all three, for tuning), blocks_per_sm (2 or 4) its kernel's\n"
        "occupancy (alone: the heuristic's plan at that occupancy); -1: the heuristic.");
  m.def("nvfp4_gemv_plan", &plan_dict, nb::arg("m"), nb::arg("k"), nb::arg("l"), nb::arg("sms"),
        nb::arg("rows") = -1, nb::arg("group") = -1, nb::arg("splits") = -1, nb::arg("blocks_per_sm") = -1,
        "The CUDA launch plan of nvfp4_gemv for an M x K x L problem on a GPU with `sms` multiprocessors.");
}

}  // namespace opforge
