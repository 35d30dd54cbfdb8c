// Files embedded into the binary for the demo model, so that it runs from an installed binary with no source tree:
// the Qwen3 tokenizer (tokenizer.json, zstd-compressed) and the chat template. CMakeLists.txt passes their paths
// as TERN_DEMO_TOKENIZER_FILE and TERN_DEMO_TEMPLATE_FILE; the assembler's .incbin copies the bytes.
#include "engine/demo_assets.h"

#ifndef TERN_DEMO_TOKENIZER_FILE
#error "TERN_DEMO_TOKENIZER_FILE must name the .json.zst tokenizer (set by CMakeLists.txt)"
#endif
#ifndef TERN_DEMO_TEMPLATE_FILE
#error "TERN_DEMO_TEMPLATE_FILE must name the chat template (set by CMakeLists.txt)"
#endif

__asm__(".pushsection .rodata\n"
        ".balign 16\n"
        "tern_demo_tokenizer_begin:\n"
        ".incbin \"" TERN_DEMO_TOKENIZER_FILE "\"\n"
        "tern_demo_tokenizer_end:\n"
        ".balign 16\n"
        "tern_demo_template_begin:\n"
        ".incbin \"" TERN_DEMO_TEMPLATE_FILE "\"\n"
        "tern_demo_template_end:\n"
        ".popsection\n");

extern "C" const char tern_demo_tokenizer_begin[], tern_demo_tokenizer_end[];
extern "C" const char tern_demo_template_begin[], tern_demo_template_end[];

namespace tern {

std::string_view demo_asset_tokenizer_zst() {
  return {tern_demo_tokenizer_begin, size_t(tern_demo_tokenizer_end - tern_demo_tokenizer_begin)};
}

std::string_view demo_asset_chat_template() {
  return {tern_demo_template_begin, size_t(tern_demo_template_end - tern_demo_template_begin)};
}

}  // namespace tern
