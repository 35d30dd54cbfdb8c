// compile_json_schema: documents accepted and rejected per schema, unsupported and malformed schemas, and a fuzz
// test of random schemas and documents.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <set>

#include "grammar_test_util.h"

namespace tern::grammar {
namespace {

using test::accepts;
using ojson = nlohmann::ordered_json;

struct Case {
  const char* schema;
  std::vector<std::string> valid, invalid;
};

void check_case(const Case& c) {
  ojson schema = ojson::parse(c.schema);
  GrammarPtr g = compile_json_schema(schema);
  for (const auto& doc : c.valid) EXPECT_TRUE(accepts(g, doc)) << c.schema << "\nshould accept " << doc;
  for (const auto& doc : c.invalid) EXPECT_FALSE(accepts(g, doc)) << c.schema << "\nshould reject " << doc;
}

TEST(JsonSchema, ScalarsAndWhitespace) {
  check_case({R"({"type":"string"})",
              {R"("")", R"("hi")", R"("a\"b\\c\n")", "\"é中😀\"", "\n\n\"x\"", R"("tab\there")", R"("\u001f")"},
              {R"("raw)" "\n" R"(newline")", R"("\q")", "hi", R"("unterminated)", "\n\n\n\n\n\"x\"", R"(1)"}});
  check_case({R"({"type":"integer"})", {"0", "-7", "123456789012345678"}, {"01", "-0", "1.5", "1e3", "\"1\"", "1234567890123456789"}});
  check_case({R"({"type":"number"})", {"0", "-0.5", "3.25e-10", "1E+5", "-12"}, {".5", "1.", "+1", "1e", "NaN", "0x10"}});
  check_case({R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "null"}});
  check_case({R"({"type":"null"})", {"null"}, {"nul", "\"null\""}});
  check_case({R"({"type":["string","null"]})", {"null", R"("x")"}, {"1", "true"}});
  check_case({R"({"type":"string","nullable":true})", {"null", R"("x")"}, {"1"}});
}

TEST(JsonSchema, Objects) {
  const char* person = R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
      "email":{"type":"string"}},"required":["name","age"],"additionalProperties":false})";
  check_case({person,
              {R"({"name":"Ann","age":31})", R"({"name": "Ann", "age": 31, "email": "a@b.c"})", R"({"name":"A","age":1,"email":"x"})"},
              {R"({"age":31,"name":"Ann"})",               // out of the schema's order
               R"({"name":"Ann"})",                        // missing required
               R"({"name":"Ann","age":31,"extra":1})",     // additionalProperties false
               R"({"name":"Ann","age":"31"})",             // wrong type
               R"({"name":"Ann","age":31,})", R"({"name":"Ann",  "age":31})", R"({ "name":"Ann","age":31})"}});
  // Optional properties only, in order, any subset.
  check_case({R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}}})",
              {"{}", R"({"a":1})", R"({"b":2})", R"({"a":1,"c":3})", R"({"a":1,"b":2,"c":3})"},
              {R"({"c":3,"a":1})", R"({,"a":1})", R"({"a":1,,"b":2})", R"({"d":4})"}});
  // additionalProperties as a schema: extra keys other than the declared ones, with that schema's values.
  check_case({R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],"additionalProperties":{"type":"boolean"}})",
              {R"({"id":1})", R"({"id":1,"x":true})", R"({"id":1,"ide":false,"i":true,"idx":true})"},
              {R"({"id":1,"x":1})", R"({"id":1,"id":true})", R"({"x":true})"}});
  // Any object.
  check_case({R"({"type":"object"})", {"{}", R"({"a":[1,{"b":null}],"c":"d"})"}, {"[]", R"({"a"})", R"({"a":})"}});
}

TEST(JsonSchema, Arrays) {
  check_case({R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})",
              {"[1]", "[1, 2]", "[1,2,3]"}, {"[]", "[1,2,3,4]", "[1,]", "[\"a\"]"}});
  check_case({R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
              {"[]", R"(["a"])", R"(["a",1])"}, {R"([1])", R"(["a",1,2])", R"(["a","b"])"}});
  check_case({R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"boolean"},"minItems":2})",
              {R"(["a",true])", R"(["a",true,false])"}, {R"(["a"])", R"([true,true])"}});
  check_case({R"({"type":"array","items":{"type":"integer"},"maxItems":0})", {"[]"}, {"[1]"}});
}

