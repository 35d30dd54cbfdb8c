// The Jinja2-subset interpreter: whitespace control, expressions, statements, filters, tests and errors. Expected
// strings are what jinja2 (trim_blocks, lstrip_blocks, transformers' tojson) prints for the same template.
#include <gtest/gtest.h>

#include "text/jinja.h"

namespace tern::jinja {
namespace {

std::string render(const std::string& src, const char* ctx_json = "{}") {
  return Template::parse(src).render(from_json(nlohmann::ordered_json::parse(ctx_json)));
}

std::string error_of(const std::string& src, const char* ctx_json = "{}") {
  try {
    render(src, ctx_json);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, WhitespaceControlTrimAndLstripBlocks) {
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("{{ 1 }}  {% if true %}x{% endif %}"), "1  x");       // lstrip only at line start
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");              // {%+ keeps the indent
  EXPECT_EQ(render("a {# note #}\nb"), "a b");                            // comment eats its newline
  EXPECT_EQ(render("x\n"), "x");                                          // keep_trailing_newline=False
  EXPECT_EQ(render("x\r\ny"), "x\ny");
  EXPECT_EQ(render("{{- ' a ' -}}\n"), " a ");
}

TEST(Jinja, ExpressionsFollowPython) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2.5 }}"),
            "3 -4 -2 3.5 1024 3.5");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ true }}"), "a1NoneTrue");
  EXPECT_EQ(render("{{ [1, 'x', none, true, {'k': 'v'}] }}"), "[1, 'x', None, True, {'k': 'v'}]");
  EXPECT_EQ(render("{{ 1 if false }}|{{ 'y' if 0 else 'n' }}|{{ 0 or 'z' }}|{{ 1 and 2 }}"), "|n|z|2");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 'ab' in 'cabd' }} {{ 3 not in [1, 2] }} {{ 1 == 1.0 }} {{ true == 1 }}"),
            "True True True True True");
  EXPECT_EQ(render("{{ 'héllo'[1] }}{{ 'héllo'[-1] }}{{ 'héllo'[1:3] }}{{ 'abcdef'[::-2] }}{{ [1,2,3][::-1] }}"),
            "éoélfdb[3, 2, 1]");
  EXPECT_EQ(render("{{ 1e-05 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 100.0 }} {{ 1.5e300 }}"),
            "1e-05 1e+16 0.30000000000000004 100.0 1.5e+300");
  EXPECT_EQ(render("{{ m.a.b }}|{{ m['a']['c'] }}|{{ m.missing }}|{{ none.x }}", R"({"m":{"a":{"b":1}}})"), "1|||");
}

TEST(Jinja, StringMethods) {
  EXPECT_EQ(render("{{ ' a b '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\n\nq\n'.lstrip('\n') }}|{{ 'a,b,,c'.split(',') }}"),
            "a b|hi|q\n|['a', 'b', '', 'c']");
  EXPECT_EQ(render("{{ '  a  b '.split() }}|{{ 'a</think>b</think>c'.split('</think>')[-1] }}|{{ 'x'.upper() }}"),
            "['a', 'b']|c|X");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'bc')) }}{{ 'aaa'.replace('a', 'b', 2) }}"),
            "TrueTruebba");
  EXPECT_EQ(render("{{ '\u3000 中文 \u3000'|trim }}|{{ 'ÉCOLE'|lower }}|{{ 'hello world'|title }}"),
            "中文|école|Hello World");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(render(R"({{ {"b": 1, "a": [true, none, 1.0, "é\"\n"]}|tojson }})"),
            R"({"b": 1, "a": [true, null, 1.0, "é\"\n"]})");
  EXPECT_EQ(render("{{ {'a': [1, {'b': 2}]}|tojson(indent=2) }}"), "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}");
  EXPECT_EQ(render("{{ 'abc'|length }}{{ 'é'|length }}{{ [1,2]|count }}{{ x|length }}"), "3120");
  EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", R"({"d":{"z":1,"a":2}})"), "z=1;a=2;");
  EXPECT_EQ(render("{{ [3,1,2]|sort|join(',') }} {{ ['b','A','c']|sort|first }} {{ [1,2,3]|last }} {{ []|first }}"),
            "1,2,3 A 3 ");
  EXPECT_EQ(render("{{ x|default('d') }} {{ ''|default('e', true) }} {{ 3.7|int }} {{ '12'|int + 1 }} {{ 'x'|int(5) }}"),
            "d e 3 13 5");
  EXPECT_EQ(render("{{ items|map(attribute='n')|join }} {{ items|selectattr('n', 'equalto', 'b')|list|length }}",
                   R"({"items":[{"n":"a"},{"n":"b"}]})"),
            "ab 1");
  EXPECT_EQ(render("{{ [1, 2, 3, 4]|select('even')|list }} {{ [1, 2]|reject('odd')|list }} {{ 'a<b'|e }}"),
            "[2, 4] [2] a&lt;b");
  EXPECT_EQ(render("{{ true|string }}{{ 5|string|length }}{{ [1]|string }}"), "True1[1]");
}

