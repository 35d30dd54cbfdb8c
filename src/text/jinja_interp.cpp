// Tree-walking interpreter of the Jinja2 subset: scopes, statements, expressions.
#include "text/jinja_interp.h"

#include <algorithm>
#include <cmath>

#include "text/jinja.h"

namespace tern::jinja {

void runtime_fail(int line, const std::string& message) {
  throw Error("chat template line " + std::to_string(line) + ": " + message);
}

namespace {

// A variable scope. Loops and macros open a new one; `if` does not (as in Jinja).
class Scope {
 public:
  explicit Scope(Scope* parent) : parent_(parent) {}
  Value* find(const std::string& name) {
    for (Scope* s = this; s; s = s->parent_) {
      auto it = s->vars_.find(name);
      if (it != s->vars_.end()) return &it->second;
    }
    return nullptr;
  }
  void set(const std::string& name, Value v) { vars_[name] = std::move(v); }

 private:
  Scope* parent_;
  std::unordered_map<std::string, Value> vars_;
};

enum class Flow { Normal, Break, Continue };

constexpr int kMaxDepth = 100;  // macro recursion limit

class Interpreter {
 public:
  explicit Interpreter(const Value& context) : root_(nullptr) {
    for (const auto& g : global_names()) root_.set(g, Value::builtin(g));
    if (context.kind == Kind::Dict)
      for (const auto& [k, v] : *context.dict) root_.set(k, v);
  }

  std::string run(const Program& p) {
    std::string out;
    Flow f = exec(p.body, root_, out);
    if (f != Flow::Normal) runtime_fail(0, "break/continue outside a loop");
    return out;
  }