TEST(JsonSchema, StringConstraints) {
  check_case({R"({"type":"string","minLength":2,"maxLength":3})", {R"("ab")", R"("abc")", "\"éé\"", R"("\n\t")"},
              {R"("a")", R"("abcd")", "\"éééé\""}});
  check_case({R"({"type":"string","pattern":"^[A-Z]{3}-\\d{4}$"})", {R"("ABC-1234")"},
              {R"("AB-1234")", R"("ABC-12345")", R"("abc-1234")"}});
  check_case({R"({"type":"string","pattern":"a\"b\\\\c"})", {R"("a\"b\\c")"}, {R"("a"b\c")"}});
  check_case({R"({"type":"string","format":"date"})", {R"("2024-02-29")", R"("1999-12-31")"},
              {R"("2024-13-01")", R"("2024-04-31")", R"("2024-1-01")", R"("24-01-01")"}});
  check_case({R"({"type":"string","format":"date-time"})", {R"("2024-05-01T12:30:00Z")", R"("2024-05-01T23:59:59.123+02:00")"},
              {R"("2024-05-01 12:30:00Z")", R"("2024-05-01T24:00:00Z")"}});
  check_case({R"({"type":"string","format":"time"})", {R"("08:00:00Z")"}, {R"("8:00")"}});
  check_case({R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
              {R"("123e4567e89b12d3a456426614174000")"}});
  check_case({R"({"type":"string","format":"email"})", {R"("john.doe@example.com")"}, {R"("john@")", R"("@x.com")"}});
}

TEST(JsonSchema, EnumConstCombinators) {
  check_case({R"({"enum":["red","green",3,null,{"a":[1]}]})", {R"("red")", "3", "null", R"({"a":[1]})"}, {R"("blue")", "4", R"({"a": [1]})"}});
  check_case({R"({"type":"string","enum":["a","b",1]})", {R"("a")"}, {"1"}});
  check_case({R"({"const":"fixed"})", {R"("fixed")"}, {R"("other")"}});
  check_case({R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})", {"5", R"("x")"}, {R"("xy")", "true"}});
  check_case({R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"1"}});
  check_case({R"({"allOf":[{"type":"integer","minimum":3,"maximum":12}]})", {"3", "12", "7"}, {"2", "13", "-5"}});
  check_case({R"({"type":"integer","minimum":-15,"exclusiveMaximum":100})", {"-15", "0", "99", "-9"}, {"-16", "100", "1000"}});
}

