// Rotary position embedding, rotate-half (NeoX) pairing on the first `rot` dims of each head.
#pragma once

#include <cstdint>

namespace tern::cpu {

// In place on x [T, H, dh]; token t has position pos0 + t. For i in [0, rot/2), f_i = theta^(-2i/rot) and
// φ = pos · f_i (frequencies, angles, cos and sin in fp32 as HF computes them):
//   x'[i]         = x[i] cos φ − x[i + rot/2] sin φ
//   x'[i + rot/2] = x[i + rot/2] cos φ + x[i] sin φ
// Dims [rot, dh) are unchanged.
struct RopeArgs {
  float* x = nullptr;
  int64_t T = 0;
  int H = 0;
  int dh = 0;
  int rot = 0;
  double theta = 1e7;
  int64_t pos0 = 0;
};
void rope_apply(const RopeArgs& args);

// Rotate-half rotary on the first `rot` dims with explicit angles per token (the vision encoder's 2D positions;
// M-RoPE): in place on x [T, H, dh], angles [T, rot/2] (φ_i for the pair (i, i + rot/2), the same for every head):
//   x'[i] = x[i] cos φ_i − x[i + rot/2] sin φ_i,   x'[i + rot/2] = x[i + rot/2] cos φ_i + x[i] sin φ_i
// cos and sin in fp32 of the fp32 angle, as HF computes them. Dims [rot, dh) are unchanged.
void rope_apply_angles(float* x, int64_t T, int H, int dh, int rot, const float* angles);

// Interleaved M-RoPE angles (Qwen3.5/3.6's text rotary): angles[t, i] = float(pos[axis(i)][t]) · f_i over the
// rot/2 frequencies f_i of rope_inv_freq, where axis(i) is h for i ≡ 1 (mod 3) and i < 3·section[1], w for
// i ≡ 2 (mod 3) and i < 3·section[2], else t. pos: three arrays of T positions (t, h, w). With the three axes
// equal (text only) this is plain RoPE: rope_apply_angles then equals rope_apply bit for bit.
void mrope_angles(const int64_t* const pos[3], int64_t T, const int section[3], int rot, double theta,
                  float* angles);

// The fp32 inverse frequency f_i = 1 / theta^(2i/rot), computed as HF does (fp32 pow). Shared with CUDA.
float rope_inv_freq(int i, int rot, double theta);

}  // namespace tern::cpu
