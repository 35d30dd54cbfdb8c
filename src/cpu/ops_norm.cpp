#include "cpu/ops_norm.h"

#include <cmath>

#include "cpu/ops_elementwise.h"

namespace tern::cpu {
namespace {

// Σx² over d values, in double so that the sum does not depend on an accumulation order worth tuning.
double sum_squares(const float* x, int64_t d) {
  double s = 0.0;
  for (int64_t i = 0; i < d; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

}  // namespace

void rms_norm(const float* x, const float* w, int64_t n, int64_t d, float eps, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    const float inv = float(1.0 / std::sqrt(sum_squares(xr, d) / double(d) + double(eps)));
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * inv) * w[i];
  }
}

void gated_rms_norm(const float* x, const float* z, const float* w, int64_t n, int64_t d, float eps, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    const float* zr = z + r * d;
    float* yr = y + r * d;
    const float inv = float(1.0 / std::sqrt(sum_squares(xr, d) / double(d) + double(eps)));
    for (int64_t i = 0; i < d; ++i) yr[i] = ((xr[i] * inv) * w[i]) * silu(zr[i]);
  }
}

void layer_norm(const float* x, const float* w, const float* b, int64_t n, int64_t d, float eps, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += xr[i];
    const double mean = sum / double(d);
    double var = 0.0;
    for (int64_t i = 0; i < d; ++i) var += (double(xr[i]) - mean) * (double(xr[i]) - mean);
    const double inv = 1.0 / std::sqrt(var / double(d) + double(eps));
    for (int64_t i = 0; i < d; ++i) yr[i] = float((double(xr[i]) - mean) * inv) * w[i] + b[i];
  }
}

void l2_norm(const float* x, int64_t n, int64_t d, float eps, float scale, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    const float inv = float(1.0 / std::sqrt(sum_squares(xr, d) + double(eps))) * scale;
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * inv;
  }
}

}  // namespace tern::cpu