TEST(JsonSchema, NumberRanges) {
  check_case({R"({"type":"number","minimum":0,"maximum":1})", {"0", "1", "0.5", "0.25", "0.50", "1.0", "0.0"},
              {"-0.5", "1.5", "2", "1e-3", "-1", "1.01", "-0", "-0.0"}});
  check_case({R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":10})", {"1", "9", "0.1", "9.99"},
              {"0", "10", "10.5", "-0.1"}});
  check_case({R"({"type":"number","minimum":-2.5,"maximum":-1})", {"-2", "-1", "-1.5"}, {"-3", "0", "-0.5", "-1.25e0"}});
  check_case({R"({"type":"number","minimum":100})", {"100", "123456.75"}, {"99", "99.9", "-100"}});
  check_case({R"({"type":"integer","exclusiveMinimum":0})", {"1", "42"}, {"0", "-1"}});
  // Bounds that are not whole numbers: the fractions at each end are bounded digit by digit.
  check_case({R"({"type":"number","minimum":0.25,"maximum":1})", {"0.25", "0.250", "0.3", "0.999", "1", "1.000"},
              {"0.24", "0.2", "0.249999", "1.01", "0", "2"}});
  check_case({R"({"type":"number","minimum":2.5,"maximum":3.5})", {"2.5", "3", "3.25", "3.5", "2.6", "3.49"},
              {"2.49", "3.51", "2", "4", "3.500001"}});
  check_case({R"({"type":"number","minimum":-0.5,"maximum":0.5})", {"-0.5", "0", "0.1", "-0.25", "0.5", "-0.01"},
              {"-0.51", "0.6", "1", "-1", "-0", "-0.0"}});
  check_case({R"({"type":"number","minimum":0.5,"maximum":0.9})", {"0.5", "0.75", "0.9", "0.8999"},
              {"0.91", "0.4", "1", "0", "0.49"}});
  check_case({R"({"type":"number","minimum":0.1,"maximum":0.2})", {"0.1", "0.15", "0.2", "0.1999"}, {"0.09", "0.21", "0"}});
  check_case({R"({"type":"number","minimum":-1.5,"maximum":-1.25})", {"-1.5", "-1.3", "-1.25", "-1.4999"},
              {"-1.2", "-1.6", "-1", "-1.51", "-1.249"}});
  check_case({R"({"type":"number","minimum":1e-5,"maximum":2e-5})", {"0.00001", "0.000015", "0.00002"},
              {"0.00003", "0.000009", "0", "0.0000201"}});
  check_case({R"({"type":"number","exclusiveMinimum":0.5,"maximum":1})", {"0.51", "0.5000001", "1", "0.6"},
              {"0.5", "0.50", "0.500", "0.4", "1.1"}});
  check_case({R"({"type":"number","minimum":-1,"exclusiveMaximum":0.5})", {"0.4999", "0", "-1", "-0.5", "0.49"},
              {"0.5", "0.500", "0.6", "-1.01"}});
  check_case({R"({"type":"number","minimum":3,"maximum":3})", {"3", "3.0", "3.00"}, {"2.9", "3.01", "4"}});
  check_case({R"({"type":"number","exclusiveMinimum":3,"exclusiveMaximum":4})", {"3.5", "3.01", "3.99"},
              {"3", "4", "3.0", "4.0"}});
}

// Random bounds (whole, one-decimal, two-decimal and tiny; open or closed; one side missing): every number the grammar
// generates (random walks to the end) lies inside the range, and no walk reaches a dead end.
TEST(JsonSchema, RandomNumberRangesGenerateOnlyValuesInside) {
  std::mt19937_64 rng(test::fresh_seed());
  auto bound = [&] {
    const double scale[] = {1.0, 0.1, 0.01, 1e-5};
    return double(int64_t(rng() % 4001) - 2000) * scale[rng() % 4];
  };
  int walks = 0;
  for (int i = 0; i < 150; ++i) {
    double a = bound(), b = bound();
    if (a > b) std::swap(a, b);
    ojson schema = {{"type", "number"}};
    const int sides = int(rng() % 3);  // 0: both, 1: lower only, 2: upper only
    const bool a_open = rng() % 2, b_open = rng() % 2;
    if (sides != 2) schema[a_open ? "exclusiveMinimum" : "minimum"] = a;
    if (sides != 1) schema[b_open ? "exclusiveMaximum" : "maximum"] = b;
    GrammarPtr g;
    try {
      g = compile_json_schema(schema);
    } catch (const SchemaError&) {
      EXPECT_TRUE(sides == 0 && (a == b) && (a_open || b_open)) << schema.dump();  // only an empty range is refused
      continue;
    }
    for (int k = 0; k < 4; ++k) {
      test::WalkResult w = test::random_walk(g, test::byte_vocab(), rng, 200, int(rng() % 30));
      ASSERT_FALSE(w.dead_end) << schema.dump() << " after " << w.text;
      ASSERT_TRUE(w.ended) << schema.dump() << " not finished: " << w.text;
      const double x = std::stod(w.text);
      if (sides != 2) {
        EXPECT_TRUE(a_open ? x > a : x >= a) << schema.dump() << " generated " << w.text;
      }
      if (sides != 1) {
        EXPECT_TRUE(b_open ? x < b : x <= b) << schema.dump() << " generated " << w.text;
      }
      ++walks;
    }
  }
  EXPECT_GT(walks, 400);
}

