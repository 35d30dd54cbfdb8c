// Pieces the tern bench SVG plots share (bench_plot.cpp: tok/s by length; bench_speculative_plot.cpp: verify cost
// and speed-up against acceptance). Plain SVG 1.1: no script, no external resources.
#pragma once

#include <string>

namespace tern {

// s as SVG text or an attribute value: & < > " escaped, control characters but newline as spaces.
std::string xml_escape(const std::string& s);
// 1500 -> "1.5K", 2e6 -> "2M", 12 -> "12".
std::string rate_label(double v);
// The document's opening: the <svg> element (width x height px, sans-serif 13), a white background, the title line
// (bold) and the subtitle (grey) at x = left.
std::string svg_open(double width, double height, double left, const std::string& title,
                     const std::string& subtitle);

}  // namespace tern
