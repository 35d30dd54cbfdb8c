#include "engine/bench_svg_util.h"

#include <cstdio>

namespace tern {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += (static_cast<unsigned char>(c) < 0x20 && c != '\n') ? ' ' : c;
    }
  }
  return out;
}

std::string rate_label(double v) {
  char buf[32];
  if (v >= 1e6) std::snprintf(buf, sizeof buf, "%gM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%gK", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string svg_open(double width, double height, double left, const std::string& title,
                     const std::string& subtitle) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                "font-family=\"sans-serif\" font-size=\"13\">\n",
                width, height, width, height);
  s += buf;
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"28\" font-size=\"16\" font-weight=\"bold\">", left);
  s += buf + xml_escape(title) + "</text>\n";
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"46\" fill=\"#555\">", left);
  s += buf + xml_escape(subtitle) + "</text>\n";
  return s;
}

}  // namespace tern