// An empty range (a > b, or a = b with an open end) is a clear error, not a grammar that cannot finish.
TEST(JsonSchema, EmptyNumberRangesAreRefused) {
  for (const char* schema : {R"({"type":"number","minimum":2,"maximum":1})",
                             R"({"type":"number","minimum":1,"exclusiveMaximum":1})",
                             R"({"type":"number","exclusiveMinimum":0.5,"exclusiveMaximum":0.5})"})
    EXPECT_THROW(compile_json_schema(ojson::parse(schema)), SchemaError) << schema;
}

TEST(JsonSchema, RefsAndRecursion) {
  const char* tree = R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
      "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["value","children"],"additionalProperties":false}},
      "$ref":"#/$defs/node"})";
  check_case({tree,
              {R"({"value":1,"children":[]})", R"({"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]}]})"},
              {R"({"value":1})", R"({"value":1,"children":[{"value":2}]})"}});
  check_case({R"({"definitions":{"a":{"type":"string"}},"type":"array","items":{"$ref":"#/definitions/a"}})", {R"(["x"])"}, {"[1]"}});
  // A list that refers to the root.
  check_case({R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["next"]})",
              {R"({"next":null})", R"({"next":{"next":null}})"}, {R"({"next":{}})"}});
}

void expect_schema_error(const char* schema, const std::string& keyword) {
  try {
    compile_json_schema(ojson::parse(schema));
    ADD_FAILURE() << "no error for " << schema;
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.keyword(), keyword) << schema << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("/"), std::string::npos) << e.what();  // names the path
  }
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  expect_schema_error(R"({"not":{"type":"string"}})", "not");
  expect_schema_error(R"({"type":"object","properties":{"a":{"if":{}}}})", "if");
  expect_schema_error(R"({"type":"object","patternProperties":{"^a":{}}})", "patternProperties");
  expect_schema_error(R"({"type":"object","dependentRequired":{}})", "dependentRequired");
  expect_schema_error(R"({"type":"number","multipleOf":2})", "multipleOf");
  expect_schema_error(R"({"type":"string","format":"hostname"})", "format");
  expect_schema_error(R"({"allOf":[{"type":"string"},{"maxLength":2}]})", "allOf");
  expect_schema_error(R"({"type":"object","minProperties":1})", "minProperties");
  // Annotations are fine.
  EXPECT_NO_THROW(compile_json_schema(ojson::parse(
      R"({"$schema":"x","$id":"y","title":"t","description":"d","default":1,"examples":[1],"$comment":"c",
          "deprecated":false,"readOnly":false,"writeOnly":false,"type":"integer"})")));
  // The path names where the keyword sits.
  try {
    compile_json_schema(ojson::parse(R"({"type":"object","properties":{"a~b":{"not":{}}}})"));
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("/properties/a~0b/not"), std::string::npos) << e.what();
  }
}

