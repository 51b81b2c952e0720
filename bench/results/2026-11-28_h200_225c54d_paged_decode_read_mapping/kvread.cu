// Pure-read probe: does the mapping of warps to (request, KV head, tokens) change the DRAM
// throughput of streaming a paged KV cache [page][slot][head][128 dims] bf16 (random page order)
// through cp.async rings like the paged decode kernel's (3 stages of 16 K + 16 V rows of 256 B per
// warp, 8 warps resident per SM), with its token-row address arithmetic (a lane works out a row's
// index once, copying lanes take it by shuffle)? No compute: each step's stage is only waited for.
// Mappings, per case (each timed twice, the rounds one after the other):
//  A 1x4 SN: CTA (request, head, split) of 4 warps taking 4 runs of the split (the shipped layout)
//  D:        the same on contiguous [request][head][token] rows (SDPA's gathered KV)
//  HxT SN:   CTA (request, split, group of H heads) of H x T warps: warp w reads head w % H of
//            run w / H of the split's T runs, so H warps read the same tokens' rows of H heads
// Build and run: nvcc -O3 -std=c++17 -arch=sm_90a -o kvread kvread.cu && ./kvread
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int kStages = 3, kRow = 256, kStep = 16;
constexpr int kStage = 2 * kStep * kRow;

struct P {
  const unsigned char *k, *v;
  const int32_t* idx;
  int B, T, H, ps, S, mode;  // S: splits per request (A/H/D); runs R = 4 S
  int HW, TW;  // mode 5: heads in step x token warps per CTA
  unsigned long long* sink;
};

__device__ __forceinline__ void copy16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__global__ void __launch_bounds__(256) probe(P p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem + warp * kStages * kStage));
  int b, head0, t_begin, t_end;
  unsigned x = blockIdx.x;
  if (p.mode == 0 || p.mode == 4) {  // A, D: (b, head, split), 4 runs per split
    const int run_len = p.T / (4 * p.S);
    const int s = x % p.S; x /= p.S;
    const int h = x % p.H; b = x / p.H;
    head0 = h, t_begin = (s * 4 + warp) * run_len, t_end = t_begin + run_len;
  } else {  // (b, split, head group of HW): warp w -> head w % HW, run w / HW of the split's TW
    const int groups = p.H / p.HW;
    const int hg = x % groups; x /= groups;
    const int s = x % p.S; b = x / p.S;
    const int len = p.T / (p.S * p.TW);
    head0 = hg * p.HW + warp % p.HW, t_begin = (s * p.TW + warp / p.HW) * len, t_end = t_begin + len;
  }
  const int tokens_per_step = kStep;  // 16 rows of one head
  const int steps = (t_end - t_begin) / tokens_per_step;
  const int chunk = lane & 15, row0 = lane >> 4;
  const int pages_per_req = p.T / p.ps;
  // As the decode kernel's token-row path: lane i < 16 works out the cache row (page * ps + slot,
  // in tokens) of step row i once; copying lanes take it by shuffle, one multiply-add per copy.
  const unsigned char* kb = p.k + chunk * 16;
  const unsigned char* vb = p.v + chunk * 16;
  auto fetch = [&](int s) -> int32_t {
    if (s >= steps) return 0;
    const int t = t_begin + s * tokens_per_step + (lane & 15);
    return p.mode == 4 ? 0 : __ldg(p.idx + b * pages_per_req + (p.ps == 1 ? t : t / p.ps));
  };
  auto issue = [&](int s, int32_t id) {
    if (s < steps) {
      const uint32_t stage = ring + (s % kStages) * kStage;
      const int r = lane & 15;
      const int t = t_begin + s * tokens_per_step + r;
      // unit: 256-byte head rows
      const uint32_t unit = p.mode == 4 ? uint32_t((b * p.H + head0) * p.T + t)
                                        : uint32_t((id * p.ps + (p.ps == 1 ? 0 : t % p.ps)) * p.H + head0);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = row0 + 2 * i;
        const uint64_t u = __shfl_sync(0xffffffffu, unit, row);
        copy16(stage + row * kRow + chunk * 16, kb + u * kRow);
        copy16(stage + (kStep + row) * kRow + chunk * 16, vb + u * kRow);
      }
    }
    commit();
  };
  int32_t ids[kStages - 1];
  for (int s = 0; s < kStages - 1; ++s) ids[s] = fetch(s);
  for (int s = 0; s < kStages - 1; ++s) issue(s, ids[s]);
  int32_t ahead = fetch(kStages - 1);
  unsigned long long acc = 0;
  const unsigned long long* mine = reinterpret_cast<const unsigned long long*>(smem + warp * kStages * kStage);
  for (int s = 0; s < steps; ++s) {
    __syncwarp();
    issue(s + kStages - 1, ahead);
    ahead = fetch(s + kStages);
    wait<kStages - 1>();
    __syncwarp();
    acc ^= mine[(s % kStages) * (kStage / 8) + lane];
  }
  wait<0>();
  if (acc == 0x123456789ull) *p.sink = acc;
}