 private:
  Flow exec(const Body& body, Scope& scope, std::string& out) {
    for (const auto& st : body) {
      Flow f = exec_one(*st, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_one(const Stmt& st, Scope& scope, std::string& out) {
    switch (st.kind) {
      case StmtKind::Text: out += st.text; return Flow::Normal;
      case StmtKind::Output: out += to_str(eval(*st.expr, scope)); return Flow::Normal;
      case StmtKind::If:
        for (size_t i = 0; i < st.conds.size(); ++i)
          if (truthy(eval(*st.conds[i], scope))) return exec(st.bodies[i], scope, out);
        return exec(st.else_body, scope, out);
      case StmtKind::For: return exec_for(st, scope, out);
      case StmtKind::Set: assign(st, eval(*st.expr, scope), scope); return Flow::Normal;
      case StmtKind::SetBlock: {
        std::string text;
        Flow f = exec(st.body, scope, text);
        if (f != Flow::Normal) runtime_fail(st.line, "break/continue inside {% set %}");
        scope.set(st.targets[0], Value::string(std::move(text)));
        return Flow::Normal;
      }
      case StmtKind::Macro: {
        Value m;
        m.kind = Kind::Macro;
        m.macro = st.macro.get();
        scope.set(st.macro->name, m);
        return Flow::Normal;
      }
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::Block: return exec(st.body, scope, out);
    }
    return Flow::Normal;
  }

  void assign(const Stmt& st, Value v, Scope& scope) {
    if (!st.attr.empty()) {
      Value* ns = scope.find(st.targets[0]);
      if (!ns || ns->kind != Kind::Namespace)
        runtime_fail(st.line, "cannot assign attribute '" + st.attr + "' on '" + st.targets[0] +
                                  "', which is not a namespace");
      if (!st.attr.empty() && st.attr[0] == '_')
        runtime_fail(st.line, "cannot store underscore-prefixed attribute '" + st.attr + "' on a namespace");
      dict_set(*ns->dict, st.attr, std::move(v));
      return;
    }
    if (st.targets.size() == 1) {
      scope.set(st.targets[0], std::move(v));
      return;
    }
    List items = iterate(v, st.line);
    if (items.size() != st.targets.size())
      runtime_fail(st.line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                                std::to_string(st.targets.size()) + " names");
    for (size_t i = 0; i < items.size(); ++i) scope.set(st.targets[i], items[i]);
  }

  void bind_targets(const Stmt& st, const Value& item, Scope& scope) {
    if (st.targets.size() == 1) {
      scope.set(st.targets[0], item);
      return;
    }
    List parts = iterate(item, st.line);
    if (parts.size() != st.targets.size())
      runtime_fail(st.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                                std::to_string(st.targets.size()) + " loop variables");
    for (size_t i = 0; i < parts.size(); ++i) scope.set(st.targets[i], parts[i]);
  }

  Flow exec_for(const Stmt& st, Scope& scope, std::string& out) {
    Value seq = eval(*st.expr, scope);
    if (seq.kind == Kind::None || seq.is_number() || seq.kind == Kind::Namespace || seq.kind == Kind::Macro)
      runtime_fail(st.line, std::string("'") + type_name(seq) + "' object is not iterable");
    List items = iterate(seq, st.line);
    if (st.filter) {
      List kept;
      for (const auto& it : items) {
        Scope fs(&scope);
        bind_targets(st, it, fs);
        if (truthy(eval(*st.filter, fs))) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(st.else_body, scope, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Scope it(&scope);
      Dict loop = {{"index", Value::integer(i + 1)},         {"index0", Value::integer(i)},
                   {"revindex", Value::integer(n - i)},      {"revindex0", Value::integer(n - i - 1)},
                   {"first", Value::boolean(i == 0)},        {"last", Value::boolean(i == n - 1)},
                   {"length", Value::integer(n)},            {"depth", Value::integer(1)},
                   {"depth0", Value::integer(0)}};
      if (i > 0) loop.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      it.set("loop", Value::new_dict(std::move(loop)));
      bind_targets(st, items[static_cast<size_t>(i)], it);
      Flow f = exec(st.body, it, out);
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  // ---- expressions ----
  Value eval(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case ExprKind::Literal: return e.value;
      case ExprKind::Name: {
        Value* v = scope.find(e.name);
        return v ? *v : Value::undefined(e.name);
      }
      case ExprKind::List: {
        List items;
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return e.name == "tuple" ? Value::new_tuple(std::move(items)) : Value::new_list(std::move(items));
      }
      case ExprKind::Dict: {
        Dict items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], scope);
          if (k.kind != Kind::String) runtime_fail(e.line, "only string keys are supported in dict literals");
          dict_set(items, k.s, eval(*e.args[i + 1], scope));
        }
        return Value::new_dict(std::move(items));
      }
      case ExprKind::GetAttr: return get_attr(eval(*e.args[0], scope), e.name, e.line);
      case ExprKind::GetItem: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope), e.line);
      case ExprKind::Slice: return slice(e, scope);
      case ExprKind::Call: return call(e, scope);
      case ExprKind::Filter: {
        Value v = eval(*e.args[0], scope);
        Args args = eval_args(e, scope);
        Kwargs kw = eval_kwargs(e, scope);
        return apply_filter(e.name, v, args, kw, e.line);
      }
      case ExprKind::Test: {
        Value v = eval(*e.args[0], scope);
        Args args = eval_args(e, scope);
        bool r = apply_test(e.name, v, args, e.line);
        return Value::boolean(e.negated ? !r : r);
      }
      case ExprKind::Not: return Value::boolean(!truthy(eval(*e.args[0], scope)));
      case ExprKind::Neg: {
        Value v = eval(*e.args[0], scope);
        if (v.kind == Kind::Int || v.kind == Kind::Bool) return Value::integer(-(v.kind == Kind::Bool ? v.b : v.i));
        if (v.kind == Kind::Float) return Value::number(-v.f);
        runtime_fail(e.line, std::string("bad operand type for unary -: '") + type_name(v) + "'");
      }
      case ExprKind::Binary: return binary(e, eval(*e.args[0], scope), eval(*e.args[1], scope));
      case ExprKind::Compare: {
        Value lhs = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value rhs = eval(*e.args[i + 1], scope);
          if (!compare(e.ops[i], lhs, rhs, e.line)) return Value::boolean(false);
          lhs = std::move(rhs);
        }
        return Value::boolean(true);
      }
      case ExprKind::And: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? eval(*e.args[1], scope) : a;
      }
      case ExprKind::Or: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? a : eval(*e.args[1], scope);
      }
      case ExprKind::Cond:
        if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value::undefined();
    }
    return Value::undefined();
  }

  Args eval_args(const Expr& e, Scope& scope) {
    Args out;
    for (size_t i = 1; i < e.args.size(); ++i) out.push_back(eval(*e.args[i], scope));
    return out;
  }
  Kwargs eval_kwargs(const Expr& e, Scope& scope) {
    Kwargs out;
    for (const auto& [k, x] : e.kwargs) out.emplace_back(k, eval(*x, scope));
    return out;
  }