// uniqueItems: accepted everywhere; enforced where the items are listed values (enum / const) and the sets of values
// an array may hold are at most kMaxUniqueSets.
TEST(JsonSchema, UniqueItems) {
  // Not enforced: free items, or uniqueItems false.
  check_case({R"({"type":"array","items":{"type":"integer"},"uniqueItems":true})", {"[1,1]", "[1, 2]", "[]"}, {"[\"a\"]"}});
  check_case({R"({"type":"array","items":{"enum":["a","b"]},"uniqueItems":false})", {R"(["a","a"])"}, {R"(["c"])"}});
  check_case({R"({"uniqueItems":true})", {"[1,1]", "[]"}, {"1", "{}"}});  // implies an array, as minItems does
  // Enforced over an enum: each value once, in any order, the count bounds kept.
  check_case({R"({"type":"array","items":{"enum":["a","b","c"]},"uniqueItems":true})",
              {"[]", R"(["a"])", R"(["b", "a"])", R"(["c","a","b"])"},
              {R"(["a","a"])", R"(["a","b","a"])", R"(["d"])", R"(["a",])", R"([,"a"])"}});
  check_case({R"({"type":"array","items":{"enum":[1,2,3,12]},"uniqueItems":true,"minItems":2,"maxItems":2})",
              {"[1,2]", "[12,1]", "[1, 12]"}, {"[1]", "[1,1]", "[1,2,3]", "[12,12]"}});
  // pydantic's set[Color]: the enum behind a $ref; a const; type filtering and nullable as for one value.
  check_case({R"({"$defs":{"Color":{"enum":["red","green"],"title":"Color","type":"string"}},"type":"object",
                  "properties":{"colors":{"items":{"$ref":"#/$defs/Color"},"type":"array","uniqueItems":true}},
                  "required":["colors"],"additionalProperties":false})",
              {R"({"colors":["green","red"]})", R"({"colors":[]})"}, {R"({"colors":["red","red"]})"}});
  check_case({R"({"type":"array","items":{"const":7},"uniqueItems":true})", {"[]", "[7]"}, {"[7,7]"}});
  check_case({R"({"type":"array","items":{"type":"boolean"},"uniqueItems":true,"minItems":2})",
              {"[true,false]", "[false, true]"}, {"[true,true]", "[false]", "[true,false,true]"}});
  check_case({R"({"type":"array","items":{"type":["boolean","null"]},"uniqueItems":true})",
              {"[null,false,true]"}, {"[null,null]"}});
  check_case({R"({"type":"array","items":{"enum":["a",1,"a"],"type":"string","nullable":true},"uniqueItems":true})",
              {R"(["a",null])", R"([null])"}, {"[1]", R"(["a","a"])", "[null,null]"}});
  // More values than can be unique: nothing is valid.
  expect_schema_error(R"({"type":"array","items":{"enum":[1,2]},"uniqueItems":true,"minItems":3})", "schema");
  expect_schema_error(R"({"type":"array","uniqueItems":"yes"})", "uniqueItems");
  // 20 values: 2^20 sets is too many (not enforced); at most 2 items, 211 sets (enforced).
  ojson many = ojson::array();
  for (int i = 0; i < 20; ++i) many.push_back(i);
  ojson schema = {{"type", "array"}, {"items", {{"enum", many}}}, {"uniqueItems", true}};
  EXPECT_TRUE(accepts(compile_json_schema(schema), "[3,3]"));
  schema["maxItems"] = 2;
  EXPECT_FALSE(accepts(compile_json_schema(schema), "[3,3]"));
  EXPECT_TRUE(accepts(compile_json_schema(schema), "[3,19]"));
}

TEST(JsonSchema, UniqueItemsRandomWalksNeverRepeatAValue) {
  std::mt19937_64 rng(test::fresh_seed());
  const ojson schema = ojson::parse(R"({"type":"array","items":{"enum":["x","xy","y",1,10,true,null]},"uniqueItems":true,"minItems":1})");
  GrammarPtr g = compile_json_schema(schema);
  size_t longest = 0;
  for (int i = 0; i < 200; ++i) {
    test::WalkResult w = test::random_walk(g, test::byte_vocab(), rng, 300, int(rng() % 60));
    ASSERT_FALSE(w.dead_end) << w.text;
    ASSERT_TRUE(w.ended) << w.text;
    const ojson doc = ojson::parse(w.text);
    std::string why;
    ASSERT_TRUE(test::validate(doc, schema, schema, &why)) << why;
    std::set<std::string> seen;
    for (const ojson& v : doc) EXPECT_TRUE(seen.insert(v.dump()).second) << "repeated value in " << w.text;
    longest = std::max(longest, doc.size());
  }
  EXPECT_GE(longest, 4u);  // the walks reach arrays where a repeat was on offer
}