TEST(Jinja, Tests) {
  EXPECT_EQ(render("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 's' is string }}{{ {} is mapping }}"),
            "FalseTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ [] is iterable }}{{ 's' is iterable }}{{ none is iterable }}{{ x is iterable }}{{ {} is sequence }}"),
            "TrueTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ true is true }}{{ 1 is true }}{{ 1 is number }}{{ true is number }}{{ true is integer }}"),
            "TrueFalseTrueTrueFalse");
  EXPECT_EQ(render("{{ 4 is divisibleby 2 }}{{ 3 is odd }}{{ 'a' is not string }}{{ 1 is sameas 1 }}"),
            "TrueTrueFalseTrue");
}

TEST(Jinja, LoopsScopesMacrosNamespaces) {
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }}|{% endfor %}"),
            "0TrueFalse3|1FalseFalse2|2FalseTrue1|");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}"), "-2;1-3;2-;");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}"), "2242");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  // A set inside a loop does not leak out; a namespace carries state across iterations.
  EXPECT_EQ(render("{% set a = 1 %}{% set ns = namespace(n=0) %}{% for x in [1,2] %}{% set a = 5 %}"
                   "{% set ns.n = ns.n + x %}{% endfor %}{{ a }} {{ ns.n }}"),
            "1 3");
  EXPECT_EQ(render("{% macro m(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}{{ g }}]{% endmacro %}{% set g = 'G' %}"
                   "{{ m(1) }}{{ m(1, c='y') }}{{ m(1, 3)|trim }}"),
            "[12zG][12yG][13zG]");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}x{{ a }}{% endset %}{{ t }}"), "12x1");
  EXPECT_EQ(render("{% generation %}gen{% endgeneration %}"), "gen");
}

TEST(Jinja, ErrorsNameTheConstructAndLine) {
  EXPECT_NE(error_of("a\n{% include 'x' %}").find("line 2: unsupported construct {% include %}"), std::string::npos);
  EXPECT_NE(error_of("\n\n{{ x|nosuchfilter }}").find("line 3: unsupported filter 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(error_of("{{ x is nosuchtest }}").find("unsupported test 'nosuchtest'"), std::string::npos);
  EXPECT_NE(error_of("{% if x %}\nno end").find("line 1: {% if %} is never closed"), std::string::npos);
  EXPECT_NE(error_of("{% endfor %}").find("unexpected {% endfor %}"), std::string::npos);
  EXPECT_NE(error_of("{{ (1 }}").find("line 1"), std::string::npos);
  EXPECT_NE(error_of("\n{{ x.y.z }}").find("line 2"), std::string::npos);   // attribute of undefined
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(error_of("{{ d|items }}", R"({"d":"str"})").find("Can only get item pairs from a mapping"), std::string::npos);
  EXPECT_NE(error_of("{{ [].append(1) }}").find("unsupported list method 'append'"), std::string::npos);
  try {
    render("{{ raise_exception('Bad input: ' ~ 3) }}");
    FAIL() << "no exception";
  } catch (const TemplateException& e) {
    EXPECT_STREQ(e.what(), "Bad input: 3");
  }
}

}  // namespace
}  // namespace tern::jinja
