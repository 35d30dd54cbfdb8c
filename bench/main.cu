// tern_kernels: runs the registered kernel cases and prints one table (see workbench.h).
//   tern_kernels [--reps N] [--csv FILE] [FILTER...]   (a case runs when its "group name" contains every FILTER)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "bench/workbench.h"
#include "core/check.h"
#include "cuda/common/cuda_common.cuh"

namespace tern::bench {
namespace {

std::vector<std::pair<std::string, std::function<void(CaseList&)>>>& registry() {
  static std::vector<std::pair<std::string, std::function<void(CaseList&)>>> r;
  return r;
}

__global__ void fill_bits_kernel(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + i;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    p[i] = uint32_t(x);
  }
}

__global__ void bits_to_floats_kernel(float* p, size_t n, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t b = __float_as_uint(p[i]);
    p[i] = lo + (hi - lo) * float(b >> 8) * (1.0f / 16777216.0f);
  }
}

}  // namespace

Registrar::Registrar(const char* family, std::function<void(CaseList&)> add) {
  registry().emplace_back(family, std::move(add));
}

void* bench_alloc_random_bytes(size_t bytes, uint64_t seed) {
  void* p = nullptr;
  TERN_CUDA(cudaMalloc(&p, (bytes + 3) / 4 * 4));
  fill_bits_kernel<<<1024, 256>>>(static_cast<uint32_t*>(p), (bytes + 3) / 4, seed);
  TERN_CUDA(cudaGetLastError());
  return p;
}

float* bench_alloc_random_floats(size_t n, float lo, float hi, uint64_t seed) {
  float* p = static_cast<float*>(bench_alloc_random_bytes(n * 4, seed));
  bits_to_floats_kernel<<<1024, 256>>>(p, n, lo, hi);
  TERN_CUDA(cudaGetLastError());
  return p;
}

int bench_copies_for(double bytes_per_copy) {
  int dev = 0, l2 = 0;
  TERN_CUDA(cudaGetDevice(&dev));
  TERN_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const double want = 4.0 * double(l2);
  return std::max(1, int(want / std::max(1.0, bytes_per_copy)) + 1);
}

}  // namespace tern::bench

int main(int argc, char** argv) {
  using namespace tern::bench;
  int reps = 50;
  std::string csv;
  std::vector<std::string> filters;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) {
      csv = argv[++i];
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf("usage: tern_kernels [--reps N] [--csv FILE] [FILTER...]\n");
      return 0;
    } else {
      filters.push_back(argv[i]);
    }
  }
  try {
    TERN_CHECK(tern::cuda::device_count() > 0, "tern_kernels needs a CUDA GPU");
    const double peak_gbs = 4600.0, peak_tflops = 790.0;
    std::printf("tern_kernels on %s; median of %d samples, each a CUDA graph of 20 back-to-back runs (time / 20); ceilings %.0f GB/s, "
                "%.0f TFLOP/s\n",
                tern::cuda::device_description().c_str(), reps, peak_gbs, peak_tflops);
    FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
    if (out) std::fprintf(out, "group,name,us,GBps,pct_bw,TFLOPs,pct_flops\n");
    std::printf("| group | kernel | µs | GB/s | %% of 4.6 TB/s | TFLOP/s | %% of 790 |\n|---|---|---:|---:|---:|---:|---:|\n");
    cudaStream_t stream;
    TERN_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    TERN_CUDA(cudaEventCreate(&e0));
    TERN_CUDA(cudaEventCreate(&e1));
    int failed = 0;  // cases that threw: the table is printed whole, the exit status says so
    for (auto& [family, add] : registry()) {
      CaseList cases;
      add(cases);
      for (Case& c : cases) {
        const std::string full = c.group + " " + c.name;
        bool take = true;
        for (const auto& f : filters) take = take && full.find(f) != std::string::npos;
        if (!take) continue;
        try {
          if (c.setup) c.setup();
          for (int w = 0; w < 3; ++w) c.run(stream, w);
          TERN_CUDA(cudaStreamSynchronize(stream));
          // Each sample is a CUDA graph of kBatch back-to-back runs (as the kernels run inside the decode graph),
          // divided by kBatch; plain launches if the case cannot be captured.
          constexpr int kBatch = 20;
          cudaGraphExec_t exec = nullptr;
          {
            cudaGraph_t g = nullptr;
            TERN_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
            bool ok = true;
            try {
              for (int b = 0; b < kBatch; ++b) c.run(stream, 3 + b);
            } catch (const tern::Error&) {
              ok = false;
            }
            const cudaError_t ce = cudaStreamEndCapture(stream, &g);
            if (ok && ce == cudaSuccess && g && cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) exec = nullptr;
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
          }
          std::vector<float> ms;
          for (int r = 0; r < reps; ++r) {
            TERN_CUDA(cudaEventRecord(e0, stream));
            if (exec) {
              TERN_CUDA(cudaGraphLaunch(exec, stream));
            } else {
              for (int b = 0; b < kBatch; ++b) c.run(stream, 3 + r * kBatch + b);
            }
            TERN_CUDA(cudaEventRecord(e1, stream));
            TERN_CUDA(cudaEventSynchronize(e1));
            float t = 0;
            TERN_CUDA(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t / (kBatch * std::max(1, c.units)));
          }
          if (exec) cudaGraphExecDestroy(exec);
          std::sort(ms.begin(), ms.end());
          const double us = double(ms[ms.size() / 2]) * 1e3;
          const double gbs = c.bytes / us * 1e-3, tf = c.flops / us * 1e-6;
          std::printf("| %s | %s | %.2f | %.0f | %.1f%% | %.2f | %.1f%% |\n", c.group.c_str(), c.name.c_str(), us, gbs,
                      100.0 * gbs / peak_gbs, tf, 100.0 * tf / peak_tflops);
          if (out)
            std::fprintf(out, "%s,\"%s\",%.3f,%.1f,%.2f,%.3f,%.2f\n", c.group.c_str(), c.name.c_str(), us, gbs,
                         100.0 * gbs / peak_gbs, tf, 100.0 * tf / peak_tflops);
          if (c.teardown) c.teardown();
        } catch (const tern::Error& e) {
          std::printf("| %s | %s | failed: %s | | | | |\n", c.group.c_str(), c.name.c_str(), e.what());
          ++failed;
          cudaGetLastError();
        }
        std::fflush(stdout);
      }
    }
    if (out) std::fclose(out);
    if (failed > 0) {
      std::fprintf(stderr, "tern_kernels: %d case(s) failed\n", failed);
      return 1;
    }
  } catch (const tern::Error& e) {
    std::fprintf(stderr, "tern_kernels: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
