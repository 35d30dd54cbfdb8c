#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/text_file.h"

namespace tern {

using json = nlohmann::json;

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::bf16: return "BF16";
    case Dtype::f16: return "F16";
    case Dtype::f32: return "F32";
    case Dtype::u32: return "U32";
    case Dtype::u8: return "U8";
    case Dtype::i32: return "I32";
    case Dtype::i64: return "I64";
  }
  return "?";
}

int dtype_size(Dtype d) {
  switch (d) {
    case Dtype::bf16:
    case Dtype::f16: return 2;
    case Dtype::f32:
    case Dtype::u32:
    case Dtype::i32: return 4;
    case Dtype::u8: return 1;
    case Dtype::i64: return 8;
  }
  return 1;
}

bool dtype_parse(const std::string& name, Dtype& out) {
  static const std::pair<const char*, Dtype> table[] = {
      {"BF16", Dtype::bf16}, {"F16", Dtype::f16}, {"F32", Dtype::f32}, {"U32", Dtype::u32},
      {"U8", Dtype::u8},     {"I32", Dtype::i32}, {"I64", Dtype::i64},
  };
  for (const auto& [n, d] : table)
    if (name == n) {
      out = d;
      return true;
    }
  return false;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// Rejects JSON nested deeper than max_depth before it reaches the parser (deep nesting costs stack).
bool json_depth_ok(const uint8_t* p, size_t n, int max_depth) {
  int depth = 0;
  bool in_string = false, escape = false;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = p[i];
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

}  // namespace

SafetensorsHeader safetensors_parse(const uint8_t* data, size_t size, const std::string& file_name) {
  const std::string& f = file_name;
  TERN_CHECK(data != nullptr || size == 0, f, ": no data");
  TERN_CHECK(size >= 8, f, ": truncated safetensors file (", size, " bytes; the header length alone takes 8)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  TERN_CHECK(n >= 2, f, ": safetensors header length ", n, " is too small");
  TERN_CHECK(n <= kSafetensorsMaxHeader, f, ": safetensors header length ", n, " exceeds the limit of ",
             kSafetensorsMaxHeader, " bytes");
  TERN_CHECK(n <= size - 8, f, ": truncated safetensors header (needs ", n, " bytes after the length, the file has ",
             size - 8, ")");
  const uint8_t* hdr = data + 8;
  TERN_CHECK(json_depth_ok(hdr, n, 8), f, ": safetensors header JSON is nested too deeply");

  std::set<std::string> top_keys;
  bool duplicate = false;
  std::string duplicate_key;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key) {
      std::string k = parsed.is_string() ? parsed.get<std::string>() : std::string();
      if (!top_keys.insert(k).second && !duplicate) {
        duplicate = true;
        duplicate_key = k;
      }
    }
    return true;
  };
  const json j = json::parse(hdr, hdr + n, cb, /*allow_exceptions=*/false);
  TERN_CHECK(!j.is_discarded(), f, ": safetensors header is not valid JSON");
  TERN_CHECK(j.is_object(), f, ": safetensors header must be a JSON object");
  TERN_CHECK(!duplicate, f, ": tensor '", duplicate_key, "' appears twice in the safetensors header");

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_size = size - h.data_offset;
  TERN_CHECK(j.size() <= kSafetensorsMaxTensors + 1, f, ": too many tensors (", j.size(), ")");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = *it;
    if (name == "__metadata__") {
      TERN_CHECK(v.is_object(), f, ": __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        TERN_CHECK(m->is_string(), f, ": __metadata__ entry '", m.key(), "' must be a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TERN_CHECK(!name.empty() && name.size() <= 1024, f, ": tensor name of length ", name.size(), " is not allowed");
    TERN_CHECK(v.is_object(), f, ": tensor '", name, "': entry must be an object");
    for (auto k = v.begin(); k != v.end(); ++k)
      TERN_CHECK(k.key() == "dtype" || k.key() == "shape" || k.key() == "data_offsets", f, ": tensor '", name,
                 "': unknown field '", k.key(), "'");
    TensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    TERN_CHECK(dt != v.end() && dt->is_string(), f, ": tensor '", name, "': missing or non-string dtype");
    TERN_CHECK(dtype_parse(dt->get<std::string>(), t.dtype), f, ": tensor '", name, "': dtype '",
               dt->get<std::string>(), "' is not supported (BF16, F16, F32, U32, U8, I32, I64)");
    auto sh = v.find("shape");
    TERN_CHECK(sh != v.end() && sh->is_array(), f, ": tensor '", name, "': missing or non-list shape");
    TERN_CHECK(sh->size() <= kSafetensorsMaxDims, f, ": tensor '", name, "': ", sh->size(), " dimensions (max ",
               kSafetensorsMaxDims, ")");
    uint64_t numel = 1;
    for (const json& d : *sh) {
      TERN_CHECK(d.is_number_unsigned(), f, ": tensor '", name, "': shape entries must be non-negative integers, got ",
                 d.dump());
      const uint64_t x = d.get<uint64_t>();
      TERN_CHECK(x <= (uint64_t(1) << 40), f, ": tensor '", name, "': dimension ", x, " is too large");
      t.shape.push_back(int64_t(x));
      TERN_CHECK(x == 0 || numel <= (uint64_t(1) << 50) / x, f, ": tensor '", name, "': element count overflows");
      numel *= x;
    }
    auto off = v.find("data_offsets");
    TERN_CHECK(off != v.end() && off->is_array() && off->size() == 2, f, ": tensor '", name,
               "': data_offsets must be a list [begin, end]");
    TERN_CHECK((*off)[0].is_number_unsigned() && (*off)[1].is_number_unsigned(), f, ": tensor '", name,
               "': data_offsets must be non-negative integers");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    TERN_CHECK(t.begin <= t.end, f, ": tensor '", name, "': data_offsets [", t.begin, ", ", t.end, "] are reversed");
    TERN_CHECK(t.end <= data_size, f, ": tensor '", name, "': data_offsets [", t.begin, ", ", t.end,
               "] run past the end of the file (data section is ", data_size, " bytes)");
    const uint64_t expect = numel * uint64_t(dtype_size(t.dtype));
    TERN_CHECK(t.end - t.begin == expect, f, ": tensor '", name, "': shape ", t.shape_string(), " x ",
               dtype_name(t.dtype), " needs ", expect, " bytes but data_offsets span ", t.end - t.begin);
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const TensorInfo& a = h.tensors[i - 1];
    const TensorInfo& b = h.tensors[i];
    TERN_CHECK(b.begin >= a.end || a.begin == a.end || b.begin == b.end, f, ": tensors '", a.name, "' [", a.begin,
               ", ", a.end, ") and '", b.name, "' [", b.begin, ", ", b.end, ") overlap");
  }
  return h;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path)
    : file_(path), header_(safetensors_parse(file_.data(), file_.size(), path.string())) {}

void SafetensorsSet::add_file(const std::filesystem::path& path) {
  files_.push_back(std::make_unique<SafetensorsFile>(path));
  const SafetensorsFile& file = *files_.back();
  for (const TensorInfo& t : file.header().tensors) {
    TERN_CHECK(tensors_.find(t.name) == tensors_.end(), "tensor '", t.name, "' appears in two files (",
               tensors_[t.name].file->path().filename().string(), " and ", path.filename().string(), ")");
    tensors_[t.name] = TensorRef{&t, &file};
    total_bytes_ += t.end - t.begin;
  }
}

SafetensorsSet::SafetensorsSet(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  TERN_CHECK(fs::is_directory(dir) || fs::is_regular_file(dir), "model directory ", dir.string(), " does not exist");
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::is_regular_file(dir)) {
    add_file(dir);  // one file (an extracted MTP head, --draft-weights)
  } else if (fs::exists(index_path)) {
    const json idx = json::parse(read_text_file(index_path), nullptr, false);
    TERN_CHECK(!idx.is_discarded() && idx.is_object(), index_path.string(), " is not a JSON object");
    auto wm = idx.find("weight_map");
    TERN_CHECK(wm != idx.end() && wm->is_object(), index_path.string(), ": missing 'weight_map' object");
    std::map<std::string, std::vector<std::string>> by_file;  // shard -> tensors the index puts there
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      TERN_CHECK(it->is_string(), index_path.string(), ": weight_map entry '", it.key(), "' must name a file");
      const std::string shard = it->get<std::string>();
      TERN_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
                 index_path.string(), ": shard name '", shard, "' of tensor '", it.key(), "' is not a plain file name");
      by_file[shard].push_back(it.key());
    }
    TERN_CHECK(!by_file.empty(), index_path.string(), ": weight_map is empty");
    for (const auto& [shard, listed] : by_file) {
      const fs::path p = dir / shard;
      TERN_CHECK(fs::exists(p), "shard ", shard, " listed in ", index_path.filename().string(), " (for tensor '",
                 listed.front(), "') is missing from ", dir.string());
      add_file(p);
      const SafetensorsFile& file = *files_.back();
      std::set<std::string> in_file;
      for (const TensorInfo& t : file.header().tensors) in_file.insert(t.name);
      for (const std::string& name : listed)
        TERN_CHECK(in_file.count(name), "tensor '", name, "' is listed in the index under ", shard,
                   " but that file does not hold it");
      for (const std::string& name : in_file)
        TERN_CHECK(std::find(listed.begin(), listed.end(), name) != listed.end(), "tensor '", name, "' in ", shard,
                   " is not listed in ", index_path.filename().string());
    }
  } else if (fs::exists(dir / "model.safetensors")) {
    add_file(dir / "model.safetensors");
  } else {
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") found.push_back(e.path());
    std::sort(found.begin(), found.end());
    TERN_CHECK(!found.empty(), "no .safetensors files in ", dir.string());
    for (const auto& p : found) add_file(p);
  }
  names_.reserve(tensors_.size());
  for (const auto& [name, ref] : tensors_) names_.push_back(name);
  std::sort(names_.begin(), names_.end());
}

