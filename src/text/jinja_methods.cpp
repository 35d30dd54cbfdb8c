// Python methods callable from templates (str, dict, list; read-only, as in jinja2's immutable sandbox) and the
// globals transformers provides: namespace, range, dict, raise_exception, strftime_now.
#include <ctime>

#include <utf8proc.h>

#include "text/jinja.h"
#include "text/jinja_interp.h"

namespace tern::jinja {

// ---- case mapping ----

std::string lower_str(const std::string& s) {
  std::string out;
  for (uint32_t cp : utf8_decode(s)) utf8_append(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  return out;
}

std::string upper_str(const std::string& s) {
  std::string out;
  for (uint32_t cp : utf8_decode(s)) utf8_append(out, static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))));
  return out;
}

std::string capitalize_str(const std::string& s) {
  std::vector<uint32_t> cps = utf8_decode(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    auto c = static_cast<utf8proc_int32_t>(cps[i]);
    cps[i] = static_cast<uint32_t>(i == 0 ? utf8proc_totitle(c) : utf8proc_tolower(c));
  }
  return utf8_encode(cps);
}

namespace {

bool is_cased(uint32_t cp) {
  auto c = static_cast<utf8proc_int32_t>(cp);
  return utf8proc_tolower(c) != c || utf8proc_toupper(c) != c;
}

std::string title_str(const std::string& s) {
  std::vector<uint32_t> cps = utf8_decode(s);
  bool prev_cased = false;
  for (auto& cp : cps) {
    auto c = static_cast<utf8proc_int32_t>(cp);
    bool cased = is_cased(cp);
    cp = static_cast<uint32_t>(prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c));
    prev_cased = cased;
  }
  return utf8_encode(cps);
}

const Value* arg(const Args& a, const Kwargs& kw, size_t i, const char* name) {
  if (i < a.size()) return &a[i];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

std::string need_str(const Value* v, int line, const char* method) {
  if (!v || v->kind != Kind::String) runtime_fail(line, std::string(method) + "() needs a string argument");
  return v->s;
}

// Python's str.split / str.rsplit.
Value split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right, int line) {
  List out;
  if (!sep || sep->kind == Kind::None) {
    std::vector<uint32_t> cps = utf8_decode(s);
    std::vector<std::string> words;
    size_t i = 0;
    int64_t splits = 0;
    if (!from_right) {
      while (i < cps.size()) {
        while (i < cps.size() && is_py_space(cps[i])) ++i;
        if (i == cps.size()) break;
        if (maxsplit >= 0 && splits == maxsplit) {
          size_t e = cps.size();
          while (e > i && is_py_space(cps[e - 1])) --e;
          words.push_back(utf8_encode(std::vector<uint32_t>(cps.begin() + static_cast<long>(i), cps.begin() + static_cast<long>(e))));
          break;
        }
        size_t b = i;
        while (i < cps.size() && !is_py_space(cps[i])) ++i;
        words.push_back(utf8_encode(std::vector<uint32_t>(cps.begin() + static_cast<long>(b), cps.begin() + static_cast<long>(i))));
        ++splits;
      }
    } else {
      size_t e = cps.size();
      std::vector<std::string> rev;
      while (e > 0) {
        while (e > 0 && is_py_space(cps[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit >= 0 && splits == maxsplit) {
          size_t b = 0;
          while (b < e && is_py_space(cps[b])) ++b;
          rev.push_back(utf8_encode(std::vector<uint32_t>(cps.begin() + static_cast<long>(b), cps.begin() + static_cast<long>(e))));
          break;
        }
        size_t b = e;
        while (b > 0 && !is_py_space(cps[b - 1])) --b;
        rev.push_back(utf8_encode(std::vector<uint32_t>(cps.begin() + static_cast<long>(b), cps.begin() + static_cast<long>(e))));
        e = b;
        ++splits;
      }
      words.assign(rev.rbegin(), rev.rend());
    }
    for (auto& w : words) out.push_back(Value::string(std::move(w)));
    return Value::new_list(std::move(out));
  }
  if (sep->kind != Kind::String) runtime_fail(line, "split() separator must be a string");
  const std::string& d = sep->s;
  if (d.empty()) runtime_fail(line, "split(): empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t b = 0;
    int64_t n = 0;
    for (;;) {
      size_t e = (maxsplit >= 0 && n >= maxsplit) ? std::string::npos : s.find(d, b);
      if (e == std::string::npos) { parts.push_back(s.substr(b)); break; }
      parts.push_back(s.substr(b, e - b));
      b = e + d.size();
      ++n;
    }
  } else {
    size_t e = s.size();
    int64_t n = 0;
    std::vector<std::string> rev;
    for (;;) {
      size_t p = (maxsplit >= 0 && n >= maxsplit) || e < d.size() ? std::string::npos : s.rfind(d, e - d.size());
      if (p == std::string::npos) { rev.push_back(s.substr(0, e)); break; }
      rev.push_back(s.substr(p + d.size(), e - p - d.size()));
      e = p;
      ++n;
    }
    parts.assign(rev.rbegin(), rev.rend());
  }
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::new_list(std::move(out));
}

// Code-point index of a byte offset.
int64_t cp_index(const std::string& s, size_t byte) {
  return byte == std::string::npos ? -1 : static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, byte)));
}

