#include "grammar/regex.h"

#include <string>
#include <vector>

namespace tern::grammar {

namespace {

constexpr int kMaxRegexDepth = 64;
constexpr size_t kMaxPatternCodepoints = 10000;

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    uint8_t c = static_cast<uint8_t>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + static_cast<size_t>(n) > s.size()) throw RegexError("the pattern is not valid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < n; ++k) {
      uint8_t d = static_cast<uint8_t>(s[i + static_cast<size_t>(k)]);
      if ((d & 0xC0) != 0x80) throw RegexError("the pattern is not valid UTF-8");
      cp = (cp << 6) | (d & 0x3Fu);
    }
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

CodepointClass single(uint32_t cp) { return {{cp, cp}}; }
CodepointClass digit_class() { return {{'0', '9'}}; }
CodepointClass word_class() { return cp_normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}); }
CodepointClass space_class() {
  return cp_normalize({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                       {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
}
CodepointClass dot_class() { return cp_complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}); }

std::string describe(uint32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return "'" + s + "'";
}

class Parser {
 public:
  Parser(std::vector<uint32_t> cps, const std::function<ExprPtr(const CodepointClass&)>& encode)
      : p_(std::move(cps)), encode_(encode) {}

  ExprPtr parse() {
    ExprPtr e = alternation(0);
    if (pos_ < p_.size()) throw RegexError("unbalanced ')' at position " + std::to_string(pos_));
    return e;
  }

 private:
  bool at_end() const { return pos_ >= p_.size(); }
  uint32_t peek() const { return p_[pos_]; }

  ExprPtr alternation(int depth) {
    if (depth > kMaxRegexDepth) throw RegexError("groups nested too deeply");
    std::vector<ExprPtr> alts{sequence(depth)};
    while (!at_end() && peek() == '|') {
      ++pos_;
      alts.push_back(sequence(depth));
    }
    return expr_alt(std::move(alts));
  }

  ExprPtr sequence(int depth) {
    std::vector<ExprPtr> items;
    while (!at_end() && peek() != '|' && peek() != ')') {
      uint32_t c = peek();
      if (c == '^') {
        if (depth != 0 || !items.empty()) throw RegexError("'^' is supported only at the start of the pattern");
        ++pos_;
        continue;
      }
      if (c == '$') {
        ++pos_;
        if (depth != 0 || (!at_end() && peek() != '|')) throw RegexError("'$' is supported only at the end of the pattern");
        continue;
      }
      ExprPtr atom_expr = atom(depth);
      items.push_back(quantified(std::move(atom_expr)));
    }
    return expr_seq(std::move(items));
  }

  bool parse_int(int& out) {
    size_t start = pos_;
    long v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<long>(peek() - '0');
      if (v > 1000000) v = 1000000;
      ++pos_;
    }
    out = static_cast<int>(v);
    return pos_ > start;
  }

  ExprPtr quantified(ExprPtr a) {
    if (at_end()) return a;
    int min = 0, max = 0;
    uint32_t c = peek();
    if (c == '*') {
      min = 0, max = -1, ++pos_;
    } else if (c == '+') {
      min = 1, max = -1, ++pos_;
    } else if (c == '?') {
      min = 0, max = 1, ++pos_;
    } else if (c == '{') {
      size_t save = pos_;
      ++pos_;
      if (!parse_int(min)) {  // not a quantifier: '{' stands for itself (atom() handles it next time)
        pos_ = save;
        return a;
      }
      max = min;
      if (!at_end() && peek() == ',') {
        ++pos_;
        if (!parse_int(max)) max = -1;
      }
      if (at_end() || peek() != '}') throw RegexError("unterminated quantifier {n,m}");
      ++pos_;
      if (max >= 0 && max < min) throw RegexError("quantifier {" + std::to_string(min) + "," + std::to_string(max) + "} has max < min");
      if (min > kMaxRepeat || max > kMaxRepeat)
        throw RegexError("quantifier bound above the supported " + std::to_string(kMaxRepeat));
    } else {
      return a;
    }
    if (!at_end() && peek() == '?') ++pos_;  // lazy: the same language
    if (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?'))
      throw RegexError("nothing to repeat at position " + std::to_string(pos_));
    return expr_repeat(std::move(a), min, max);
  }

  ExprPtr atom(int depth) {
    uint32_t c = p_[pos_++];
    switch (c) {
      case '(': {
        if (!at_end() && peek() == '?') {
          if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
            pos_ += 2;
          } else {
            throw RegexError("lookaround and named groups '(?' are not supported");
          }
        }
        ExprPtr e = alternation(depth + 1);
        if (at_end() || peek() != ')') throw RegexError("missing ')'");
        ++pos_;
        return e;
      }
      case '[':
        return encode_(char_class());
      case '.':
        return encode_(dot_class());
      case '\\':
        return encode_(escape(false));
      case '*':
      case '+':
      case '?':
        throw RegexError("nothing to repeat at position " + std::to_string(pos_ - 1));
      default:
        return encode_(single(c));
    }
  }

  uint32_t hex_digits(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (at_end()) throw RegexError("incomplete hex escape");
      uint32_t c = p_[pos_++];
      int d = (c >= '0' && c <= '9') ? static_cast<int>(c - '0') : (c >= 'a' && c <= 'f') ? static_cast<int>(c - 'a' + 10)
            : (c >= 'A' && c <= 'F') ? static_cast<int>(c - 'A' + 10) : -1;
      if (d < 0) throw RegexError("bad hex digit in escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  // After a backslash. in_class: inside [...] (where \b is a backspace).
  CodepointClass escape(bool in_class) {
    if (at_end()) throw RegexError("the pattern ends with '\\'");
    uint32_t c = p_[pos_++];
    switch (c) {
      case 'd': return digit_class();
      case 'D': return cp_complement(digit_class());
      case 'w': return word_class();
      case 'W': return cp_complement(word_class());
      case 's': return space_class();
      case 'S': return cp_complement(space_class());
      case 'n': return single('\n');
      case 'r': return single('\r');
      case 't': return single('\t');
      case 'f': return single('\f');
      case 'v': return single('\v');
      case '0': return single(0);
      case 'x': return single(hex_digits(2));
      case 'u': {
        if (!at_end() && peek() == '{') {
          ++pos_;
          uint32_t v = 0;
          int n = 0;
          while (!at_end() && peek() != '}') {
            v = v * 16 + hex_digits(1);
            if (++n > 6) throw RegexError("bad \\u{...} escape");
          }
          if (at_end() || n == 0) throw RegexError("bad \\u{...} escape");
          ++pos_;
          return single(v);
        }
        return single(hex_digits(4));
      }
      case 'b':
        if (in_class) return single('\b');
        throw RegexError("word boundaries (\\b) are not supported");
      default:
        if ((c >= '1' && c <= '9') || c == 'k') throw RegexError("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
          throw RegexError("unknown escape \\" + std::string(1, static_cast<char>(c)));
        return single(c);  // an escaped punctuation character (or any other) stands for itself
    }
  }

  CodepointClass char_class() {
    bool negate = false;
    if (!at_end() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodepointClass cls;
    for (;;) {
      if (at_end()) throw RegexError("missing ']'");
      if (peek() == ']') {
        ++pos_;
        break;
      }
      // One item: a character, an escape (possibly a whole class), maybe the start of a range.
      auto item = [&](bool& is_single, uint32_t& cp) -> CodepointClass {
        uint32_t c = p_[pos_++];
        if (c == '\\') {
          CodepointClass e = escape(true);
          is_single = e.size() == 1 && e[0].lo == e[0].hi;
          cp = is_single ? e[0].lo : 0;
          return e;
        }
        is_single = true;
        cp = c;
        return single(c);
      };
      bool s1 = false;
      uint32_t lo = 0;
      CodepointClass first = item(s1, lo);
      if (s1 && pos_ + 1 < p_.size() && peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        bool s2 = false;
        uint32_t hi = 0;
        item(s2, hi);
        if (!s2) throw RegexError("a class range ends in a class escape");
        if (hi < lo) throw RegexError("class range " + describe(lo) + "-" + describe(hi) + " is out of order");
        cls.push_back({lo, hi});
      } else {
        cls.insert(cls.end(), first.begin(), first.end());
      }
    }
    cls = cp_normalize(cls);
    return negate ? cp_complement(cls) : cls;
  }

  std::vector<uint32_t> p_;
  size_t pos_ = 0;
  const std::function<ExprPtr(const CodepointClass&)>& encode_;
};

}  // namespace

ExprPtr compile_regex(std::string_view pattern, const std::function<ExprPtr(const CodepointClass&)>& encode_class) {
  std::vector<uint32_t> cps = decode_utf8(pattern);
  if (cps.size() > kMaxPatternCodepoints) throw RegexError("the pattern is too long");
  return Parser(std::move(cps), encode_class).parse();
}

}  // namespace tern::grammar
