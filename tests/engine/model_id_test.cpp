// The model id of a folder: the repo id of a Hugging Face hub cache snapshot, or one the folder records when its
// name part is the folder's, else the folder's name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/model_source.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

class ModelId : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tern-model-id-" + std::to_string(std::random_device{}()));
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path dir(const std::string& relative) {
    const fs::path p = root_ / relative;
    fs::create_directories(p);
    return p;
  }
  static void write(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }
  fs::path root_;
};

TEST_F(ModelId, HubCacheSnapshot) {
  const fs::path snap = dir("hub/models--Qwen--Qwen3.6-35B-A3B/snapshots/0a1b2c3d");
  EXPECT_EQ(model_id_from_folder(snap), "Qwen/Qwen3.6-35B-A3B");
  EXPECT_EQ(model_id_from_folder(snap.string() + "/"), "Qwen/Qwen3.6-35B-A3B");
  EXPECT_EQ(model_id_from_folder(dir("hub/models--mlx-community--Qwen3.6-35B-A3B-4bit/snapshots/ff")),
            "mlx-community/Qwen3.6-35B-A3B-4bit");
  // Not a snapshot: the folder's name.
  EXPECT_EQ(model_id_from_folder(dir("hub/models--Qwen--X/refs")), "refs");
  EXPECT_EQ(model_id_from_folder(dir("other/snapshots/abc")), "abc");
}

TEST_F(ModelId, RecordedRepoIdWhenItNamesTheFolder) {
  const fs::path local = dir("Qwen3.6-35B-A3B");
  EXPECT_EQ(model_id_from_folder(local), "Qwen3.6-35B-A3B");
  write(local / "config.json", R"({"_name_or_path": "Qwen/Qwen3.6-35B-A3B", "model_type": "x"})");
  EXPECT_EQ(model_id_from_folder(local), "Qwen/Qwen3.6-35B-A3B");
  const fs::path tuned = dir("my-finetune");
  write(tuned / "config.json", R"({"_name_or_path": "Qwen/Qwen3.6-35B-A3B"})");
  EXPECT_EQ(model_id_from_folder(tuned), "my-finetune");
  const fs::path path_recorded = dir("weights");
  write(path_recorded / "config.json", R"({"_name_or_path": "/home/me/weights"})");
  EXPECT_EQ(model_id_from_folder(path_recorded), "weights");
  const fs::path card = dir("Qwen3.6-35B-A3B-4bit");
  write(card / "README.md", "from [Qwen/Qwen3.6-35B-A3B](https://huggingface.co/Qwen/Qwen3.6-35B-A3B) as "
                            "[this](https://huggingface.co/mlx-community/Qwen3.6-35B-A3B-4bit)\n");
  EXPECT_EQ(model_id_from_folder(card), "mlx-community/Qwen3.6-35B-A3B-4bit");
  const fs::path broken = dir("broken");
  write(broken / "config.json", "{not json");
  EXPECT_EQ(model_id_from_folder(broken), "broken");
}

TEST_F(ModelId, LongNameRunInReadmeIsNotACrash) {
  // 200000 name characters after a hub link: an unbounded regex repeat recursed per character and overflowed.
  const fs::path card = dir("Qwen3.6-35B-A3B-4bit");
  write(card / "README.md", "https://huggingface.co/org/" + std::string(200000, 'b') +
                                " then https://huggingface.co/mlx-community/Qwen3.6-35B-A3B-4bit\n");
  EXPECT_EQ(model_id_from_folder(card), "mlx-community/Qwen3.6-35B-A3B-4bit");
}

}  // namespace
}  // namespace tern
