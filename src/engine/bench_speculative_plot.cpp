// tern bench --speculative --plot: an SVG of two panels side by side, that any browser opens (bench_speculative.h).
//   left:  verify cost: x = drafts k (0..max), y = verify ms / plain step ms, one line per context length, a dashed
//          line at 1 (the plain step);
//   right: speed-up against acceptance: x = per-draft acceptance p in [0, 1], y = speed-up over the plain step. Per
//          k >= 1 of the verify table, the computed speed-up (spec_computed_speedup, the function the tables use) at
//          p = 0, 0.01, ..., 1 (p = 1: k + 1 tokens a step), from the verify cost alone (solid: what the end-to-end
//          runs' free drafter costs) and, where the MTP head's draft cost was measured, with it (dotted); the
//          measured end-to-end rows (k >= 1) as filled markers in their k's colour, with the figures as a tooltip;
//          a dashed line at 1 (no gain). The right panel shows the first context length only (the report's first
//          point; the others are in the tables and the JSON): one set of curves per length would be unreadable.
// Plain SVG 1.1, no script, no external resources; nothing measured gives empty axes. Every number written is finite:
// costs that are zero, negative or not finite leave their line or marker out.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/bench_format.h"
#include "engine/bench_run.h"
#include "engine/bench_speculative.h"
#include "engine/bench_svg_util.h"

namespace tern {

namespace {

// matplotlib's tab10: one colour per length (left) or per draft count (right), cycled past ten.
const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
const char* color(size_t i) { return kColors[i % (sizeof kColors / sizeof kColors[0])]; }

bool usable(double v) { return std::isfinite(v) && v > 0; }

// A tick step of 1, 2 or 5 x 10^n that cuts [0, top] into about `ticks` parts (top > 0).
double nice_step(double top, int ticks) {
  const double raw = top / ticks, mag = std::pow(10.0, std::floor(std::log10(raw))), norm = raw / mag;
  return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
}

// A linear panel: data [0, x1] x [0, y1] onto the pixel box (left, top, w, h).
struct Panel {
  double left, top, w, h, x1, y1;
  double X(double x) const { return left + std::clamp(x / x1, 0.0, 1.0) * w; }
  double Y(double y) const { return top + h - std::clamp(y / y1, 0.0, 1.0) * h; }
};

// The frame, the grid with labelled ticks every x_step / y_step (x labels with x_digits decimals), the axis titles
// and the panel's title above it.
std::string frame(const Panel& p, double x_step, double y_step, int x_digits, const std::string& title,
                  const std::string& x_title, const std::string& y_title) {
  std::string s;
  for (int i = 0; i * y_step <= p.y1 * (1 + 1e-9); ++i) {
    const double v = i * y_step, y = p.Y(v);
    s += bench_format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", p.left, y,
                      p.left + p.w, y);
    s += bench_format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", p.left - 6, y + 4,
                      rate_label(v).c_str());
  }
  for (int i = 0; i * x_step <= p.x1 * (1 + 1e-9); ++i) {
    const double v = i * x_step, x = p.X(v);
    s += bench_format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#f0f0f0\"/>\n", x, p.top, x,
                      p.top + p.h);
    s += bench_format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", x, p.top + p.h + 18);
    s += bench_format("%.*f", x_digits, v) + "</text>\n";
  }
  s += bench_format("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n",
                    p.left, p.top, p.w, p.h);
  s += bench_format("<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">", p.left, p.top - 10) + xml_escape(title) +
       "</text>\n";
  s += bench_format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", p.left + p.w / 2, p.top + p.h + 40) +
       xml_escape(x_title) + "</text>\n";
  s += bench_format("<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">", p.left - 42,
                    p.top + p.h / 2) +
       xml_escape(y_title) + "</text>\n";
  return s;
}

// A dashed grey line across the panel at y = 1, labelled at its right end.
std::string reference_line(const Panel& p, const char* label) {
  const double y = p.Y(1.0);
  return bench_format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\" "
                      "stroke-dasharray=\"6 4\"/>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555\" "
                      "font-size=\"11\">%s</text>\n",
                      p.left, y, p.left + p.w, y, p.left + p.w - 4, y - 4, label);
}

// (x, y) data points as a polyline's points attribute, in pixels.
std::string points_attr(const Panel& p, const std::vector<std::pair<double, double>>& xy) {
  std::string pts;
  for (auto [x, y] : xy) pts += bench_format("%.1f,%.1f ", p.X(x), p.Y(y));
  if (!pts.empty()) pts.pop_back();
  return pts;
}

// One legend entry at (x, y): a short line in the colour (dash: its stroke-dasharray, or empty), then the label.
std::string legend_entry(double x, double y, const char* colour, const char* dash, double width,
                         const std::string& label) {
  std::string s =
      bench_format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%g\"", x, y,
                   x + 22, y, colour, width);
  if (*dash) s += bench_format(" stroke-dasharray=\"%s\"", dash);
  return s + "/>\n" + bench_format("<text x=\"%.1f\" y=\"%.1f\">", x + 28, y + 4) + xml_escape(label) + "</text>\n";
}

}  // namespace