  Value slice(const Expr& e, Scope& scope) {
    Value obj = eval(*e.args[0], scope);
    auto bound = [&](const ExprPtr& x, bool& given) -> int64_t {
      given = false;
      if (!x) return 0;
      Value v = eval(*x, scope);
      if (v.kind == Kind::None) return 0;
      if (v.kind != Kind::Int && v.kind != Kind::Bool) runtime_fail(e.line, "slice indices must be integers");
      given = true;
      return v.kind == Kind::Bool ? v.b : v.i;
    };
    bool has_start, has_stop, has_step;
    int64_t start = bound(e.args[1], has_start), stop = bound(e.args[2], has_stop), step = bound(e.args[3], has_step);
    if (!has_step) step = 1;
    if (step == 0) runtime_fail(e.line, "slice step cannot be zero");
    bool is_str = obj.kind == Kind::String;
    std::vector<uint32_t> cps;
    int64_t n;
    if (is_str) {
      cps = utf8_decode(obj.s);
      n = static_cast<int64_t>(cps.size());
    } else if (obj.kind == Kind::List) {
      n = static_cast<int64_t>(obj.list->size());
    } else if (obj.kind == Kind::Undefined) {
      runtime_fail(e.line, "'" + obj.s + "' is undefined");
    } else {
      runtime_fail(e.line, std::string("'") + type_name(obj) + "' object is not subscriptable");
    }
    // Python's slice.indices().
    auto norm = [&](int64_t x, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (x < 0) x += n;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    int64_t b = norm(start, has_start, step > 0 ? 0 : n - 1);
    int64_t en = norm(stop, has_stop, step > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t i = b; step > 0 ? i < en : i > en; i += step) idx.push_back(i);
    if (is_str) {
      std::string out;
      for (int64_t i : idx) utf8_append(out, cps[static_cast<size_t>(i)]);
      return Value::string(std::move(out));
    }
    List out;
    for (int64_t i : idx) out.push_back((*obj.list)[static_cast<size_t>(i)]);
    return Value::new_list(std::move(out));
  }

  Value call(const Expr& e, Scope& scope) {
    const Expr& callee = *e.args[0];
    Args args = eval_args(e, scope);
    Kwargs kw = eval_kwargs(e, scope);
    if (callee.kind == ExprKind::GetAttr) {
      Value obj = eval(*callee.args[0], scope);
      if (obj.kind == Kind::String || obj.kind == Kind::List || obj.kind == Kind::Dict)
        return call_method(obj, callee.name, args, kw, e.line);
      Value fn = get_attr(obj, callee.name, e.line);
      return call_value(fn, args, kw, e.line);
    }
    return call_value(eval(callee, scope), args, kw, e.line);
  }

  Value call_value(const Value& fn, const Args& args, const Kwargs& kw, int line) {
    if (fn.kind == Kind::Builtin) return call_global(fn.s, args, kw, line);
    if (fn.kind == Kind::Macro) return call_macro(*fn.macro, args, kw, line);
    if (fn.kind == Kind::Undefined) runtime_fail(line, "'" + fn.s + "' is undefined");
    runtime_fail(line, std::string("'") + type_name(fn) + "' object is not callable");
  }

  Value call_macro(const MacroDef& m, const Args& args, const Kwargs& kw, int line) {
    if (depth_ >= kMaxDepth) runtime_fail(line, "macro recursion too deep in '" + m.name + "'");
    if (args.size() > m.params.size())
      runtime_fail(line, "macro '" + m.name + "' takes not more than " + std::to_string(m.params.size()) +
                             " argument(s)");
    Scope ms(&root_);
    std::vector<bool> bound(m.params.size(), false);
    for (size_t i = 0; i < args.size(); ++i) {
      ms.set(m.params[i], args[i]);
      bound[i] = true;
    }
    for (const auto& [k, v] : kw) {
      size_t i = 0;
      while (i < m.params.size() && m.params[i] != k) ++i;
      if (i == m.params.size()) runtime_fail(line, "macro '" + m.name + "' has no argument '" + k + "'");
      if (bound[i]) runtime_fail(line, "macro '" + m.name + "' got multiple values for argument '" + k + "'");
      ms.set(k, v);
      bound[i] = true;
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (bound[i]) continue;
      ms.set(m.params[i], m.defaults[i] ? eval(*m.defaults[i], ms) : Value::undefined(m.params[i]));
    }
    std::string out;
    ++depth_;
    Flow f = exec(m.body, ms, out);
    --depth_;
    if (f != Flow::Normal) runtime_fail(line, "break/continue outside a loop in macro '" + m.name + "'");
    return Value::string(std::move(out));
  }

  Value binary(const Expr& e, const Value& a, const Value& b) {
    const std::string& op = e.name;
    if (op == "~") return Value::string(to_str(a) + to_str(b));
    auto bad = [&]() -> Value {
      if (a.is_undefined() || b.is_undefined())
        runtime_fail(e.line, "'" + (a.is_undefined() ? a.s : b.s) + "' is undefined");
      runtime_fail(e.line, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                               type_name(b) + "'");
    };
    if (a.is_number() && b.is_number()) {
      bool ints = a.kind != Kind::Float && b.kind != Kind::Float;
      int64_t x = a.kind == Kind::Bool ? a.b : a.i, y = b.kind == Kind::Bool ? b.b : b.i;
      double fx = a.kind == Kind::Float ? a.f : static_cast<double>(x);
      double fy = b.kind == Kind::Float ? b.f : static_cast<double>(y);
      if (op == "+") return ints ? Value::integer(x + y) : Value::number(fx + fy);
      if (op == "-") return ints ? Value::integer(x - y) : Value::number(fx - fy);
      if (op == "*") return ints ? Value::integer(x * y) : Value::number(fx * fy);
      if (op == "/") {
        if (fy == 0) runtime_fail(e.line, "division by zero");
        return Value::number(fx / fy);
      }
      if (op == "//" || op == "%") {
        if (ints ? y == 0 : fy == 0) runtime_fail(e.line, "integer division or modulo by zero");
        if (ints) {
          int64_t q = x / y, r = x % y;
          if (r != 0 && ((r < 0) != (y < 0))) { q -= 1; r += y; }
          return Value::integer(op == "//" ? q : r);
        }
        double q = std::floor(fx / fy);
        return Value::number(op == "//" ? q : fx - q * fy);
      }
      if (op == "**") {
        if (ints && y >= 0) {
          int64_t r = 1;
          for (int64_t k = 0; k < y; ++k) r *= x;
          return Value::integer(r);
        }
        return Value::number(std::pow(fx, fy));
      }
      return bad();
    }
    if (op == "+" && a.kind == Kind::String && b.kind == Kind::String) return Value::string(a.s + b.s);
    if (op == "+" && a.kind == Kind::List && b.kind == Kind::List) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::new_list(std::move(out));
    }
    if (op == "*" && a.kind == Kind::Int && (b.kind == Kind::String || b.kind == Kind::List)) return binary(e, b, a);
    if (op == "*" && (a.kind == Kind::String || a.kind == Kind::List) && (b.kind == Kind::Int)) {
      if (a.kind == Kind::String) {
        std::string out;
        for (int64_t k = 0; k < b.i; ++k) out += a.s;
        return Value::string(std::move(out));
      }
      List out;
      for (int64_t k = 0; k < b.i; ++k) out.insert(out.end(), a.list->begin(), a.list->end());
      return Value::new_list(std::move(out));
    }
    return bad();
  }

