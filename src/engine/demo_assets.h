// Bytes embedded into the binary for the demo model (see demo_assets.cpp).
#pragma once

#include <string_view>

namespace tern {

std::string_view demo_asset_tokenizer_zst();  // Qwen3 tokenizer.json, zstd-compressed
std::string_view demo_asset_chat_template();  // Jinja source of the chat template

}  // namespace tern