std::string bench_speculative_svg(const SpecBenchReport& r) {
  const double W = 1160, H = 600, top = 84, ph = 356;
  std::string s = svg_open(W, H, 70, "tern bench --speculative: " + r.backend + ", " + r.device,
                           r.model + (r.version.empty() ? "" : "; tern " + r.version));

  // ---- left: verify ms / plain step ms against k, one line per length ----
  int k_max = 1;
  double ratio_max = 1;
  std::vector<std::vector<std::pair<double, double>>> ratios;  // per point: (k, verify ms / plain ms)
  for (const SpecBenchPoint& pt : r.points) {
    ratios.emplace_back();
    if (!usable(pt.plain_ms_median)) continue;
    for (const SpecVerifyRow& v : pt.verify) {
      const double ratio = v.ms_median / pt.plain_ms_median;
      if (v.drafts < 0 || !usable(ratio)) continue;
      ratios.back().push_back({double(v.drafts), ratio});
      k_max = std::max(k_max, v.drafts);
      ratio_max = std::max(ratio_max, ratio);
    }
  }
  if (r.points.empty()) k_max = std::max(1, r.options.max_drafts);
  ratio_max = std::min(ratio_max, 1e9);  // absurd costs: the axis stays finite (the panel clips what is above it)
  const double k_step = std::max(1.0, std::round(nice_step(double(k_max), 8)));
  const double ratio_step = nice_step(ratio_max * 1.05, 6);
  const Panel left{70, top, 330, ph, std::ceil(double(k_max) / k_step) * k_step,
                   std::ceil(ratio_max * 1.05 / ratio_step) * ratio_step};
  s += frame(left, k_step, ratio_step, 0, "verify cost: k + 1 tokens, then rollback",
             "drafts k (the step verifies k + 1 tokens)", "verify ms / plain step ms");
  s += reference_line(left, "plain step");
  double legend_y = top + 12;
  for (size_t i = 0; i < r.points.size(); ++i) {
    const std::string label = "context " + bench_length_label(r.points[i].length);
    if (!ratios[i].empty()) {
      s += bench_format("<polyline class=\"verify\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                        color(i)) +
           points_attr(left, ratios[i]) + "\"/>\n";
      for (auto [k, ratio] : ratios[i])
        s += bench_format("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>%s, k = %.0f: %.2fx the plain "
                          "step</title></circle>\n",
                          left.X(k), left.Y(ratio), color(i), label.c_str(), k, ratio);
    }
    s += legend_entry(left.left + left.w + 14, legend_y, color(i), "", 3, label);
    legend_y += 20;
  }

  // ---- right: the speed-up against acceptance at the first length ----
  const SpecBenchPoint* pt = r.points.empty() ? nullptr : &r.points.front();
  struct Curve {
    const SpecVerifyRow* v;                        // its draft count and costs
    bool with_draft;                               // verify + the MTP head's draft cost (else the verify alone)
    std::vector<std::pair<double, double>> xy;     // (p, speed-up)
  };
  std::vector<Curve> curves;
  std::vector<int> ks;  // the draft counts drawn, ascending: their colours
  double speedup_max = 1;
  if (pt) {
    for (const SpecVerifyRow& v : pt->verify) {
      if (v.drafts < 1) continue;
      for (bool with_draft : {false, true}) {
        if (with_draft && !usable(v.mtp_ms_median)) continue;
        Curve c{&v, with_draft, {}};
        for (int i = 0; i <= 100; ++i) {
          const double p = i / 100.0;
          const double y = spec_computed_speedup(p, v.drafts, pt->plain_ms_median, v.ms_median,
                                                 with_draft ? v.mtp_ms_median : 0.0);
          if (!usable(y)) break;  // a cost it cannot use: no curve
          c.xy.push_back({p, y});
          speedup_max = std::max(speedup_max, y);
        }
        if (c.xy.size() < 101) continue;
        if (std::find(ks.begin(), ks.end(), v.drafts) == ks.end()) ks.push_back(v.drafts);
        curves.push_back(std::move(c));
      }
    }
    for (const SpecEndToEndRow& e : pt->end_to_end) {
      if (e.drafts < 1 || !std::isfinite(e.speedup) || e.speedup < 0 || !std::isfinite(e.acceptance)) continue;
      speedup_max = std::max(speedup_max, e.speedup);
      if (std::find(ks.begin(), ks.end(), e.drafts) == ks.end()) ks.push_back(e.drafts);
    }
  }
  std::sort(ks.begin(), ks.end());
  speedup_max = std::min(speedup_max, 1e9);
  auto k_color = [&](int k) { return color(size_t(std::find(ks.begin(), ks.end(), k) - ks.begin())); };
  const double speedup_step = nice_step(speedup_max * 1.05, 6);
  const Panel right{650, top, 340, ph, 1.0, std::ceil(speedup_max * 1.05 / speedup_step) * speedup_step};
  // The acceptance published for Qwen3.6's MTP head (llama.cpp, 3-4 drafts), shaded behind the curves.
  const double band0 = right.X(kPublishedMtpAcceptance[0]), band1 = right.X(kPublishedMtpAcceptance[2]);
  s += bench_format("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f4f4f4\"><title>per-draft "
                    "acceptance published for Qwen3.6's MTP head (llama.cpp, 3-4 drafts): %.2f-%.2f</title></rect>\n",
                    band0, right.top, band1 - band0, right.h, kPublishedMtpAcceptance[0], kPublishedMtpAcceptance[2]);
  s += frame(right, 0.1, speedup_step, 1,
             "speed-up against acceptance" + (pt ? ", context " + bench_length_label(pt->length) : std::string()) +
                 (r.points.size() > 1 ? bench_format(" (the first of %zu)", r.points.size()) : std::string()),
             "per-draft acceptance p", "speed-up over the plain step");
  s += bench_format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#777\" font-size=\"11\">published "
                    "MTP</text>\n",
                    (band0 + band1) / 2, right.top + 14);
  s += reference_line(right, "no gain");
  for (const Curve& c : curves) {
    const SpecVerifyRow& v = *c.v;
    s += bench_format("<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"",
                      c.with_draft ? "computed-mtp" : "computed", k_color(v.drafts),
                      c.with_draft ? " stroke-dasharray=\"2 3\"" : "") +
         points_attr(right, c.xy) + "\">";
    s += bench_format("<title>k = %d, computed from verify %.3f ms", v.drafts, v.ms_median);
    if (c.with_draft) s += bench_format(" + MTP draft %.3f ms", v.mtp_ms_median);
    s += bench_format(" (plain step %.3f ms): %.2fx at p = 0, %.2fx at p = 1</title></polyline>\n",
                      pt->plain_ms_median, c.xy.front().second, c.xy.back().second);
  }
  if (pt) {
    for (const SpecEndToEndRow& e : pt->end_to_end) {
      if (e.drafts < 1 || !std::isfinite(e.speedup) || e.speedup < 0 || !std::isfinite(e.acceptance)) continue;
      const std::string computed = usable(e.computed_speedup) ? bench_format("%.2fx", e.computed_speedup) : "-";
      s += bench_format("<circle class=\"measured\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\" stroke=\"#222\" "
                        "stroke-width=\"0.8\"><title>k = %d at forced acceptance %.2f: measured %.2fx (%.1f tok/s), "
                        "computed %s; %lld of %lld drafts accepted</title></circle>\n",
                        right.X(e.acceptance), right.Y(e.speedup), k_color(e.drafts), e.drafts, e.acceptance,
                        e.speedup, std::isfinite(e.tok_s_median) ? e.tok_s_median : 0.0, computed.c_str(),
                        (long long)e.accepted, (long long)e.drafted);
    }
  }
  // The draft counts' colours at the right of the panel (two columns past ten), the line styles below it.
  const int cols = ks.size() > 10 ? 2 : 1;
  const size_t rows = (ks.size() + size_t(cols) - 1) / size_t(cols);
  for (size_t i = 0; i < ks.size(); ++i)
    s += legend_entry(right.left + right.w + 14 + double(i / rows) * 76, top + 12 + double(i % rows) * 20,
                      k_color(ks[i]), "", 3, bench_format("k = %d", ks[i]));
  const double key_y = top + ph + 66;
  s += legend_entry(right.left, key_y, "#333", "", 1.5, "computed: verify cost");
  if (std::any_of(curves.begin(), curves.end(), [](const Curve& c) { return c.with_draft; }))
    s += legend_entry(right.left + 190, key_y, "#333", "2 3", 1.5, "computed: verify + MTP draft");
  s += bench_format("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#999\" stroke=\"#222\" stroke-width=\"0.8\"/>\n"
                    "<text x=\"%.1f\" y=\"%.1f\">measured end to end</text>\n",
                    right.left + 11, key_y + 20, right.left + 28, key_y + 24);

  // Caption: what the markers are.
  s += bench_format("<text x=\"70\" y=\"%.1f\" fill=\"#555\">", H - 34) +
       xml_escape("Markers: measured end to end; the drafts are the reference's next tokens, each right with a forced "
                  "probability p (a controlled condition, not a real drafter).") +
       "</text>\n";
  s += bench_format("<text x=\"70\" y=\"%.1f\" fill=\"#555\">", H - 16) +
       xml_escape("Lines: computed from the measured costs, (1 - p^(k+1)) / (1 - p) tokens a step x plain step ms / "
                  "step ms. " + bench_format("Medians of %d run(s).", r.options.repeats)) +
       "</text>\n";
  s += "</svg>\n";
  return s;
}

}  // namespace tern
