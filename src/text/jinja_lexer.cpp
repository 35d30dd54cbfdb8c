// Lexer of the Jinja2 subset, matching jinja2.lexer with trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False (what transformers' apply_chat_template uses).
#include <cctype>
#include <cstring>

#include "core/check.h"
#include "text/jinja_ast.h"

namespace tern::jinja {
namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.splitlines() line boundaries become "\n" (Jinja normalises the source this way).
std::string normalize_newlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else if (c == '\v' || c == '\f' || c == 0x1C || c == 0x1D || c == 0x1E) {
      out += '\n';
    } else if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) {
      out += '\n';
      ++i;
    } else if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[i + 2]) == 0xA8 || static_cast<unsigned char>(s[i + 2]) == 0xA9)) {
      out += '\n';
      i += 2;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (uint32_t cp : utf8_decode(s))
    if (!is_py_space(cp)) return false;
  return true;
}

// Decodes a Python string literal body (Jinja decodes with "unicode-escape").
std::string decode_string(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) { out += c; continue; }
    char e = body[++i];
    auto hex = [&](size_t n) -> uint32_t {
      uint32_t v = 0;
      for (size_t k = 0; k < n; ++k) {
        TERN_CHECK(i + 1 < body.size(), "chat template line ", line, ": truncated escape in string literal");
        char h = body[++i];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= static_cast<uint32_t>(h - '0');
        else if (h >= 'a' && h <= 'f') v |= static_cast<uint32_t>(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') v |= static_cast<uint32_t>(h - 'A' + 10);
        else TERN_FAIL("chat template line ", line, ": bad escape in string literal");
      }
      return v;
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case 'a': out += '\a'; break;
      case '0': out += '\0'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;
      case 'x': utf8_append(out, hex(2)); break;
      case 'u': utf8_append(out, hex(4)); break;
      case 'U': utf8_append(out, hex(8)); break;
      default: out += '\\'; out += e;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      size_t start = find_tag(pos_);
      std::string text = s_.substr(pos_, (start == std::string::npos ? s_.size() : start) - pos_);
      int text_lines = count_lines(text);
      if (start == std::string::npos) {
        emit(Tok::Text, text);
        line_ += text_lines;
        break;
      }
      char kind = s_[start + 1];
      char ctrl = start + 2 < s_.size() ? s_[start + 2] : 0;
      if (ctrl == '-') {
        text = py_strip(text, "", false, true, false);
      } else if (ctrl != '+' && kind != '{') {
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && all_space(std::string_view(text).substr(l_pos))) text.resize(l_pos);
      }
      if (!text.empty()) emit(Tok::Text, text);
      line_ += text_lines;
      pos_ = start + 2 + ((ctrl == '-' || ctrl == '+') ? 1 : 0);
      if (kind == '#') line_starting = comment();
      else line_starting = tag(kind == '%');
    }
    emit(Tok::Eof, "");
    return std::move(out_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }
  static int count_lines(std::string_view t) {
    int n = 0;
    for (char c : t) n += c == '\n';
    return n;
  }
  void emit(Tok t, std::string text) { out_.push_back(Token{t, std::move(text), line_}); }

  // After a closing marker: "-" strips all following whitespace; a block (and comment) end eats one newline.
  // Returns whether what was consumed ends with a newline (Jinja's line_starting).
  bool after_end(bool strip, bool trim_newline) {
    bool ends_nl = false;
    if (strip) {
      while (pos_ < s_.size() && is_ascii_space(s_[pos_])) {
        ends_nl = s_[pos_] == '\n';
        if (s_[pos_] == '\n') ++line_;
        ++pos_;
      }
    } else if (trim_newline && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
      ++line_;
      ends_nl = true;
    }
    return ends_nl;
  }

  bool comment() {
    size_t end = s_.find("#}", pos_);
    TERN_CHECK(end != std::string::npos, "chat template line ", line_, ": unclosed comment {#");
    bool strip = end > pos_ && s_[end - 1] == '-';
    line_ += count_lines(std::string_view(s_).substr(pos_, end - pos_));
    pos_ = end + 2;
    return after_end(strip, true);
  }

  bool tag(bool block) {
    emit(block ? Tok::BlockBegin : Tok::VarBegin, "");
    std::vector<char> balance;
    const char* close = block ? "%}" : "}}";
    for (;;) {
      while (pos_ < s_.size() && is_ascii_space(s_[pos_])) {
        if (s_[pos_] == '\n') ++line_;
        ++pos_;
      }
      TERN_CHECK(pos_ < s_.size(), "chat template line ", line_, ": unclosed ", block ? "{%" : "{{");
      if (balance.empty()) {
        bool strip = s_.compare(pos_, 1, "-") == 0 && s_.compare(pos_ + 1, 2, close) == 0;
        if (strip || s_.compare(pos_, 2, close) == 0) {
          pos_ += strip ? 3 : 2;
          emit(block ? Tok::BlockEnd : Tok::VarEnd, "");
          return after_end(strip, block);
        }
      }
      char c = s_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t b = pos_;
        while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
        emit(Tok::Name, s_.substr(b, pos_ - b));
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        operator_token(balance);
      }
    }
  }

  void number() {
    size_t b = pos_;
    auto digits = [&] {
      while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < s_.size() && s_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(s_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      size_t save = pos_++;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        digits();
        is_float = true;
      } else {
        pos_ = save;
      }
    }
    std::string t;
    for (size_t i = b; i < pos_; ++i)
      if (s_[i] != '_') t += s_[i];
    emit(is_float ? Tok::Float : Tok::Int, t);
  }

  void string_literal(char q) {
    size_t b = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\') ++pos_;
      if (pos_ < s_.size() && s_[pos_] == '\n') ++line_;
      ++pos_;
    }
    TERN_CHECK(pos_ < s_.size(), "chat template line ", line_, ": unterminated string literal");
    emit(Tok::String, decode_string(std::string_view(s_).substr(b, pos_ - b), line_));
    ++pos_;
  }

  void operator_token(std::vector<char>& balance) {
    static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : two) {
      if (s_.compare(pos_, 2, op) == 0) {
        emit(Tok::Op, op);
        pos_ += 2;
        return;
      }
    }
    char c = s_[pos_];
    TERN_CHECK(std::strchr("+-*/%~<>=()[]{},.:|", c) != nullptr, "chat template line ", line_,
               ": unexpected character '", std::string(1, c), "'");
    if (c == '(') balance.push_back(')');
    else if (c == '[') balance.push_back(']');
    else if (c == '{') balance.push_back('}');
    else if (c == ')' || c == ']' || c == '}') {
      TERN_CHECK(!balance.empty() && balance.back() == c, "chat template line ", line_, ": unexpected '",
                 std::string(1, c), "'");
      balance.pop_back();
    }
    emit(Tok::Op, std::string(1, c));
    ++pos_;
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) {
  std::string s = normalize_newlines(source);
  if (!s.empty() && s.back() == '\n') s.pop_back();  // keep_trailing_newline=False
  return Lexer(std::move(s)).run();
}

}  // namespace tern::jinja