int main() {
  int dev = 0, sms = 0, per_sm = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  const int smem = (per_sm / 2 - 2048) / 128 * 128;  // 2 CTAs per SM, as the decode kernel
  const int smem8 = (per_sm - 2048) / 128 * 128;  // one 8-warp CTA per SM
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem8));
  struct Case { int H, ps, B, T; };
  const Case cases[] = {{4, 1, 128, 2048}, {4, 1, 64, 2048}, {4, 1, 32, 8192}, {4, 1, 32, 2048}, {4, 1, 8, 8192},
                        {8, 1, 128, 2048}, {8, 1, 32, 2048}, {8, 1, 32, 8192}, {4, 16, 128, 2048}, {8, 16, 32, 2048}};
  // mappings: mode, HW, TW, S (mode 0 = A with TW 4; 4 = D)
  struct Map { const char* name; int mode, HW, TW, S; };
  // Copy ceiling: 1 GiB device to device.
  {
    size_t n = size_t(1) << 30;
    void *a, *c;
    CK(cudaMalloc(&a, n)); CK(cudaMalloc(&c, n));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<float> ts;
    for (int i = 0; i < 12; ++i) {
      cudaEventRecord(e0); cudaMemcpyAsync(c, a, n, cudaMemcpyDeviceToDevice); cudaEventRecord(e1);
      cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    printf("copy 1 GiB: %.1f GB/s (read + write)\n", 2.0 * n / (ts[6] * 1e-3) / 1e9);
    cudaFree(a); cudaFree(c);
  }
  unsigned long long* sink; CK(cudaMalloc(&sink, 8));
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    const int64_t tokens = int64_t(c.B) * c.T, pages = tokens / c.ps;
    const size_t bytes = size_t(tokens) * c.H * kRow;
    unsigned char *k, *v; int32_t* idx;
    CK(cudaMalloc(&k, bytes)); CK(cudaMalloc(&v, bytes)); CK(cudaMalloc(&idx, pages * 4));
    CK(cudaMemset(k, 1, bytes)); CK(cudaMemset(v, 2, bytes));
    std::vector<int32_t> h(pages);
    for (int64_t i = 0; i < pages; ++i) h[i] = int32_t(i);
    std::shuffle(h.begin(), h.end(), rng);
    CK(cudaMemcpy(idx, h.data(), pages * 4, cudaMemcpyHostToDevice));
    printf("H%d ps%d %dx%d (%.0f MB, us; second round after the first):\n", c.H, c.ps, c.B, c.T, 2.0 * bytes / 1e6);
    // Splits so that the CTAs x warps of each mapping make about two waves.
    const int64_t wave = int64_t(sms) * 8;
    auto splits_for = [&](int warps_per_request_split) {
      int64_t s = (2 * wave + int64_t(c.B) * warps_per_request_split - 1) / (int64_t(c.B) * warps_per_request_split);
      while (s > 1 && c.T % (s * 16 * 4) != 0) --s;
      return int(s < 1 ? 1 : s);
    };
    const int sA = splits_for(c.H * 4);
    static char a_name[16];
    snprintf(a_name, sizeof(a_name), "A 1x4 S%d", sA);
    std::vector<Map> maps = {{a_name, 0, 1, 4, sA}, {"D", 4, 1, 4, sA}, {"A 1x4 S1", 0, 1, 4, 1}};
    for (int hw : {2, 4, 8}) {
      if (c.H % hw) continue;
      for (int tw : {1, 2, 4}) {
        if (hw * tw != 4 && hw * tw != 8) continue;
        static char buf[64][16]; static int nb = 0;
        char* n1 = buf[nb++ % 64]; snprintf(n1, 16, "%dx%d S1", hw, tw);
        maps.push_back({n1, 5, hw, tw, 1});
        const int s = splits_for(c.H * tw);
        if (s > 1) { char* n2 = buf[nb++ % 64]; snprintf(n2, 16, "%dx%d S%d", hw, tw, s); maps.push_back({n2, 5, hw, tw, s}); }
      }
    }
    for (int rep = 0; rep < 2; ++rep) for (const Map& m : maps) {
      const int warps = m.mode == 5 ? m.HW * m.TW : 4;
      P p{k, v, idx, c.B, c.T, c.H, c.ps, m.S, m.mode, m.HW, m.TW, sink};
      const unsigned ctas = unsigned(int64_t(c.B) * m.S * (m.mode == 5 ? c.H / m.HW : c.H));
      const int sm_bytes = warps == 8 ? smem8 : smem;
      cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
      std::vector<float> ts;
      for (int i = 0; i < 25; ++i) {
        cudaEventRecord(e0);
        probe<<<ctas, warps * 32, sm_bytes>>>(p);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms);
      }
      CK(cudaGetLastError());
      std::sort(ts.begin() + 3, ts.end());
      const float med = ts[3 + 11];
      printf("  [%s] %.1f", m.name, med * 1e3);
    }
    printf("\n");
    cudaFree(k); cudaFree(v); cudaFree(idx);
  }
  return 0;
}