  bool compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in" || op == "not in") {
      bool r = contains(b, a, line);
      return op == "in" ? r : !r;
    }
    if (a.is_undefined() || b.is_undefined())
      runtime_fail(line, "'" + (a.is_undefined() ? a.s : b.s) + "' is undefined");
    try {
      if (op == "<") return less_than(a, b);
      if (op == ">") return less_than(b, a);
      if (op == "<=") return !less_than(b, a);
      if (op == ">=") return !less_than(a, b);
    } catch (const Error& err) {
      runtime_fail(line, err.what());
    }
    runtime_fail(line, "unknown comparison " + op);
  }

  static bool contains(const Value& container, const Value& x, int line) {
    switch (container.kind) {
      case Kind::String:
        if (x.kind != Kind::String)
          runtime_fail(line, std::string("'in <string>' requires string as left operand, not ") + type_name(x));
        return container.s.find(x.s) != std::string::npos;
      case Kind::List:
        for (const auto& v : *container.list)
          if (equals(v, x)) return true;
        return false;
      case Kind::Dict: return x.kind == Kind::String && dict_find(*container.dict, x.s) != nullptr;
      case Kind::Undefined: return false;
      default:
        runtime_fail(line, std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
  }

  Scope root_;
  int depth_ = 0;
};

// Load-time check that every filter and test the template names is one this interpreter has.
void check_names(const Expr* e) {
  if (!e) return;
  if (e->kind == ExprKind::Filter && !filter_known(e->name))
    throw Error("chat template line " + std::to_string(e->line) + ": unsupported filter '" + e->name + "'");
  if (e->kind == ExprKind::Test && !test_known(e->name))
    throw Error("chat template line " + std::to_string(e->line) + ": unsupported test '" + e->name + "'");
  for (const auto& a : e->args) check_names(a.get());
  for (const auto& kv : e->kwargs) check_names(kv.second.get());
}

void check_names(const Body& body) {
  for (const auto& st : body) {
    check_names(st->expr.get());
    check_names(st->filter.get());
    for (const auto& c : st->conds) check_names(c.get());
    for (const auto& b : st->bodies) check_names(b);
    check_names(st->body);
    check_names(st->else_body);
    if (st->macro) {
      for (const auto& d : st->macro->defaults) check_names(d.get());
      check_names(st->macro->body);
    }
  }
}

}  // namespace

Template Template::parse(const std::string& source) {
  Template t;
  std::shared_ptr<Program> p = jinja::parse(lex(source));
  check_names(p->body);
  t.program_ = std::move(p);
  return t;
}

std::string Template::render(const Value& context) const {
  TERN_CHECK(program_ != nullptr, "chat template: render() on an empty template");
  Interpreter in(context);
  return in.run(*program_);
}

}  // namespace tern::jinja
