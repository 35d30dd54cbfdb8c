// tern bench --speculative --plot (bench_speculative_svg): the computed speed-up the tables and the curves share, and
// the SVG of a report made by hand: well-formed, a verify line per length, a computed curve per k >= 1 (and one with
// the MTP draft cost where it was measured), a marker per end-to-end row of the first length with its figures, and
// never a "nan" or "inf", also for costs of zero or NaN and for an empty report.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "engine/bench_speculative.h"

namespace tern {
namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Every tag closed in order (a stack of names), one root <svg>, the document's last line "</svg>".
void expect_well_formed(const std::string& svg) {
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  ASSERT_GE(svg.size(), 7u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<svg"), 1u);
  EXPECT_EQ(count(svg, "</svg>"), 1u);
  std::vector<std::string> open;
  const std::regex tag("<(/?)([a-zA-Z]+)[^>]*?(/?)>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    if (m[3].length() > 0) continue;  // <x ... />
    if (m[1].length() == 0) {
      open.push_back(m[2]);
    } else {
      ASSERT_FALSE(open.empty()) << "</" << m[2] << "> closes nothing";
      EXPECT_EQ(open.back(), m[2].str()) << "</" << m[2] << "> closes <" << open.back() << ">";
      open.pop_back();
    }
  }
  EXPECT_TRUE(open.empty());
  std::string lower = svg;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  EXPECT_EQ(lower.find("nan"), std::string::npos) << svg;
  EXPECT_EQ(lower.find("inf"), std::string::npos) << svg;
}

SpecEndToEndRow e2e(int k, double a, double tok_s, double speedup, double computed, int64_t accepted,
                    int64_t drafted) {
  SpecEndToEndRow e;
  e.drafts = k;
  e.acceptance = a;
  e.tok_s_median = tok_s;
  e.speedup = speedup;
  e.computed_speedup = computed;
  e.accepted = accepted;
  e.drafted = drafted;
  return e;
}

// Two lengths; verify k = 0..4; the first with MTP draft costs; end to end k = 2 and 4 (and the plain rows).
SpecBenchReport hand_report() {
  SpecBenchReport r;
  r.version = "0.1.0";
  r.backend = "cpu";
  r.device = "Some CPU <x>";
  r.model = "demo";
  r.mtp = true;
  r.options.max_drafts = 4;
  const double verify_ms[] = {2.2, 2.6, 3.0, 3.4, 4.0};
  for (int64_t length : {256, 1024}) {
    SpecBenchPoint p;
    p.length = length;
    const double scale = length == 256 ? 1.0 : 2.0;
    p.plain_ms_median = 2.0 * scale;
    for (int k = 0; k <= 4; ++k) {
      SpecVerifyRow v;
      v.drafts = k;
      v.ms_median = verify_ms[k] * scale;
      v.ratio = v.ms_median / p.plain_ms_median;
      if (length == 256 && k > 0) v.mtp_ms_median = 0.5;
      p.verify.push_back(v);
    }
    p.end_to_end.push_back(e2e(0, 0, 100 / scale, 1.0, 0, 0, 0));
    p.end_to_end.push_back(e2e(2, 0.5, 130 / scale, 1.3, spec_computed_speedup(0.5, 2, p.plain_ms_median,
                                                                                 p.verify[2].ms_median),
                               30, 60));
    p.end_to_end.push_back(e2e(4, 0.9, 210 / scale, 2.1, spec_computed_speedup(0.9, 4, p.plain_ms_median,
                                                                                 p.verify[4].ms_median),
                               55, 64));
    r.points.push_back(p);
  }
  return r;
}

TEST(BenchSpeculativePlot, ComputedSpeedup) {
  const double plain = 2.0, verify = 3.4;
  for (int k : {1, 3, 8}) {
    EXPECT_DOUBLE_EQ(spec_computed_speedup(0.0, k, plain, verify), plain / verify);  // one token a step
    EXPECT_DOUBLE_EQ(spec_computed_speedup(1.0, k, plain, verify), (k + 1) * plain / verify);
    EXPECT_NEAR(spec_computed_speedup(1 - 1e-9, k, plain, verify), (k + 1) * plain / verify, 1e-6);
    EXPECT_NEAR(spec_computed_speedup(0.99, k, plain, verify), spec_tokens_per_step(0.99, k) * plain / verify, 1e-12);
  }
  EXPECT_DOUBLE_EQ(spec_computed_speedup(0.5, 2, plain, 3.0, 0.5), 1.75 * plain / 3.5);  // the draft cost counts
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(spec_computed_speedup(0.5, 2, 0.0, verify), 0.0);
  EXPECT_EQ(spec_computed_speedup(0.5, 2, plain, 0.0), 0.0);
  EXPECT_EQ(spec_computed_speedup(0.5, 2, plain, nan), 0.0);
  EXPECT_EQ(spec_computed_speedup(0.5, 2, plain, inf), 0.0);
  EXPECT_EQ(spec_computed_speedup(0.5, 2, nan, verify), 0.0);
  EXPECT_EQ(spec_computed_speedup(0.5, 2, plain, verify, -1.0), 0.0);
  EXPECT_EQ(spec_computed_speedup(nan, 2, plain, verify), 0.0);
}

TEST(BenchSpeculativePlot, DrawsBothPanels) {
  const SpecBenchReport r = hand_report();
  const std::string svg = bench_speculative_svg(r);
  expect_well_formed(svg);
  EXPECT_NE(svg.find("tern bench --speculative: cpu, Some CPU &lt;x&gt;"), std::string::npos);
  EXPECT_NE(svg.find("demo; tern 0.1.0"), std::string::npos);
  EXPECT_NE(svg.find("forced"), std::string::npos);
  EXPECT_NE(svg.find("controlled condition"), std::string::npos);
  // Left: a verify line per length, each in the legend.
  EXPECT_EQ(count(svg, "<polyline class=\"verify\""), 2u);
  EXPECT_NE(svg.find(">context 256<"), std::string::npos);
  EXPECT_NE(svg.find(">context 1K<"), std::string::npos);
  // Right, the first length only: a computed curve per k = 1..4, verify alone and with the MTP draft cost.
  EXPECT_EQ(count(svg, "<polyline class=\"computed\""), 4u);
  EXPECT_EQ(count(svg, "<polyline class=\"computed-mtp\""), 4u);
  EXPECT_EQ(count(svg, "<polyline"), 10u);
  EXPECT_NE(svg.find("speed-up against acceptance, context 256"), std::string::npos);
  for (int k = 1; k <= 4; ++k) EXPECT_NE(svg.find(">k = " + std::to_string(k) + "<"), std::string::npos) << k;
  // k = 3: plain 2 ms, verify 3.4 ms: 2 / 3.4 = 0.59x at p = 0, 4 x 2 / 3.4 = 2.35x at p = 1; with 0.5 ms of drafts
  // 2 / 3.9 = 0.51x and 8 / 3.9 = 2.05x.
  EXPECT_NE(svg.find("k = 3, computed from verify 3.400 ms (plain step 2.000 ms): 0.59x at p = 0, 2.35x at p = 1"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find("k = 3, computed from verify 3.400 ms + MTP draft 0.500 ms (plain step 2.000 ms): 0.51x at "
                     "p = 0, 2.05x at p = 1"),
            std::string::npos)
      << svg;
  // A computed curve has 101 points (p = 0, 0.01, ..., 1).
  const size_t at = svg.find("<polyline class=\"computed\"");
  const std::string curve = svg.substr(at, svg.find("\">", at) - at);
  EXPECT_EQ(count(curve, ","), 101u) << curve;
  // A marker per end-to-end row with drafts of the first length, with its figures: 1.75 x 2 / 3 = 1.17x computed.
  EXPECT_EQ(count(svg, "<circle class=\"measured\""), 2u);
  EXPECT_NE(svg.find("k = 2 at forced acceptance 0.50: measured 1.30x (130.0 tok/s), computed 1.17x; 30 of 60 "
                     "drafts accepted"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find("k = 4 at forced acceptance 0.90: measured 2.10x (210.0 tok/s)"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("(105.0 tok/s)"), std::string::npos);  // the second length's rows are not drawn
}

TEST(BenchSpeculativePlot, WithoutTheHeadNoDraftCostCurves) {
  SpecBenchReport r = hand_report();
  for (SpecBenchPoint& p : r.points)
    for (SpecVerifyRow& v : p.verify) v.mtp_ms_median = 0;
  const std::string svg = bench_speculative_svg(r);
  expect_well_formed(svg);
  EXPECT_EQ(count(svg, "<polyline class=\"computed\""), 4u);
  EXPECT_EQ(count(svg, "computed-mtp"), 0u);
  EXPECT_EQ(svg.find("MTP draft"), std::string::npos);
}

TEST(BenchSpeculativePlot, ManyDraftCounts) {
  SpecBenchReport r = hand_report();
  r.points.resize(1);
  SpecBenchPoint& p = r.points[0];
  for (int k = 5; k <= 16; ++k) {
    SpecVerifyRow v;
    v.drafts = k;
    v.ms_median = 4.0 + 0.3 * k;
    p.verify.push_back(v);
  }
  const std::string svg = bench_speculative_svg(r);
  expect_well_formed(svg);
  EXPECT_EQ(count(svg, "<polyline class=\"computed\""), 16u);
  EXPECT_NE(svg.find(">k = 16<"), std::string::npos);
}

TEST(BenchSpeculativePlot, BadCostsAndEmptyReport) {
  // Nothing measured: empty axes.
  SpecBenchReport empty;
  std::string svg = bench_speculative_svg(empty);
  expect_well_formed(svg);
  EXPECT_EQ(count(svg, "<polyline"), 0u);
  EXPECT_EQ(count(svg, "<circle class=\"measured\""), 0u);
  EXPECT_NE(svg.find("verify cost"), std::string::npos);
  EXPECT_NE(svg.find("speed-up against acceptance"), std::string::npos);

  // A plain step of 0 ms, verify costs of NaN, infinity and 0, end-to-end figures of NaN: no line, no "nan".
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  SpecBenchReport r = hand_report();
  r.points[0].plain_ms_median = 0;
  r.points[1].verify[1].ms_median = nan;
  r.points[1].verify[2].ms_median = inf;
  r.points[1].verify[3].ms_median = 0;
  r.points[0].end_to_end[1].speedup = nan;
  r.points[0].end_to_end[2].computed_speedup = nan;
  r.points[0].end_to_end[2].tok_s_median = inf;
  svg = bench_speculative_svg(r);
  expect_well_formed(svg);
  EXPECT_EQ(count(svg, "<polyline class=\"verify\""), 1u);  // the second length's, without k = 1..3
  EXPECT_EQ(count(svg, "<polyline class=\"computed"), 0u);  // the first length's costs are unusable
  EXPECT_EQ(count(svg, "<circle class=\"measured\""), 1u);
  EXPECT_NE(svg.find("measured 2.10x (0.0 tok/s), computed -;"), std::string::npos) << svg;

  // Costs near the largest double: ratios and speed-ups that overflow, axes that must stay finite.
  r = hand_report();
  r.points[0].plain_ms_median = 1.7e308;
  r.points[0].verify[1].ms_median = 1.0;
  r.points[1].verify[1].ms_median = 1e-300;
  expect_well_formed(bench_speculative_svg(r));
}

}  // namespace
}  // namespace tern
