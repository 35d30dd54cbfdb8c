// tern bench --plot: an SVG of prefill and decode tok/s against context length, both axes logarithmic, that any
// browser opens. Plain SVG 1.1, no script, no external resources.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/bench_run.h"
#include "engine/bench_svg_util.h"

namespace tern {

namespace {

struct Series {
  const char* name;
  const char* color;
  std::vector<std::pair<double, double>> points;  // (length, tok/s)
};

}  // namespace

std::string bench_svg(const BenchReport& r) {
  const double W = 860, H = 520, left = 90, right = 200, top = 60, bottom = 70;
  const double pw = W - left - right, ph = H - top - bottom;
  Series prefill{"prefill", "#1f77b4", {}}, decode{"decode", "#d62728", {}};
  for (const BenchPoint& p : r.points) {
    if (p.prefill_tok_s > 0) prefill.points.push_back({double(p.length), p.prefill_tok_s});
    if (p.decode_tok_s > 0) decode.points.push_back({double(p.length), p.decode_tok_s});
  }
  double xmin = 1e300, xmax = 0, ymin = 1e300, ymax = 0;
  for (const Series* s : {&prefill, &decode})
    for (auto [x, y] : s->points) {
      xmin = std::min(xmin, x), xmax = std::max(xmax, x);
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  if (xmax <= 0) xmin = 256, xmax = 131072, ymin = 1, ymax = 10;  // nothing measured: empty axes
  // x: log2, half an octave of margin; y: whole decades.
  const double lx0 = std::log2(xmin) - 0.5, lx1 = std::log2(xmax) + 0.5;
  const double ly0 = std::floor(std::log10(ymin)), ly1 = std::max(ly0 + 1, std::ceil(std::log10(ymax)));
  auto X = [&](double x) { return left + (std::log2(x) - lx0) / (lx1 - lx0) * pw; };
  auto Y = [&](double y) { return top + ph - (std::log10(y) - ly0) / (ly1 - ly0) * ph; };

  std::string s;
  char buf[512];
  s += svg_open(W, H, left, "tern bench: " + r.backend + ", " + r.device,
                r.model + (r.version.empty() ? "" : "; tern " + r.version));

  // Grid and y labels: decades, with faint lines at 2x and 5x.
  for (int d = int(ly0); d <= int(ly1); ++d) {
    for (int m : {1, 2, 5}) {
      const double v = double(m) * std::pow(10.0, d);
      if (std::log10(v) > ly1 + 1e-9) continue;
      const double y = Y(v);
      std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", left,
                    y, left + pw, y, m == 1 ? "#ccc" : "#eee");
      s += buf;
      if (m == 1) {
        std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", left - 8,
                      y + 4, rate_label(v).c_str());
        s += buf;
      }
    }
  }
  // x ticks at every power of two in range, labelled.
  for (int e = int(std::ceil(lx0)); e <= int(std::floor(lx1)); ++e) {
    const double x = X(std::exp2(e));
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                  x, top, x, top + ph, x, top + ph + 20, bench_length_label(int64_t(std::exp2(e))).c_str());
    s += buf;
  }
  std::snprintf(buf, sizeof buf,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">context length, tokens (log scale)</text>\n"
                "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">tokens / s (log "
                "scale)</text>\n",
                left, top, pw, ph, left + pw / 2, H - 20, 24.0, top + ph / 2);
  s += buf;

  double legend_y = top + 20;
  for (const Series* ser : {&prefill, &decode}) {
    if (!ser->points.empty()) {
      std::string pts;
      for (auto [x, y] : ser->points) {
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X(x), Y(y));
        pts += buf;
      }
      s += "<polyline fill=\"none\" stroke=\"" + std::string(ser->color) + "\" stroke-width=\"2\" points=\"" + pts +
           "\"/>\n";
      for (auto [x, y] : ser->points) {
        std::snprintf(buf, sizeof buf,
                      "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"><title>%s %s: %.1f tok/s</title>"
                      "</circle>\n",
                      X(x), Y(y), ser->color, ser->name, bench_length_label(int64_t(x)).c_str(), y);
        s += buf;
      }
    }
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\">%s tok/s</text>\n",
                  left + pw + 16, legend_y, left + pw + 46, legend_y, ser->color, left + pw + 54, legend_y + 4,
                  ser->name);
    s += buf;
    legend_y += 24;
  }
  s += "</svg>\n";
  return s;
}

}  // namespace tern
