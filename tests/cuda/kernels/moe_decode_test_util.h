// Helpers shared by the MoE decode block's tests (moe_decode_test.cpp, moe_router_gate_up_test.cpp): a random MoE
// layer on the host (MoeHost: 4-bit or float experts, 8-bit or float router) and its device copy (MoeDevice).
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "../cuda_test_util.h"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/moe/moe_dp4a.cuh"

namespace tern::cuda::test {

struct MoeHost {
  Config cfg;
  std::unique_ptr<HostMatrix> router, sgate_logit, gate, up, down, sgate, sup, sdown;
  LayerWeights lw;
  std::vector<float> norm_w;
};

inline std::unique_ptr<MoeHost> make_moe(std::mt19937_64& rng, WeightFormat experts_f, WeightFormat router_f, int E,
                                         int k, int64_t D, int64_t F) {
  auto m = std::make_unique<MoeHost>();
  m->cfg.hidden_size = D;
  m->cfg.num_experts = E;
  m->cfg.num_experts_per_tok = k;
  m->cfg.moe_intermediate_size = F;
  m->cfg.shared_expert_intermediate_size = F;
  m->cfg.norm_topk_prob = true;
  m->router = random_matrix(rng, router_f, 1, E, D);
  m->sgate_logit = random_matrix(rng, router_f, 1, 1, D);
  m->gate = random_matrix(rng, experts_f, E, F, D);
  m->up = random_matrix(rng, experts_f, E, F, D);
  m->down = random_matrix(rng, experts_f, E, D, F);
  m->sgate = random_matrix(rng, experts_f, 1, F, D);
  m->sup = random_matrix(rng, experts_f, 1, F, D);
  m->sdown = random_matrix(rng, experts_f, 1, D, F);
  m->norm_w = random_floats(rng, size_t(D), 0.5f, 1.5f);
  LayerWeights& l = m->lw;
  l.type = LayerType::linear_attention;
  l.post_attn_norm = m->norm_w;
  l.router = m->router->m;
  l.shared_expert_gate = m->sgate_logit->m;
  l.expert_gate = m->gate->m;
  l.expert_up = m->up->m;
  l.expert_down = m->down->m;
  l.shared_gate = m->sgate->m;
  l.shared_up = m->sup->m;
  l.shared_down = m->sdown->m;
  return m;
}

struct MoeDevice {
  DeviceMatrix router, sgate_logit, gate, up, down, sgate, sup, sdown;
  DeviceBuf<float> norm_w;
  MoeDecodeWeights w;
  explicit MoeDevice(const MoeHost& h)
      : router(*h.router), sgate_logit(*h.sgate_logit), gate(*h.gate), up(*h.up), down(*h.down), sgate(*h.sgate),
        sup(*h.sup), sdown(*h.sdown), norm_w(h.norm_w) {
    w.norm_w = norm_w.p;
    w.eps = 1e-6f;
    w.router = router.d;
    w.shared_expert_gate = sgate_logit.d;
    w.expert_gate = gate.d;
    w.expert_up = up.d;
    w.expert_down = down.d;
    w.shared_gate = sgate.d;
    w.shared_up = sup.d;
    w.shared_down = sdown.d;
    w.top_k = h.cfg.num_experts_per_tok;
  }
};

// The MoE kernels' activation width (moe_dp4a_set_wide: 24 bits or 16) for a scope; the one before comes back when it
// ends, however it ends.
class MoeWidth {
 public:
  explicit MoeWidth(bool wide) { moe_dp4a_set_wide(wide); }
  ~MoeWidth() { moe_dp4a_set_wide(before_); }
  MoeWidth(const MoeWidth&) = delete;
  MoeWidth& operator=(const MoeWidth&) = delete;
  void set(bool wide) { moe_dp4a_set_wide(wide); }

 private:
  bool before_ = moe_dp4a_wide();
};

template <typename T>
inline std::vector<T> to_host(const T* p, size_t n) {
  TERN_CUDA(cudaDeviceSynchronize());
  std::vector<T> h(n);
  TERN_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace tern::cuda::test
