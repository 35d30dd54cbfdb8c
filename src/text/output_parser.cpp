#include "text/output_parser.h"

#include <algorithm>
#include <cstdio>

#include "text/json_ref.h"

namespace tern {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Length of the longest suffix of s that is a proper prefix of tag (text that may still become the tag).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, size_t pos, std::string_view p) { return s.substr(pos, p.size()) == p; }

}  // namespace

OutputParser::OutputParser(bool starts_in_reasoning, nlohmann::ordered_json tools, uint64_t seed)
    : mode_(starts_in_reasoning ? Mode::Reasoning : Mode::Content),
      tools_(std::move(tools)),
      rng_(seed ? seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {}

std::string OutputParser::new_id() {
  char b[32];
  uint64_t x = rng_(), y = rng_();
  std::snprintf(b, sizeof b, "%016llx%08llx", static_cast<unsigned long long>(x),
                static_cast<unsigned long long>(y & 0xffffffffULL));
  return std::string("call_") + b;
}

ParsedDelta OutputParser::push(std::string_view text) {
  ParsedDelta out;
  buf_.append(text.data(), text.size());
  process(out);
  return out;
}

void OutputParser::emit_content(ParsedDelta& out, std::string_view text) {
  if (text.empty()) return;
  size_t end = text.size();
  while (end > 0 && is_ws(text[end - 1])) --end;
  if (end == 0) {  // all whitespace: hold it
    pending_ws_.append(text);
    return;
  }
  out.content += pending_ws_;
  pending_ws_.clear();
  out.content.append(text.substr(0, end));
  pending_ws_.append(text.substr(end));
}

void OutputParser::process(ParsedDelta& out) {
  for (;;) {
    if (mode_ == Mode::Reasoning) {
      if (at_reasoning_start_) {
        if (buf_.size() < kThinkOpen.size() && kThinkOpen.substr(0, buf_.size()) == buf_) return;  // maybe "<think>"
        if (starts_with(buf_, 0, kThinkOpen)) buf_.erase(0, kThinkOpen.size());
        at_reasoning_start_ = false;
      }
      size_t p = buf_.find(kThinkClose);
      if (p != std::string::npos) {
        out.reasoning.append(buf_, 0, p);
        buf_.erase(0, p + kThinkClose.size());
        mode_ = Mode::Content;
        strip_newlines_ = true;
        continue;
      }
      size_t keep = partial_tag_suffix(buf_, kThinkClose);
      out.reasoning.append(buf_, 0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    if (mode_ == Mode::Content) {
      if (strip_newlines_) {
        size_t n = 0;
        while (n < buf_.size() && (buf_[n] == '\n' || buf_[n] == '\r')) ++n;
        buf_.erase(0, n);
        if (buf_.empty()) return;
        strip_newlines_ = false;
      }
      size_t p = buf_.find(kCallOpen);
      if (p != std::string::npos) {
        emit_content(out, std::string_view(buf_).substr(0, p));
        ws_before_call_ = std::move(pending_ws_);  // dropped if the block is a call, restored if it is not
        pending_ws_.clear();
        buf_.erase(0, p + kCallOpen.size());
        mode_ = Mode::ToolCall;
        continue;
      }
      size_t keep = partial_tag_suffix(buf_, kCallOpen);
      emit_content(out, std::string_view(buf_).substr(0, buf_.size() - keep));
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    // Mode::ToolCall: buffer until the block closes. A new <tool_call> before the close means this one was broken.
    size_t close = buf_.find(kCallClose);
    size_t reopen = buf_.find(kCallOpen);
    if (reopen != std::string::npos && (close == std::string::npos || reopen < close)) {
      emit_content(out, ws_before_call_ + std::string(kCallOpen) + buf_.substr(0, reopen));
      ws_before_call_ = std::move(pending_ws_);
      pending_ws_.clear();
      buf_.erase(0, reopen + kCallOpen.size());
      continue;
    }
    if (close == std::string::npos) return;
    ToolCall call;
    std::string_view block = std::string_view(buf_).substr(0, close);
    if (parse_call(block, call)) {
      call.id = new_id();
      call.index = n_calls_++;
      out.tool_calls_completed.push_back(std::move(call));
    } else {
      emit_content(out, ws_before_call_ + std::string(kCallOpen) + std::string(block) + std::string(kCallClose));
    }
    ws_before_call_.clear();
    buf_.erase(0, close + kCallClose.size());
    mode_ = Mode::Content;
  }
}

ParsedDelta OutputParser::finish() {
  ParsedDelta out;
  switch (mode_) {
    case Mode::Reasoning:
      out.reasoning = std::move(buf_);
      break;
    case Mode::Content:
      if (!strip_newlines_) emit_content(out, buf_);
      break;
    case Mode::ToolCall:
      emit_content(out, ws_before_call_ + std::string(kCallOpen) + buf_);
      ws_before_call_.clear();
      break;
  }
  buf_.clear();
  if (n_calls_ == 0) out.content += pending_ws_;
  pending_ws_.clear();
  mode_ = Mode::Content;
  return out;
}

bool OutputParser::parse_call(std::string_view s, ToolCall& call) const {
  size_t pos = 0;
  auto skip_ws = [&] {
    while (pos < s.size() && is_ws(s[pos])) ++pos;
  };
  skip_ws();
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>", kParam = "<parameter=",
                             kParamEnd = "</parameter>";
  if (!starts_with(s, pos, kFn)) return false;
  size_t gt = s.find('>', pos);
  if (gt == std::string_view::npos) return false;
  std::string_view name = trim(s.substr(pos + kFn.size(), gt - pos - kFn.size()));
  if (name.empty() || name.find_first_of("<\n") != std::string_view::npos) return false;
  call.name = std::string(name);
  pos = gt + 1;
  ojson args = ojson::object();
  for (;;) {
    skip_ws();
    if (starts_with(s, pos, kFnEnd)) {
      pos += kFnEnd.size();
      skip_ws();
      if (pos != s.size()) return false;
      call.arguments_json = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
      return true;
    }
    if (!starts_with(s, pos, kParam)) return false;
    gt = s.find('>', pos);
    if (gt == std::string_view::npos) return false;
    std::string key(trim(s.substr(pos + kParam.size(), gt - pos - kParam.size())));
    if (key.empty()) return false;
    size_t end = s.find(kParamEnd, gt + 1);
    if (end == std::string_view::npos) return false;
    std::string_view raw = s.substr(gt + 1, end - gt - 1);
    if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
    if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
    std::string value = typed_value(call.name, key, std::string(raw));
    args[key] = ojson::parse(value);
    pos = end + kParamEnd.size();
  }
}

namespace {

constexpr int kMaxSchemaDepth = 32;  // $ref chains and nesting followed at most this deep (a cycle ends there)

// The target of `schema`'s local "$ref" in `root` (json_ref.h); null without one, or when it points nowhere.
const ojson* ref_target(const ojson& schema, const ojson& root) {
  const auto r = schema.find("$ref");
  return r != schema.end() && r->is_string() ? resolve_local_ref(root, r->get_ref<const std::string&>()) : nullptr;
}

// The JSON type name of a value (an enum's or a const's).
const char* json_type_of(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::string: return "string";
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned: return "integer";
    case ojson::value_t::number_float: return "number";
    case ojson::value_t::boolean: return "boolean";
    case ojson::value_t::object: return "object";
    case ojson::value_t::array: return "array";
    default: return "null";
  }
}

void add_schema_types(const ojson& schema, const ojson& root, int depth, std::vector<std::string>& types) {
  if (!schema.is_object() || depth > kMaxSchemaDepth) return;
  const size_t before = types.size();
  if (schema.contains("type")) {
    const ojson& t = schema["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    if (t.is_array())
      for (const auto& x : t)
        if (x.is_string()) types.push_back(x.get<std::string>());
  }
  for (const char* alt : {"anyOf", "oneOf"})
    if (schema.contains(alt) && schema[alt].is_array())
      for (const auto& member : schema[alt]) add_schema_types(member, root, depth + 1, types);
  if (types.size() > before) return;
  // Nothing named a type: what the other keywords imply, the first that does.
  if (const ojson* target = ref_target(schema, root)) {
    add_schema_types(*target, root, depth + 1, types);
    if (types.size() > before) return;
  }
  if (schema.contains("allOf") && schema["allOf"].is_array())
    for (const auto& member : schema["allOf"]) {
      add_schema_types(member, root, depth + 1, types);
      if (types.size() > before) return;
    }
  if (schema.contains("const")) {
    types.push_back(json_type_of(schema["const"]));
    return;
  }
  if (schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty()) {
    for (const auto& v : schema["enum"]) types.push_back(json_type_of(v));
    return;
  }
  if (schema.contains("properties")) types.push_back("object");
  else if (schema.contains("items") || schema.contains("prefixItems")) types.push_back("array");
}

}  // namespace

std::vector<std::string> tool_parameter_types(const ojson& schema, const ojson& root) {
  std::vector<std::string> types;
  add_schema_types(schema, root, 0, types);
  return types;
}

bool tool_parameter_is_text(const ojson& schema, const ojson& root) {
  const std::vector<std::string> types = tool_parameter_types(schema, root);
  return types.empty() || std::find(types.begin(), types.end(), "string") != types.end();
}

// The JSON text of a parameter value, typed by the tool's schema.
std::string OutputParser::typed_value(const std::string& function, const std::string& key,
                                      const std::string& raw) const {
  bool as_string = true;
  if (tools_.is_array()) {
    for (const auto& tool : tools_) {
      const ojson* fn = tool.is_object() && tool.contains("function") ? &tool["function"] : &tool;
      if (!fn->is_object() || fn->value("name", "") != function) continue;
      if (!fn->contains("parameters") || !(*fn)["parameters"].is_object()) break;
      const ojson& root = (*fn)["parameters"];
      const ojson* params = &root;  // the parameters object itself may be a reference
      if (const ojson* target = ref_target(*params, root)) params = target;
      if (!params->is_object() || !params->contains("properties") || !(*params)["properties"].is_object()) break;
      const ojson& props = (*params)["properties"];
      if (!props.contains(key)) break;
      as_string = tool_parameter_is_text(props[key], root);
      break;
    }
  }
  if (!as_string) {
    std::string_view t = trim(raw);
    if (t == "True") return "true";
    if (t == "False") return "false";
    if (t == "None") return "null";
    ojson parsed = ojson::parse(t, nullptr, false);
    if (!parsed.is_discarded()) return parsed.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }
  return ojson(raw).dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace tern