const TensorRef* SafetensorsSet::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t TensorOut::bytes() const {
  uint64_t b = 0;
  for (const auto& [p, n] : chunks) b += n;
  return b;
}

void safetensors_write(const std::filesystem::path& path, const std::vector<TensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::string body = "{";
  bool first = true;
  auto add = [&](const std::string& key, const json& value) {
    if (!first) body.push_back(',');
    body.append(json(key).dump());
    body.push_back(':');
    body.append(value.dump());
    first = false;
  };
  if (!metadata.empty()) add("__metadata__", header["__metadata__"]);
  for (const TensorOut& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    TERN_CHECK(uint64_t(numel) * uint64_t(dtype_size(t.dtype)) == t.bytes(), path.string(), ": tensor '", t.name,
               "' has ", t.bytes(), " bytes but its shape needs ", numel * dtype_size(t.dtype));
    add(t.name, json{{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes()}}});
    offset += t.bytes();
  }
  body += "}";
  while (body.size() % 8) body += ' ';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TERN_CHECK(out, "cannot create ", path.string());
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(body.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(body.data(), std::streamsize(body.size()));
  for (const TensorOut& t : tensors)
    for (const auto& [p, n] : t.chunks) out.write(static_cast<const char*>(p), std::streamsize(n));
  out.flush();
  TERN_CHECK(out.good(), "write failed for ", path.string(), " (disk full?)");
}

}  // namespace tern