Value string_method(const std::string& s, const std::string& name, const Args& a, const Kwargs& kw, int line) {
  auto affix = [&](bool start) {
    const Value* p = arg(a, kw, 0, "prefix");
    if (!p) runtime_fail(line, name + "() needs an argument");
    std::string subject = s;
    if (const Value* from = arg(a, kw, 1, "start"); from && from->kind == Kind::Int) {
      std::vector<uint32_t> cps = utf8_decode(s);
      int64_t b = from->i < 0 ? std::max<int64_t>(0, from->i + static_cast<int64_t>(cps.size())) : from->i;
      b = std::min<int64_t>(b, static_cast<int64_t>(cps.size()));
      subject = utf8_encode(std::vector<uint32_t>(cps.begin() + b, cps.end()));
    }
    auto one = [&](const Value& x) {
      if (x.kind != Kind::String) runtime_fail(line, name + "() argument must be str or a tuple of str");
      if (x.s.size() > subject.size()) return false;
      return start ? subject.compare(0, x.s.size(), x.s) == 0
                   : subject.compare(subject.size() - x.s.size(), x.s.size(), x.s) == 0;
    };
    if (p->kind == Kind::List) {
      for (const auto& x : *p->list)
        if (one(x)) return Value::boolean(true);
      return Value::boolean(false);
    }
    return Value::boolean(one(*p));
  };
  auto strip = [&](bool l, bool r) {
    const Value* c = arg(a, kw, 0, "chars");
    bool given = c && c->kind != Kind::None;
    if (given && c->kind != Kind::String) runtime_fail(line, name + "() argument must be str or None");
    return Value::string(py_strip(s, given ? c->s : "", l, r, given));
  };
  auto all_of = [&](auto pred) {
    std::vector<uint32_t> cps = utf8_decode(s);
    if (cps.empty()) return Value::boolean(false);
    for (uint32_t cp : cps)
      if (!pred(cp)) return Value::boolean(false);
    return Value::boolean(true);
  };
  if (name == "startswith") return affix(true);
  if (name == "endswith") return affix(false);
  if (name == "strip") return strip(true, true);
  if (name == "lstrip") return strip(true, false);
  if (name == "rstrip") return strip(false, true);
  if (name == "split" || name == "rsplit") {
    const Value* m = arg(a, kw, 1, "maxsplit");
    return split(s, arg(a, kw, 0, "sep"), m && m->kind == Kind::Int ? m->i : -1, name == "rsplit", line);
  }
  if (name == "splitlines") {
    List out;
    std::string cur;
    std::vector<uint32_t> cps = utf8_decode(s);
    for (size_t i = 0; i < cps.size(); ++i) {
      uint32_t cp = cps[i];
      bool nl = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
                cp == 0x85 || cp == 0x2028 || cp == 0x2029;
      if (!nl) { utf8_append(cur, cp); continue; }
      if (cp == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
      out.push_back(Value::string(cur));
      cur.clear();
    }
    if (!cur.empty()) out.push_back(Value::string(cur));
    return Value::new_list(std::move(out));
  }
  if (name == "upper") return Value::string(upper_str(s));
  if (name == "lower") return Value::string(lower_str(s));
  if (name == "capitalize") return Value::string(capitalize_str(s));
  if (name == "title") return Value::string(title_str(s));
  if (name == "replace") {
    std::string old = need_str(arg(a, kw, 0, "old"), line, "replace");
    std::string rep = need_str(arg(a, kw, 1, "new"), line, "replace");
    const Value* c = arg(a, kw, 2, "count");
    int64_t count = c && c->kind == Kind::Int ? c->i : -1;
    std::string out;
    if (old.empty()) {
      std::vector<uint32_t> cps = utf8_decode(s);
      int64_t n = 0;
      for (size_t i = 0; i <= cps.size(); ++i) {
        if (count < 0 || n < count) { out += rep; ++n; }
        if (i < cps.size()) utf8_append(out, cps[i]);
      }
      return Value::string(std::move(out));
    }
    size_t b = 0;
    int64_t n = 0;
    for (;;) {
      size_t e = (count >= 0 && n >= count) ? std::string::npos : s.find(old, b);
      if (e == std::string::npos) { out += s.substr(b); break; }
      out += s.substr(b, e - b) + rep;
      b = e + old.size();
      ++n;
    }
    return Value::string(std::move(out));
  }
  if (name == "find") return Value::integer(cp_index(s, s.find(need_str(arg(a, kw, 0, "sub"), line, "find"))));
  if (name == "rfind") return Value::integer(cp_index(s, s.rfind(need_str(arg(a, kw, 0, "sub"), line, "rfind"))));
  if (name == "index") {
    size_t p = s.find(need_str(arg(a, kw, 0, "sub"), line, "index"));
    if (p == std::string::npos) runtime_fail(line, "substring not found");
    return Value::integer(cp_index(s, p));
  }
  if (name == "count") {
    std::string sub = need_str(arg(a, kw, 0, "sub"), line, "count");
    if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const Value* items = arg(a, kw, 0, "iterable");
    if (!items) runtime_fail(line, "join() needs an argument");
    std::string out;
    bool first = true;
    for (const auto& x : iterate(*items, line)) {
      if (x.kind != Kind::String) runtime_fail(line, std::string("join(): expected str, got ") + type_name(x));
      if (!first) out += s;
      out += x.s;
      first = false;
    }
    return Value::string(std::move(out));
  }
  if (name == "removeprefix") {
    std::string p = need_str(arg(a, kw, 0, "prefix"), line, "removeprefix");
    return Value::string(s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s);
  }
  if (name == "removesuffix") {
    std::string p = need_str(arg(a, kw, 0, "suffix"), line, "removesuffix");
    bool ends = !p.empty() && p.size() <= s.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
    return Value::string(ends ? s.substr(0, s.size() - p.size()) : s);
  }
  if (name == "isspace") return all_of(is_py_space);
  if (name == "isdigit") return all_of([](uint32_t cp) { return cp >= '0' && cp <= '9'; });
  if (name == "isalpha") return all_of([](uint32_t cp) {
    auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
  });
  if (name == "isalnum") return all_of([](uint32_t cp) {
    auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
  });
  if (name == "islower") return Value::boolean(lower_str(s) == s && upper_str(s) != s);
  if (name == "isupper") return Value::boolean(upper_str(s) == s && lower_str(s) != s);
  runtime_fail(line, "unsupported string method '" + name + "'");
}

}  // namespace

