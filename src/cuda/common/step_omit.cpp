// TERN_STEP_OMIT: see step_omit.h.
#include "cuda/common/step_omit.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/check.h"

namespace tern::cuda {
namespace {

struct PartName {
  std::string_view name;
  StepPart part;
};
constexpr PartName kParts[] = {
    {"in", StepPart::in},         {"gdn", StepPart::gdn},         {"attention", StepPart::attention},
    {"out", StepPart::out},       {"router", StepPart::router},   {"gate_up", StepPart::gate_up},
    {"down", StepPart::down},     {"head", StepPart::head},       {"prequant", StepPart::prequant},
    {"kept", StepPart::kept},
};

}  // namespace

unsigned step_omit_parse(std::string_view list) {
  unsigned mask = 0;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view name = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (name.empty()) continue;
    bool known = false;
    for (const PartName& p : kParts)
      if (p.name == name) {
        mask |= unsigned(p.part);
        known = true;
      }
    TERN_CHECK(known, "TERN_STEP_OMIT: unknown part '", std::string(name),
               "' (parts: in, gdn, attention, out, router, gate_up, down, head, prequant, kept)");
  }
  return mask;
}

namespace {

unsigned omitted_parts() {
  static const unsigned mask = [] {
    const char* e = std::getenv("TERN_STEP_OMIT");
    const unsigned m = e ? step_omit_parse(e) : 0u;
    if (m != 0)
      std::fprintf(stderr,
                   "tern: TERN_STEP_OMIT=%s: these kernels are left out of every step; every value computed is "
                   "wrong (a timing diagnostic)\n",
                   e);
    return m;
  }();
  return mask;
}

}  // namespace

bool step_omits(StepPart part) { return (omitted_parts() & unsigned(part)) != 0; }

std::vector<int> step_omit_routing(int T, int E, int k) {
  TERN_CHECK(T >= 0 && k >= 1 && k <= E, "step_omit_routing: ", k, " of ", E, " experts");
  std::vector<int> ids;
  ids.reserve(size_t(T) * size_t(k));
  uint64_t x = 0x9e3779b97f4a7c15ull;  // xorshift64
  for (int t = 0; t < T; ++t) {
    const size_t first = ids.size();
    while (ids.size() - first < size_t(k)) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const int e = int(x % uint64_t(E));
      if (std::find(ids.begin() + std::ptrdiff_t(first), ids.end(), e) == ids.end()) ids.push_back(e);
    }
  }
  return ids;
}

}  // namespace tern::cuda
