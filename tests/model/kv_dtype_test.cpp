// The KV cache types (model/kv_dtype.h): the flag's spellings both ways and the bytes a cached row takes.
#include "model/kv_dtype.h"

#include <gtest/gtest.h>

#include "core/check.h"

namespace tern {
namespace {

TEST(KvDtype, NamesParseBackAndOthersAreRefused) {
  for (KvDtype t : {KvDtype::f16, KvDtype::bf16, KvDtype::fp8, KvDtype::i16})
    EXPECT_EQ(kv_dtype_parse(kv_dtype_name(t)), t);
  EXPECT_THROW(kv_dtype_parse("fp16"), Error);
  EXPECT_THROW(kv_dtype_parse("e4m3"), Error);
  EXPECT_THROW(kv_dtype_parse(""), Error);
}

TEST(KvDtype, Fp8RowsTakeOneBytePerValueAndTheirScale) {
  EXPECT_EQ(kv_row_bytes(KvDtype::f16, 256), 512);
  EXPECT_EQ(kv_row_bytes(KvDtype::bf16, 256), 512);
  EXPECT_EQ(kv_row_bytes(KvDtype::fp8, 256), 260);
  EXPECT_EQ(kv_row_bytes(KvDtype::i16, 256), 516);  // int16 values and the row's fp32 scale
  EXPECT_EQ(kv_value_bytes(KvDtype::i16), 2);
  EXPECT_EQ(kv_value_bytes(KvDtype::fp8), 1);
  EXPECT_TRUE(kv_row_scaled(KvDtype::i16));
  EXPECT_FALSE(kv_row_scaled(KvDtype::f16));
  // Qwen3.6: 10 attention layers of 2 KV heads of 256, K and V.
  EXPECT_EQ(kv_token_bytes(KvDtype::f16, 10, 2, 256), 20'480);
  EXPECT_EQ(kv_token_bytes(KvDtype::fp8, 10, 2, 256), 10'400);
  EXPECT_EQ(kv_token_bytes(KvDtype::i16, 10, 2, 256), 20'640);
}

}  // namespace
}  // namespace tern
