#include "model/kv_dtype.h"

#include "core/check.h"

namespace tern {

const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::f16: return "f16";
    case KvDtype::bf16: return "bf16";
    case KvDtype::fp8: return "fp8";
    case KvDtype::i16: return "i16";
  }
  return "?";
}

KvDtype kv_dtype_parse(const std::string& text) {
  if (text == "f16") return KvDtype::f16;
  if (text == "bf16") return KvDtype::bf16;
  if (text == "fp8") return KvDtype::fp8;
  if (text == "i16") return KvDtype::i16;
  TERN_FAIL("--kv-dtype must be f16, bf16, fp8 or i16, got '", text, "'");
}

int64_t kv_row_bytes(KvDtype t, int64_t head_dim) {
  return head_dim * kv_value_bytes(t) + (kv_row_scaled(t) ? int64_t(sizeof(float)) : 0);
}

}  // namespace tern
