// Recursive-descent parser of the Jinja2 subset, following jinja2.parser's grammar and operator precedence.
#include <set>

#include "core/check.h"
#include "text/jinja_ast.h"

namespace tern::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& toks) : t_(toks) {}

  std::unique_ptr<Program> program() {
    auto p = std::make_unique<Program>();
    std::string found;
    p->body = body({}, &found, "");
    return p;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("chat template line " + std::to_string(cur().line) + ": " + what);
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::Text: return "text";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "'}}'";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "'%}'";
      case Tok::Eof: return "end of template";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail("expected a name, got " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail("expected '%}', got " + describe(cur()));
    next();
  }

  // ---- statements ----
  // Parses statements until a block tag whose name is in `ends`; consumes "{% name" and stores the name in *found.
  Body body(const std::set<std::string>& ends, std::string* found, const std::string& opener, int open_line = 0) {
    Body out;
    for (;;) {
      const Token& tk = cur();
      if (tk.type == Tok::Eof) {
        if (!ends.empty())
          throw Error("chat template line " + std::to_string(open_line) + ": {% " + opener +
                      " %} is never closed (expected {% " + *ends.rbegin() + " %})");
        return out;
      }
      if (tk.type == Tok::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->line = tk.line;
        s->text = tk.text;
        out.push_back(std::move(s));
        next();
      } else if (tk.type == Tok::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->line = tk.line;
        s->expr = tuple_expr();
        if (cur().type != Tok::VarEnd) fail("expected '}}', got " + describe(cur()));
        next();
        out.push_back(std::move(s));
      } else if (tk.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) fail("expected a statement name after '{%', got " + describe(cur()));
        std::string name = cur().text;
        if (ends.count(name)) {
          next();
          *found = name;
          return out;
        }
        out.push_back(statement());
      } else {
        fail("unexpected " + describe(tk));
      }
    }
  }

  StmtPtr statement() {
    Depth guard(*this);
    int line = cur().line;
    std::string name = next().text;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string found;
    if (name == "if") {
      s->kind = StmtKind::If;
      s->conds.push_back(tuple_expr());
      expect_block_end();
      s->bodies.push_back(body({"elif", "else", "endif"}, &found, "if", line));
      while (found == "elif") {
        s->conds.push_back(tuple_expr());
        expect_block_end();
        s->bodies.push_back(body({"elif", "else", "endif"}, &found, "if", line));
      }
      if (found == "else") {
        expect_block_end();
        s->else_body = body({"endif"}, &found, "if", line);
      }
      expect_block_end();
    } else if (name == "for") {
      s->kind = StmtKind::For;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        next();
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail("expected 'in' in {% for %}, got " + describe(cur()));
      next();
      s->expr = tuple_expr(false);
      if (is_name("if")) {
        next();
        s->filter = expr();
      }
      if (is_name("recursive")) fail("unsupported construct 'recursive' loops");
      expect_block_end();
      s->body = body({"else", "endfor"}, &found, "for", line);
      if (found == "else") {
        expect_block_end();
        s->else_body = body({"endfor"}, &found, "for", line);
      }
      expect_block_end();
    } else if (name == "set") {
      s->targets.push_back(expect_name());
      if (is_op(".")) {
        next();
        s->attr = expect_name();
      }
      while (is_op(",")) {
        next();
        s->targets.push_back(expect_name());
      }
      if (is_op("=")) {
        next();
        s->kind = StmtKind::Set;
        s->expr = tuple_expr();
        expect_block_end();
      } else {
        if (!s->attr.empty() || s->targets.size() != 1) fail("expected '=' in {% set %}");
        if (is_op("|")) fail("unsupported construct: filters on a {% set %} block");
        s->kind = StmtKind::SetBlock;
        expect_block_end();
        s->body = body({"endset"}, &found, "set", line);
        expect_block_end();
      }
    } else if (name == "macro") {
      s->kind = StmtKind::Macro;
      s->macro = std::make_unique<MacroDef>();
      s->macro->line = line;
      s->macro->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!s->macro->params.empty()) expect_op(",");
        if (is_op(")")) break;
        s->macro->params.push_back(expect_name());
        if (is_op("=")) {
          next();
          s->macro->defaults.push_back(expr());
        } else {
          s->macro->defaults.push_back(nullptr);
        }
      }
      next();
      expect_block_end();
      s->macro->body = body({"endmacro"}, &found, "macro", line);
      if (cur().type == Tok::Name) next();  // {% endmacro name %}
      expect_block_end();
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? StmtKind::Break : StmtKind::Continue;
      expect_block_end();
    } else if (name == "generation") {  // transformers' assistant-mask extension: renders its body
      s->kind = StmtKind::Block;
      expect_block_end();
      s->body = body({"endgeneration"}, &found, "generation", line);
      expect_block_end();
    } else if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      throw Error("chat template line " + std::to_string(line) + ": unexpected {% " + name + " %}");
    } else {
      throw Error("chat template line " + std::to_string(line) + ": unsupported construct {% " + name + " %}");
    }
    return s;
  }

  // ---- expressions ----
  ExprPtr make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // `a, b` without brackets is a tuple (a list here).
  ExprPtr tuple_expr(bool with_cond = true) {
    int line = cur().line;
    ExprPtr first = expr(with_cond);
    if (!is_op(",")) return first;
    auto list = make(ExprKind::List, line);
    list->name = "tuple";
    list->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().type == Tok::BlockEnd || cur().type == Tok::VarEnd || is_op(")")) break;
      list->args.push_back(expr(with_cond));
    }
    return list;
  }

  // Nesting guard: a hostile template must not exhaust the stack.
  struct Depth {
    Parser& p;
    explicit Depth(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.fail("expression nested too deeply");
    }
    ~Depth() { --p.depth_; }
  };
  static constexpr int kMaxNesting = 256;

  ExprPtr expr(bool with_cond = true) {
    Depth guard(*this);
    if (!with_cond) return or_expr();
    ExprPtr e = or_expr();
    while (is_name("if")) {
      int line = next().line;
      auto c = make(ExprKind::Cond, line);
      c->args.push_back(or_expr());
      c->args.push_back(std::move(e));
      if (is_name("else")) {
        next();
        c->args.push_back(expr());
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      auto n = make(ExprKind::Or, next().line);
      n->args.push_back(std::move(e));
      n->args.push_back(and_expr());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      auto n = make(ExprKind::And, next().line);
      n->args.push_back(std::move(e));
      n->args.push_back(not_expr());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr not_expr() {
    Depth guard(*this);
    if (is_name("not")) {
      auto n = make(ExprKind::Not, next().line);
      n->args.push_back(not_expr());
      return n;
    }
    return compare();
  }

  ExprPtr compare() {
    int line = cur().line;
    ExprPtr e = math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::Compare, line);
        cmp->args.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }

  ExprPtr binary(ExprPtr lhs, const std::string& op, ExprPtr rhs, int line) {
    auto n = make(ExprKind::Binary, line);
    n->name = op;
    n->args.push_back(std::move(lhs));
    n->args.push_back(std::move(rhs));
    return n;
  }

  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(std::move(e), op.text, concat(), op.line);
    }
    return e;
  }

  ExprPtr concat() {
    ExprPtr e = math2();
    while (is_op("~")) {
      const Token& op = next();
      e = binary(std::move(e), "~", math2(), op.line);
    }
    return e;
  }

  ExprPtr math2() {
    ExprPtr e = pow_expr();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(std::move(e), op.text, pow_expr(), op.line);
    }
    return e;
  }

  ExprPtr pow_expr() {
    ExprPtr e = unary(true);
    while (is_op("**")) {
      const Token& op = next();
      e = binary(std::move(e), "**", unary(true), op.line);
    }
    return e;
  }

  ExprPtr unary(bool with_filter) {
    Depth guard(*this);
    ExprPtr e;
    if (is_op("-")) {
      e = make(ExprKind::Neg, next().line);
      e->args.push_back(unary(false));
    } else if (is_op("+")) {
      next();
      e = unary(false);
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }

  ExprPtr primary() {
    const Token& tk = cur();
    int line = tk.line;
    if (tk.type == Tok::Name) {
      next();
      auto e = make(ExprKind::Literal, line);
      if (tk.text == "true" || tk.text == "True") e->value = Value::boolean(true);
      else if (tk.text == "false" || tk.text == "False") e->value = Value::boolean(false);
      else if (tk.text == "none" || tk.text == "None") e->value = Value::none();
      else {
        e->kind = ExprKind::Name;
        e->name = tk.text;
      }
      return e;
    }
    if (tk.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().text;
      auto e = make(ExprKind::Literal, line);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (tk.type == Tok::Int || tk.type == Tok::Float) {
      next();
      auto e = make(ExprKind::Literal, line);
      try {
        e->value = tk.type == Tok::Int ? Value::integer(std::stoll(tk.text)) : Value::number(std::stod(tk.text));
      } catch (const std::exception&) {
        fail("number out of range: " + tk.text);
      }
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        auto empty = make(ExprKind::List, line);
        empty->name = "tuple";
        return empty;
      }
      ExprPtr e = tuple_expr();
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make(ExprKind::List, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(expr());
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(ExprKind::Dict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(expr());
        expect_op(":");
        e->args.push_back(expr());
      }
      next();
      return e;
    }
    fail("unexpected " + describe(tk) + " in an expression");
  }

  void call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (e.args.size() > 1 || !e.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("unsupported construct: *args / **kwargs in a call");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string k = next().text;
        next();
        e.kwargs.emplace_back(k, expr());
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument");
        e.args.push_back(expr());
      }
    }
    next();
  }

  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      int line = cur().line;
      if (is_op(".")) {
        next();
        auto n = make(ExprKind::GetAttr, line);
        if (cur().type == Tok::Int) {
          n->kind = ExprKind::GetItem;
          auto idx = make(ExprKind::Literal, line);
          idx->value = Value::integer(std::stoll(next().text));
          n->args.push_back(std::move(e));
          n->args.push_back(std::move(idx));
        } else {
          n->name = expect_name();
          n->args.push_back(std::move(e));
        }
        e = std::move(n);
      } else if (is_op("[")) {
        next();
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = expr();
          if (is_op(":") && k < 2) {
            next();
            slice = true;
          } else {
            break;
          }
        }
        expect_op("]");
        auto n = make(slice ? ExprKind::Slice : ExprKind::GetItem, line);
        n->args.push_back(std::move(e));
        if (!slice && !parts[0]) fail("empty subscript");
        n->args.push_back(std::move(parts[0]));
        if (slice) {
          n->args.push_back(std::move(parts[1]));
          n->args.push_back(std::move(parts[2]));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(ExprKind::Call, line);
        n->args.push_back(std::move(e));
        call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  ExprPtr filter_expr(ExprPtr e) {
    for (;;) {
      int line = cur().line;
      if (is_op("|")) {
        next();
        auto n = make(ExprKind::Filter, line);
        n->name = expect_name();
        n->args.push_back(std::move(e));
        if (is_op("(")) call_args(*n);
        e = std::move(n);
      } else if (is_name("is")) {
        next();
        auto n = make(ExprKind::Test, line);
        if (is_name("not")) {
          next();
          n->negated = true;
        }
        n->name = expect_name();
        n->args.push_back(std::move(e));
        if (is_op("(")) {
          call_args(*n);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          ExprPtr arg = primary();
          n->args.push_back(postfix(std::move(arg)));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(ExprKind::Call, line);
        n->args.push_back(std::move(e));
        call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse(const std::vector<Token>& tokens) { return Parser(tokens).program(); }

}  // namespace tern::jinja
