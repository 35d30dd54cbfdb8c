// Built-in filters and tests of the Jinja2 subset, plus attribute/item access and iteration, with the semantics of
// jinja2's defaults and transformers' overrides (tojson = json.dumps(ensure_ascii=False), no HTML escaping).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "core/check.h"
#include "text/jinja_interp.h"

namespace tern::jinja {

// ---- access ----

Value get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.kind == Kind::Undefined)
    runtime_fail(line, "'" + obj.s + "' is undefined (reading its attribute '" + name + "')");
  if (obj.kind == Kind::Dict || obj.kind == Kind::Namespace) {
    const Value* v = dict_find(*obj.dict, name);
    if (v) return *v;
  }
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key, int line) {
  switch (obj.kind) {
    case Kind::Undefined:
      runtime_fail(line, "'" + obj.s + "' is undefined (reading item " + to_repr(key) + ")");
    case Kind::Dict: case Kind::Namespace: {
      if (key.kind == Kind::String) {
        const Value* v = dict_find(*obj.dict, key.s);
        if (v) return *v;
      }
      return Value::undefined(to_str(key));
    }
    case Kind::List: case Kind::String: {
      if (key.kind != Kind::Int && key.kind != Kind::Bool) return Value::undefined(to_str(key));
      int64_t i = key.kind == Kind::Bool ? key.b : key.i;
      if (obj.kind == Kind::List) {
        int64_t n = static_cast<int64_t>(obj.list->size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("index " + std::to_string(i));
        return (*obj.list)[static_cast<size_t>(i)];
      }
      std::vector<uint32_t> cps = utf8_decode(obj.s);
      int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("index " + std::to_string(i));
      std::string out;
      utf8_append(out, cps[static_cast<size_t>(i)]);
      return Value::string(std::move(out));
    }
    default: return Value::undefined(to_str(key));
  }
}

List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Kind::Undefined: return {};
    case Kind::List: return *v.list;
    case Kind::Dict: {
      List keys;
      for (const auto& kv : *v.dict) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Kind::String: {
      List chars;
      for (uint32_t cp : utf8_decode(v.s)) {
        std::string c;
        utf8_append(c, cp);
        chars.push_back(Value::string(std::move(c)));
      }
      return chars;
    }
    default: runtime_fail(line, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

int64_t length_of(const Value& v, int line) {
  switch (v.kind) {
    case Kind::Undefined: return 0;
    case Kind::String: return static_cast<int64_t>(utf8_length(v.s));
    case Kind::List: return static_cast<int64_t>(v.list->size());
    case Kind::Dict: return static_cast<int64_t>(v.dict->size());
    default: runtime_fail(line, std::string("object of type '") + type_name(v) + "' has no len()");
  }
}

namespace {

const Value* kwarg(const Kwargs& kw, const char* name) {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

// Positional argument i, or keyword `name`, or nullptr.
const Value* arg(const Args& args, const Kwargs& kw, size_t i, const char* name) {
  if (i < args.size()) return &args[i];
  return kwarg(kw, name);
}

bool arg_bool(const Args& args, const Kwargs& kw, size_t i, const char* name, bool dflt) {
  const Value* v = arg(args, kw, i, name);
  return v ? truthy(*v) : dflt;
}

// Jinja's attribute paths ("a.b", "0") for map/selectattr/sort.
Value attr_path(const Value& v, const std::string& path, int line) {
  Value cur = v;
  size_t b = 0;
  while (b <= path.size()) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? get_item(cur, Value::integer(std::stoll(part)), line) : get_item(cur, Value::string(part), line);
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return cur;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value tojson_filter(const Value& v, const Args& args, const Kwargs& kw, int line) {
  JsonOptions o;
  if (const Value* x = arg(args, kw, 0, "ensure_ascii")) o.ensure_ascii = truthy(*x);
  if (const Value* x = arg(args, kw, 1, "indent"); x && x->kind != Kind::None) {
    if (x->kind != Kind::Int) runtime_fail(line, "tojson: indent must be an integer");
    o.indent = static_cast<int>(x->i);
    o.item_separator = ",";
  }
  if (const Value* x = arg(args, kw, 2, "separators"); x && x->kind != Kind::None) {
    if (x->kind != Kind::List || x->list->size() != 2 || (*x->list)[0].kind != Kind::String ||
        (*x->list)[1].kind != Kind::String)
      runtime_fail(line, "tojson: separators must be a pair of strings");
    o.item_separator = (*x->list)[0].s;
    o.key_separator = (*x->list)[1].s;
  }
  if (const Value* x = arg(args, kw, 3, "sort_keys")) o.sort_keys = truthy(*x);
  try {
    return Value::string(to_json(v, o));
  } catch (const Error& e) {
    runtime_fail(line, std::string("tojson: ") + e.what());
  }
}

List sorted(List items, bool reverse, bool case_sensitive, const Value* attribute, int line) {
  auto key = [&](const Value& v) {
    Value k = attribute ? attr_path(v, to_str(*attribute), line) : v;
    if (!case_sensitive && k.kind == Kind::String) k.s = lower_str(k.s);
    return k;
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& v : items) keyed.emplace_back(key(v), v);
  try {
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      return reverse ? less_than(b.first, a.first) : less_than(a.first, b.first);
    });
  } catch (const Error& e) {
    runtime_fail(line, e.what());
  }
  List out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

using FilterFn = std::function<Value(const Value&, const Args&, const Kwargs&, int)>;

Value to_int(const Value& v, const Value& dflt) {
  switch (v.kind) {
    case Kind::Int: return v;
    case Kind::Bool: return Value::integer(v.b);
    case Kind::Float: return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(v.f)) : dflt;
    case Kind::String: {
      std::string s = py_strip(v.s, "", true, true, false);
      try {
        size_t used = 0;
        long long x = std::stoll(s, &used, 10);
        if (used == s.size()) return Value::integer(x);
        double d = std::stod(s, &used);
        if (used == s.size()) return Value::integer(static_cast<int64_t>(d));
      } catch (const std::exception&) {
      }
      return dflt;
    }
    default: return dflt;
  }
}

Value to_float(const Value& v, const Value& dflt) {
  switch (v.kind) {
    case Kind::Int: return Value::number(static_cast<double>(v.i));
    case Kind::Bool: return Value::number(v.b);
    case Kind::Float: return v;
    case Kind::String: {
      std::string s = py_strip(v.s, "", true, true, false);
      try {
        size_t used = 0;
        double d = std::stod(s, &used);
        if (used == s.size()) return Value::number(d);
      } catch (const std::exception&) {
      }
      return dflt;
    }
    default: return dflt;
  }
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> table = [] {
    std::map<std::string, FilterFn> f;
    f["safe"] = [](const Value& v, const Args&, const Kwargs&, int) { return v; };
    f["string"] = [](const Value& v, const Args&, const Kwargs&, int) { return Value::string(to_str(v)); };
    f["tojson"] = tojson_filter;
    f["trim"] = [](const Value& v, const Args& a, const Kwargs& kw, int) {
      const Value* chars = arg(a, kw, 0, "chars");
      bool given = chars && chars->kind != Kind::None;
      return Value::string(py_strip(to_str(v), given ? to_str(*chars) : "", true, true, given));
    };
    f["length"] = [](const Value& v, const Args&, const Kwargs&, int line) {
      return Value::integer(length_of(v, line));
    };
    f["count"] = f["length"];
    f["items"] = [](const Value& v, const Args&, const Kwargs&, int line) {
      if (v.kind == Kind::Undefined) return Value::new_list();
      if (v.kind != Kind::Dict) runtime_fail(line, "Can only get item pairs from a mapping.");
      List out;
      for (const auto& [k, x] : *v.dict) out.push_back(Value::new_tuple({Value::string(k), x}));
      return Value::new_list(std::move(out));
    };
    f["list"] = [](const Value& v, const Args&, const Kwargs&, int line) { return Value::new_list(iterate(v, line)); };
    f["default"] = [](const Value& v, const Args& a, const Kwargs& kw, int) {
      const Value* d = arg(a, kw, 0, "default_value");
      bool boolean = arg_bool(a, kw, 1, "boolean", false);
      if (v.is_undefined() || (boolean && !truthy(v))) return d ? *d : Value::string("");
      return v;
    };
    f["d"] = f["default"];
    f["join"] = [](const Value& v, const Args& a, const Kwargs& kw, int line) {
      const Value* sep = arg(a, kw, 0, "d");
      const Value* attribute = arg(a, kw, 1, "attribute");
      std::string out;
      bool first = true;
      for (const auto& x : iterate(v, line)) {
        if (!first) out += sep ? to_str(*sep) : "";
        out += to_str(attribute ? attr_path(x, to_str(*attribute), line) : x);
        first = false;
      }
      return Value::string(std::move(out));
    };
    f["lower"] = [](const Value& v, const Args&, const Kwargs&, int) { return Value::string(lower_str(to_str(v))); };
    f["upper"] = [](const Value& v, const Args&, const Kwargs&, int) { return Value::string(upper_str(to_str(v))); };
    f["capitalize"] = [](const Value& v, const Args&, const Kwargs&, int) {
      return Value::string(capitalize_str(to_str(v)));
    };
    f["title"] = [](const Value& v, const Args&, const Kwargs&, int) {
      // Jinja: words split at whitespace and -([{<, each capitalised.
      std::string s = to_str(v), out, word;
      auto flush = [&] { out += capitalize_str(word); word.clear(); };
      for (char c : s) {
        if (c == ' ' || c == '\t' || c == '\n' || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
          flush();
          out += c;
        } else {
          word += c;
        }
      }
      flush();
      return Value::string(std::move(out));
    };
    f["escape"] = [](const Value& v, const Args&, const Kwargs&, int) { return Value::string(html_escape(to_str(v))); };
    f["e"] = f["escape"];
    f["first"] = [](const Value& v, const Args&, const Kwargs&, int line) {
      List items = iterate(v, line);
      return items.empty() ? Value::undefined("first") : items.front();
    };
    f["last"] = [](const Value& v, const Args&, const Kwargs&, int line) {
      List items = iterate(v, line);
      return items.empty() ? Value::undefined("last") : items.back();
    };
    f["reverse"] = [](const Value& v, const Args&, const Kwargs&, int line) {
      if (v.kind == Kind::String) {
        std::vector<uint32_t> cps = utf8_decode(v.s);
        std::reverse(cps.begin(), cps.end());
        return Value::string(utf8_encode(cps));
      }
      List items = iterate(v, line);
      std::reverse(items.begin(), items.end());
      return Value::new_list(std::move(items));
    };
    f["replace"] = [](const Value& v, const Args& a, const Kwargs& kw, int line) {
      const Value* old = arg(a, kw, 0, "old");
      const Value* rep = arg(a, kw, 1, "new");
      const Value* count = arg(a, kw, 2, "count");
      if (!old || !rep) runtime_fail(line, "replace needs two arguments");
      return call_method(Value::string(to_str(v)), "replace",
                         count ? Args{*old, *rep, *count} : Args{*old, *rep}, {}, line);
    };
    f["int"] = [](const Value& v, const Args& a, const Kwargs& kw, int) {
      const Value* d = arg(a, kw, 0, "default");
      return to_int(v, d ? *d : Value::integer(0));
    };
    f["float"] = [](const Value& v, const Args& a, const Kwargs& kw, int) {
      const Value* d = arg(a, kw, 0, "default");
      return to_float(v, d ? *d : Value::number(0.0));
    };
    f["abs"] = [](const Value& v, const Args&, const Kwargs&, int line) {
      if (v.kind == Kind::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
      if (v.kind == Kind::Bool) return Value::integer(v.b);
      if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
      runtime_fail(line, std::string("bad operand type for abs(): '") + type_name(v) + "'");
    };
    f["round"] = [](const Value& v, const Args& a, const Kwargs& kw, int line) {
      const Value* p = arg(a, kw, 0, "precision");
      const Value* m = arg(a, kw, 1, "method");
      std::string method = m ? to_str(*m) : "common";
      double x = to_float(v, Value::number(0)).f, scale = std::pow(10.0, p ? static_cast<double>(to_int(*p, Value::integer(0)).i) : 0.0);
      if (method == "common") return Value::number(std::round(x * scale) / scale);
      if (method == "floor") return Value::number(std::floor(x * scale) / scale);
      if (method == "ceil") return Value::number(std::ceil(x * scale) / scale);
      runtime_fail(line, "round: method must be common, floor or ceil");
    };
    f["sort"] = [](const Value& v, const Args& a, const Kwargs& kw, int line) {
      return Value::new_list(sorted(iterate(v, line), arg_bool(a, kw, 0, "reverse", false),
                                    arg_bool(a, kw, 1, "case_sensitive", false), arg(a, kw, 2, "attribute"), line));
    };
    f["dictsort"] = [](const Value& v, const Args& a, const Kwargs& kw, int line) {
      if (v.kind != Kind::Dict) runtime_fail(line, "dictsort: expected a mapping");
      bool cs = arg_bool(a, kw, 0, "case_sensitive", false);
      const Value* by = arg(a, kw, 1, "by");
      bool rev = arg_bool(a, kw, 2, "reverse", false);
      List pairs;
      for (const auto& [k, x] : *v.dict) pairs.push_back(Value::new_tuple({Value::string(k), x}));
      Value path = Value::string(by && to_str(*by) == "value" ? "1" : "0");
      return Value::new_list(sorted(std::move(pairs), rev, cs, &path, line));
    };
    f["unique"] = [](const Value& v, const Args& a, const Kwargs& kw, int line) {
      bool cs = arg_bool(a, kw, 0, "case_sensitive", false);
      const Value* attribute = arg(a, kw, 1, "attribute");
      List out, seen;
      for (const auto& x : iterate(v, line)) {
        Value k = attribute ? attr_path(x, to_str(*attribute), line) : x;
        if (!cs && k.kind == Kind::String) k.s = lower_str(k.s);
        bool dup = false;
        for (const auto& s : seen) dup = dup || equals(s, k);
        if (!dup) { seen.push_back(k); out.push_back(x); }
      }
      return Value::new_list(std::move(out));
    };
    auto minmax = [](bool want_max) {
      return [want_max](const Value& v, const Args& a, const Kwargs& kw, int line) {
        List s = sorted(iterate(v, line), false, arg_bool(a, kw, 0, "case_sensitive", false),
                        arg(a, kw, 1, "attribute"), line);
        if (s.empty()) return Value::undefined(want_max ? "max" : "min");
        return want_max ? s.back() : s.front();
      };
    };
    f["min"] = minmax(false);
    f["max"] = minmax(true);
    f["sum"] = [](const Value& v, const Args& a, const Kwargs& kw, int line) {
      const Value* attribute = arg(a, kw, 0, "attribute");
      const Value* start = arg(a, kw, 1, "start");
      Value total = start ? *start : Value::integer(0);
      for (const auto& x : iterate(v, line)) {
        Value y = attribute ? attr_path(x, to_str(*attribute), line) : x;
        if (!total.is_number() || !y.is_number()) runtime_fail(line, "sum: values must be numbers");
        if (total.kind == Kind::Float || y.kind == Kind::Float)
          total = Value::number(to_float(total, Value::number(0)).f + to_float(y, Value::number(0)).f);
        else
          total = Value::integer(to_int(total, Value::integer(0)).i + to_int(y, Value::integer(0)).i);
      }
      return total;
    };
    f["map"] = [](const Value& v, const Args& a, const Kwargs& kw, int line) {
      List out;
      const Value* attribute = kwarg(kw, "attribute");
      for (const auto& x : iterate(v, line)) {
        if (attribute) {
          Value y = attr_path(x, to_str(*attribute), line);
          const Value* d = kwarg(kw, "default");
          out.push_back(y.is_undefined() && d ? *d : y);
        } else {
          if (a.empty()) runtime_fail(line, "map: needs a filter name or attribute=");
          Args rest(a.begin() + 1, a.end());
          out.push_back(apply_filter(to_str(a[0]), x, rest, {}, line));
        }
      }
      return Value::new_list(std::move(out));
    };
    auto select = [](bool keep, bool by_attr) {
      return [keep, by_attr](const Value& v, const Args& a, const Kwargs&, int line) {
        List out;
        size_t at = 0;
        std::string attribute;
        if (by_attr) {
          if (a.empty()) runtime_fail(line, "selectattr/rejectattr: needs an attribute name");
          attribute = to_str(a[at++]);
        }
        for (const auto& x : iterate(v, line)) {
          Value y = by_attr ? attr_path(x, attribute, line) : x;
          bool r;
          if (at < a.size()) r = apply_test(to_str(a[at]), y, Args(a.begin() + static_cast<long>(at) + 1, a.end()), line);
          else r = truthy(y);
          if (r == keep) out.push_back(x);
        }
        return Value::new_list(std::move(out));
      };
    };
    f["select"] = select(true, false);
    f["reject"] = select(false, false);
    f["selectattr"] = select(true, true);
    f["rejectattr"] = select(false, true);
    f["attr"] = [](const Value& v, const Args& a, const Kwargs&, int line) {
      if (a.empty()) runtime_fail(line, "attr: needs a name");
      return get_attr(v, to_str(a[0]), line);
    };
    f["indent"] = [](const Value& v, const Args& a, const Kwargs& kw, int) {
      const Value* w = arg(a, kw, 0, "width");
      std::string pad = w && w->kind == Kind::String ? w->s : std::string(w ? static_cast<size_t>(to_int(*w, Value::integer(4)).i) : 4, ' ');
      bool first = arg_bool(a, kw, 1, "first", false), blank = arg_bool(a, kw, 2, "blank", false);
      std::string s = to_str(v), out;
      size_t b = 0;
      bool is_first = true;
      while (true) {
        size_t e = s.find('\n', b);
        std::string ln = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
        bool add = is_first ? first : (blank || !py_strip(ln, "", true, true, false).empty());
        out += (add ? pad : "") + ln;
        if (e == std::string::npos) break;
        out += '\n';
        b = e + 1;
        is_first = false;
      }
      return Value::string(std::move(out));
    };
    f["wordcount"] = [](const Value& v, const Args&, const Kwargs&, int line) {
      Value parts = call_method(Value::string(to_str(v)), "split", {}, {}, line);
      return Value::integer(static_cast<int64_t>(parts.list->size()));
    };
    return f;
  }();
  return table;
}

}  // namespace

bool filter_known(const std::string& name) { return filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& v, const Args& args, const Kwargs& kwargs, int line) {
  auto it = filters().find(name);
  if (it == filters().end()) runtime_fail(line, "unsupported filter '" + name + "'");
  return it->second(v, args, kwargs, line);
}

// ---- tests ----

namespace {

using TestFn = std::function<bool(const Value&, const Args&, int)>;

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> table = [] {
    std::map<std::string, TestFn> t;
    auto need = [](const Args& a, int line, const char* name) -> const Value& {
      if (a.empty()) runtime_fail(line, std::string("test '") + name + "' needs an argument");
      return a[0];
    };
    t["defined"] = [](const Value& v, const Args&, int) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, const Args&, int) { return v.is_undefined(); };
    t["none"] = [](const Value& v, const Args&, int) { return v.kind == Kind::None; };
    t["string"] = [](const Value& v, const Args&, int) { return v.kind == Kind::String; };
    t["number"] = [](const Value& v, const Args&, int) { return v.is_number(); };
    t["integer"] = [](const Value& v, const Args&, int) { return v.kind == Kind::Int; };
    t["float"] = [](const Value& v, const Args&, int) { return v.kind == Kind::Float; };
    t["boolean"] = [](const Value& v, const Args&, int) { return v.kind == Kind::Bool; };
    t["true"] = [](const Value& v, const Args&, int) { return v.kind == Kind::Bool && v.b; };
    t["false"] = [](const Value& v, const Args&, int) { return v.kind == Kind::Bool && !v.b; };
    t["mapping"] = [](const Value& v, const Args&, int) { return v.kind == Kind::Dict; };
    // Jinja's Undefined is iterable (empty) and passes the sequence test; None is neither.
    t["iterable"] = [](const Value& v, const Args&, int) {
      return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.kind == Kind::Undefined;
    };
    t["sequence"] = t["iterable"];
    t["callable"] = [](const Value& v, const Args&, int) { return v.kind == Kind::Macro || v.kind == Kind::Builtin; };
    t["even"] = [](const Value& v, const Args&, int line) {
      if (v.kind != Kind::Int) runtime_fail(line, "test 'even' needs an integer");
      return v.i % 2 == 0;
    };
    t["odd"] = [](const Value& v, const Args&, int line) {
      if (v.kind != Kind::Int) runtime_fail(line, "test 'odd' needs an integer");
      return v.i % 2 != 0;
    };
    t["divisibleby"] = [need](const Value& v, const Args& a, int line) {
      const Value& d = need(a, line, "divisibleby");
      if (v.kind != Kind::Int || d.kind != Kind::Int || d.i == 0) runtime_fail(line, "divisibleby needs integers");
      return v.i % d.i == 0;
    };
    t["eq"] = [need](const Value& v, const Args& a, int line) { return equals(v, need(a, line, "eq")); };
    t["equalto"] = t["eq"];
    t["=="] = t["eq"];
    t["ne"] = [need](const Value& v, const Args& a, int line) { return !equals(v, need(a, line, "ne")); };
    t["!="] = t["ne"];
    auto ordered = [need](const char* name, int which) {
      return [need, name, which](const Value& v, const Args& a, int line) {
        const Value& o = need(a, line, name);
        try {
          switch (which) {
            case 0: return less_than(v, o);
            case 1: return !less_than(o, v);
            case 2: return less_than(o, v);
            default: return !less_than(v, o);
          }
        } catch (const Error& e) {
          runtime_fail(line, e.what());
        }
      };
    };
    t["lt"] = ordered("lt", 0); t["<"] = t["lt"]; t["lessthan"] = t["lt"];
    t["le"] = ordered("le", 1); t["<="] = t["le"];
    t["gt"] = ordered("gt", 2); t[">"] = t["gt"]; t["greaterthan"] = t["gt"];
    t["ge"] = ordered("ge", 3); t[">="] = t["ge"];
    t["in"] = [need](const Value& v, const Args& a, int line) {
      const Value& c = need(a, line, "in");
      if (c.kind == Kind::String) return v.kind == Kind::String && c.s.find(v.s) != std::string::npos;
      if (c.kind == Kind::Dict) return v.kind == Kind::String && dict_find(*c.dict, v.s) != nullptr;
      for (const auto& x : iterate(c, line))
        if (equals(x, v)) return true;
      return false;
    };
    t["sameas"] = [need](const Value& v, const Args& a, int line) {
      const Value& o = need(a, line, "sameas");
      if (v.kind != o.kind) return false;
      switch (v.kind) {
        case Kind::None: case Kind::Undefined: return true;
        case Kind::Bool: return v.b == o.b;
        case Kind::List: return v.list == o.list;
        case Kind::Dict: case Kind::Namespace: return v.dict == o.dict;
        default: return equals(v, o);
      }
    };
    t["lower"] = [](const Value& v, const Args&, int) { return v.kind == Kind::String && lower_str(v.s) == v.s; };
    t["upper"] = [](const Value& v, const Args&, int) { return v.kind == Kind::String && upper_str(v.s) == v.s; };
    t["escaped"] = [](const Value&, const Args&, int) { return false; };
    return t;
  }();
  return table;
}

}  // namespace

bool test_known(const std::string& name) { return tests().count(name) > 0; }

bool apply_test(const std::string& name, const Value& v, const Args& args, int line) {
  auto it = tests().find(name);
  if (it == tests().end()) runtime_fail(line, "unsupported test '" + name + "'");
  return it->second(v, args, line);
}

}  // namespace tern::jinja