Value call_method(const Value& obj, const std::string& name, const Args& a, const Kwargs& kw, int line) {
  if (obj.kind == Kind::String) return string_method(obj.s, name, a, kw, line);
  if (obj.kind == Kind::Dict) {
    if (name == "items") return apply_filter("items", obj, {}, {}, line);
    if (name == "keys") return Value::new_list(iterate(obj, line));
    if (name == "values") {
      List out;
      for (const auto& kv : *obj.dict) out.push_back(kv.second);
      return Value::new_list(std::move(out));
    }
    if (name == "get") {
      const Value* k = arg(a, kw, 0, "key");
      if (!k) runtime_fail(line, "get() needs a key");
      if (k->kind == Kind::String)
        if (const Value* v = dict_find(*obj.dict, k->s)) return *v;
      const Value* d = arg(a, kw, 1, "default");
      return d ? *d : Value::none();
    }
    // A key that happens to hold a callable is not supported; everything else is a mutating or unknown method.
    runtime_fail(line, "unsupported dict method '" + name + "' (templates cannot modify data)");
  }
  if (obj.kind == Kind::List) {
    const Value* x = arg(a, kw, 0, "value");
    if (name == "count" && x) {
      int64_t n = 0;
      for (const auto& v : *obj.list) n += equals(v, *x);
      return Value::integer(n);
    }
    if (name == "index" && x) {
      for (size_t i = 0; i < obj.list->size(); ++i)
        if (equals((*obj.list)[i], *x)) return Value::integer(static_cast<int64_t>(i));
      runtime_fail(line, to_repr(*x) + " is not in list");
    }
    runtime_fail(line, "unsupported list method '" + name + "' (templates cannot modify data)");
  }
  runtime_fail(line, std::string("'") + type_name(obj) + "' object has no method '" + name + "'");
}

