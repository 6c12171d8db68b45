#include "harness/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/input_error.h"
#include "harness/model/mapped_file.h"

namespace kvbench {
namespace {

using nlohmann::json;

// Above any real header (a 1,000-tensor shard's is about 100 KB): a corrupt length is
// refused before anything of that size is read.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string shown(const std::string& name) {
  constexpr size_t kMax = 120;
  return "'" + one_line(name.size() > kMax ? name.substr(0, kMax) + "..." : name) + "'";
}

}  // namespace

int64_t safetensors_dtype_bytes(const std::string& dtype) {
  static const std::pair<const char*, int64_t> kSizes[] = {
      {"F64", 8}, {"F32", 4},     {"F16", 2},     {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},      {"U64", 8},     {"U32", 4},  {"U16", 2}, {"U8", 1},
      {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, bytes] : kSizes) {
    if (dtype == name) return bytes;
  }
  return 0;
}

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto mapping = std::make_unique<MappedFile>(path, "a safetensors file");
  const uint8_t* base = mapping->data();
  const uint64_t size = mapping->size();
  const auto fail = [&](const std::string& why) { throw InputError(path + ": " + why); };
  if (size < 8) fail("shorter than the 8-byte header length; not a safetensors file");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | base[i];
  if (header_bytes > kMaxHeaderBytes || header_bytes > size - 8) {
    fail("header length " + std::to_string(header_bytes) + " runs past the file's " +
         std::to_string(size) + " bytes (truncated, or not a safetensors file)");
  }
  json header;
  try {
    header = json::parse(base + 8, base + 8 + header_bytes);
  } catch (const json::exception& e) {
    fail(std::string("header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail("header is not a JSON object of tensors");
  const uint64_t data_bytes = size - 8 - header_bytes;
  const uint8_t* data = base + 8 + header_bytes;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();
    const json& entry = item.value();
    if (name == "__metadata__") continue;
    const auto bad = [&](const std::string& why) { fail("tensor " + shown(name) + ": " + why); };
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() ||
        !entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      bad("expected {\"dtype\": text, \"shape\": [..], \"data_offsets\": [begin, end]}");
    }
    SafetensorsTensor t;
    t.dtype = entry["dtype"].get<std::string>();
    const int64_t element = safetensors_dtype_bytes(t.dtype);
    if (element == 0) bad("unknown dtype " + shown(t.dtype));
    int64_t n = 1;
    for (const json& d : entry["shape"]) {
      if (!d.is_number_unsigned()) bad("a shape entry is not a non-negative integer");
      const auto dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim > 0 && n > std::numeric_limits<int64_t>::max() / element / static_cast<int64_t>(dim))) {
        bad("shape too large");
      }
      n *= static_cast<int64_t>(dim);
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      bad("data_offsets are not non-negative integers");
    }
    const auto begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_bytes) {
      bad("data [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside the " +
          std::to_string(data_bytes) + " data bytes (truncated file?)");
    }
    if (end - begin != static_cast<uint64_t>(n * element)) {
      bad("data of " + std::to_string(end - begin) + " bytes for a " + t.dtype + " shape of " +
          std::to_string(n) + " elements (" + std::to_string(n * element) + " bytes)");
    }
    t.data = data + begin;
    t.bytes = static_cast<int64_t>(end - begin);
    if (begin < end) ranges.emplace_back(begin, end);
    tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      fail("two tensors' data overlap at byte " + std::to_string(ranges[i].first));
    }
  }
  mapping_ = std::move(mapping);
}

SafetensorsFile::~SafetensorsFile() = default;

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace kvbench
