// Local JSON Schema references ("$ref": "#", "#/$defs/NAME", any JSON pointer into the document, with the pointer
// escapes ~0 and ~1 and URI %XX escapes) resolved inside one schema document. Shared by the tool-call argument
// typing (output_parser) and the grammar's schema compiler (src/grammar), so that both read a reference alike.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace tern {

// "~" -> "~0", "/" -> "~1": one JSON pointer token.
std::string json_pointer_escape(std::string_view key);

// The target of `ref` in `root`, or nullptr when `ref` is not a local reference ("#" then nothing or a JSON
// pointer; an anchor such as "#name" is not) or points nowhere. normalized (optional): the target's pointer with
// its tokens unescaped and escaped again ("/$defs/a~1b"), a stable key for the target.
const nlohmann::ordered_json* resolve_local_ref(const nlohmann::ordered_json& root, std::string_view ref,
                                                std::string* normalized = nullptr);

}  // namespace tern