const std::vector<std::string>& global_names() {
  static const std::vector<std::string> names = {"namespace", "range", "dict", "raise_exception", "strftime_now"};
  return names;
}

Value call_global(const std::string& name, const Args& a, const Kwargs& kw, int line) {
  if (name == "namespace" || name == "dict") {
    Dict d;
    if (!a.empty()) {
      if (a.size() > 1 || a[0].kind != Kind::Dict) runtime_fail(line, name + "() takes a mapping or keyword arguments");
      d = *a[0].dict;
    }
    for (const auto& [k, v] : kw) dict_set(d, k, v);
    if (name == "dict") return Value::new_dict(std::move(d));
    for (const auto& kv : d)
      if (!kv.first.empty() && kv.first[0] == '_')
        runtime_fail(line, "cannot store underscore-prefixed attribute '" + kv.first + "' on a namespace");
    return Value::new_namespace(std::move(d));
  }
  if (name == "range") {
    int64_t start = 0, stop = 0, step = 1;
    auto num = [&](const Value& v) {
      if (v.kind != Kind::Int) runtime_fail(line, "range() arguments must be integers");
      return v.i;
    };
    if (a.size() == 1) stop = num(a[0]);
    else if (a.size() == 2 || a.size() == 3) {
      start = num(a[0]);
      stop = num(a[1]);
      if (a.size() == 3) step = num(a[2]);
    } else runtime_fail(line, "range() takes 1 to 3 arguments");
    if (step == 0) runtime_fail(line, "range() step must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 1000000) runtime_fail(line, "range() too large");
      out.push_back(Value::integer(i));
    }
    return Value::new_list(std::move(out));
  }
  if (name == "raise_exception") {
    throw TemplateException(a.empty() ? std::string("raise_exception() called") : to_str(a[0]));
  }
  if (name == "strftime_now") {
    if (a.empty() || a[0].kind != Kind::String) runtime_fail(line, "strftime_now() needs a format string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, a[0].s.c_str(), &tm);
    return Value::string(std::string(buf, n));
  }
  runtime_fail(line, "unknown function '" + name + "'");
}

}  // namespace tern::jinja