TEST(JsonSchema, MalformedSchemasThrow) {
  expect_schema_error(R"({"type":5})", "type");
  expect_schema_error(R"({"type":"strin"})", "type");
  expect_schema_error(R"({"type":"object","properties":[]})", "properties");
  expect_schema_error(R"({"type":"object","required":"a"})", "required");
  expect_schema_error(R"({"$ref":"#/$defs/missing"})", "$ref");
  expect_schema_error(R"({"$ref":"http://example.com/s.json"})", "$ref");
  expect_schema_error(R"({"type":"array","minItems":3,"maxItems":2})", "maxItems");
  expect_schema_error(R"({"type":"array","minItems":-1})", "minItems");
  expect_schema_error(R"({"type":"string","pattern":"(a"})", "pattern");
  expect_schema_error(R"({"type":"string","pattern":5})", "pattern");
  expect_schema_error(R"({"enum":[]})", "enum");
  expect_schema_error(R"({"type":"object","properties":{"a":{}},"required":["b"],"additionalProperties":false})", "required");
  // Required but undeclared, with additionalProperties absent: allowed, any value.
  EXPECT_TRUE(test::accepts(compile_json_schema(ojson::parse(R"({"properties":{"a":{}},"required":["b"]})")), R"({"b":[1]})"));
  expect_schema_error(R"(false)", "schema");
  expect_schema_error(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "schema");
  expect_schema_error(R"({"type":"string","maxLength":100000000})", "maxLength");
}

TEST(JsonSchema, DeepNestingIsAnErrorNotACrash) {
  ojson s = {{"type", "integer"}};
  for (int i = 0; i < 5000; ++i) s = ojson{{"type", "array"}, {"items", std::move(s)}};
  EXPECT_THROW(compile_json_schema(s), SchemaError);
  // A long chain of references.
  ojson defs = ojson::object();
  for (int i = 0; i < 500; ++i) defs["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  defs["d500"] = {{"type", "null"}};
  ojson chain = {{"$defs", defs}, {"$ref", "#/$defs/d0"}};
  EXPECT_THROW(compile_json_schema(chain), SchemaError);
}

TEST(JsonSchema, GrammarSizeLimitIsASchemaError) {
  // Small alternatives that pass the element limit only when the top rule is lowered (not inside value()).
  ojson alts = ojson::array();
  for (int i = 1; i < 2000; ++i) alts.push_back({{"type", "string"}, {"pattern", "[a-z]{" + std::to_string(i) + "}"}});
  EXPECT_THROW(compile_json_schema(ojson{{"anyOf", alts}}), SchemaError);
}

// Random JSON values built from a vocabulary of schema-ish keys and values.
ojson random_json(std::mt19937_64& rng, int depth) {
  static const char* keys[] = {"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "allOf",
                               "$ref", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
                               "additionalProperties", "prefixItems", "nullable", "minimum", "maximum", "$defs",
                               "uniqueItems", "a", "b"};
  static const char* strings[] = {"string", "object", "array", "integer", "number", "boolean", "null", "#", "#/$defs/a",
                                  "#/properties/a", "[a-z]+", "(", "date", "uuid", "a", "b", "\\d{2,}", ""};
  int kind = static_cast<int>(rng() % (depth > 3 ? 5 : 8));
  switch (kind) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng() % 7) - 2;
    case 3: return 0.5 * static_cast<double>(rng() % 5);
    case 4: return strings[rng() % (sizeof strings / sizeof *strings)];
    case 5: {
      ojson a = ojson::array();
      for (size_t i = 0, n = rng() % 4; i < n; ++i) a.push_back(random_json(rng, depth + 1));
      return a;
    }
    default: {
      ojson o = ojson::object();
      for (size_t i = 0, n = rng() % 4; i < n; ++i) o[keys[rng() % (sizeof keys / sizeof *keys)]] = random_json(rng, depth + 1);
      return o;
    }
  }
}

TEST(JsonSchema, FuzzRandomSchemasAndDocuments) {
  std::mt19937_64 rng(test::fresh_seed());
  int compiled = 0, errors = 0;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3000; ++i) {
    ojson schema = random_json(rng, 0);
    GrammarPtr g;
    try {
      g = compile_json_schema(schema);
      ++compiled;
    } catch (const SchemaError& e) {
      ++errors;
      ASSERT_FALSE(e.keyword().empty());
      continue;
    }
    for (int k = 0; k < 5; ++k) {
      std::string doc = random_json(rng, 2).dump();
      Matcher m(g, test::byte_vocab());
      (void)m.accept_bytes(doc);
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("compiled %d, refused %d, %.2f s\n", compiled, errors, s);
  EXPECT_GT(compiled, 100);
  EXPECT_GT(errors, 100);
}

}  // namespace
}  // namespace tern::grammar
