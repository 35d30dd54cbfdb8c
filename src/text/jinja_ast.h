// Tokens and syntax tree of the Jinja2 subset (see jinja.h for what is covered).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/jinja_value.h"

namespace tern::jinja {

// ---- tokens (jinja_lexer.cpp) ----
enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // Text data, name, operator, decoded string literal, number spelling
  int line;
};

// Splits a template into tokens the way Jinja's lexer does with trim_blocks and lstrip_blocks on (transformers'
// settings): whitespace control (-, +), comments dropped, one trailing newline of the source dropped.
std::vector<Token> lex(const std::string& source);

// ---- expressions ----
struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,   // value
  Name,      // name
  List,      // args
  Dict,      // kwargs: key expr in args[2i], value in args[2i+1]
  GetAttr,   // args[0] . name
  GetItem,   // args[0] [ args[1] ]
  Slice,     // args[0] [ args[1] : args[2] : args[3] ]  (null entries allowed)
  Call,      // args[0] ( args[1..], kwargs )
  Filter,    // args[0] | name ( args[1..], kwargs )
  Test,      // args[0] is [not] name ( args[1..] )
  Not,       // not args[0]
  Neg,       // - args[0]
  Binary,    // args[0] op args[1]: + - * / // % ** ~
  Compare,   // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in, not in
  And, Or,   // args[0] and/or args[1]
  Cond,      // args[1] if args[0] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                       // Literal
  std::string name;                  // Name, GetAttr, Filter, Test; Binary operator
  bool negated = false;              // Test: `is not`
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;      // Compare
};

// ---- statements ----
struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Block };

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param; null when none
  Body body;
  int line = 0;
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                   // Text
  ExprPtr expr;                       // Output; For: iterable; Set: value
  // If: conds[i] guards bodies[i]; else_body when all fail.
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;                          // For, SetBlock, Block
  Body else_body;                     // If, For
  std::vector<std::string> targets;   // For / Set / SetBlock names; Set: namespace attribute when attr non-empty
  std::string attr;                   // Set: {% set ns.attr = ... %}
  ExprPtr filter;                     // For: {% for x in y if cond %}
  std::unique_ptr<MacroDef> macro;    // Macro
};

struct Program {
  Body body;
};

// Parses tokens into a program; throws tern::Error naming the construct and its line.
std::unique_ptr<Program> parse(const std::vector<Token>& tokens);

}  // namespace tern::jinja
