// The GGUF reader: metadata round trips, the tensor table, and hostile input.
#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gguf_writer.h"
#include "harness/model/dequant.h"
#include "harness/model/gguf.h"

using kvbench::GgmlType;
using kvbench::GgufFile;
using kvbench::GgufValueType;
using kvbench::InputError;
namespace t = kvbench::testing;

namespace {

// Writes `bytes` and opens them; returns the InputError message, or "" if the file parsed.
// Any other exception propagates and fails the test.
std::string open_error(const std::vector<uint8_t>& bytes, const std::string& name) {
  const std::string path = t::temp_path(name);
  t::write_file(path, bytes);
  try {
    GgufFile f(path);
    // A file that parses must have every tensor's data inside the mapping.
    for (const auto& info : f.tensors()) {
      std::vector<float> out(static_cast<size_t>(info.n_elements()));
      kvbench::dequantize_row(info.type, info.data, out.data(), info.n_elements());
    }
    return "";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  }
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

template <typename T>
void patch(std::vector<uint8_t>& bytes, size_t pos, T value) {
  REQUIRE(pos + sizeof(T) <= bytes.size());
  std::memcpy(bytes.data() + pos, &value, sizeof(T));
}

// Byte position of a tensor's info record field: name, n_dims, ne..., type, offset.
size_t find_name(const std::vector<uint8_t>& bytes, const std::string& name) {
  const std::string hay(bytes.begin(), bytes.end());
  const size_t pos = hay.find(name);
  REQUIRE(pos != std::string::npos);
  return pos + name.size();
}

std::vector<uint8_t> le64(uint64_t v) {
  std::vector<uint8_t> out(8);
  std::memcpy(out.data(), &v, 8);
  return out;
}

std::vector<uint8_t> le32(uint32_t v) {
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), &v, 4);
  return out;
}

std::vector<uint8_t> concat(std::initializer_list<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

void add_every_type(t::GgufWriter& w) {
  w.add("k.u8", t::gguf_u8(255));
  w.add("k.i8", t::gguf_i8(-128));
  w.add("k.u16", t::gguf_u16(65535));
  w.add("k.i16", t::gguf_i16(-32768));
  w.add("k.u32", t::gguf_u32(4294967295u));
  w.add("k.i32", t::gguf_i32(std::numeric_limits<int32_t>::min()));
  w.add("k.f32", t::gguf_f32(-0.1f));
  w.add("k.bool_t", t::gguf_bool(true));
  w.add("k.bool_f", t::gguf_bool(false));
  w.add("k.str", t::gguf_str("héllo\nworld"));
  w.add("k.empty_str", t::gguf_str(""));
  w.add("k.u64", t::gguf_u64(std::numeric_limits<uint64_t>::max()));
  w.add("k.i64", t::gguf_i64(std::numeric_limits<int64_t>::min()));
  w.add("k.f64", t::gguf_f64(3.141592653589793));
  w.add("a.u8", t::gguf_array(GgufValueType::UINT8, std::vector<uint64_t>{0, 1, 255}));
  w.add("a.i8", t::gguf_array(GgufValueType::INT8, std::vector<int64_t>{-128, 0, 127}));
  w.add("a.u16", t::gguf_array(GgufValueType::UINT16, std::vector<uint64_t>{65535, 7}));
  w.add("a.i16", t::gguf_array(GgufValueType::INT16, std::vector<int64_t>{-32768, 32767}));
  w.add("a.u32", t::gguf_array(GgufValueType::UINT32, std::vector<uint64_t>{4294967295u}));
  w.add("a.i32", t::gguf_array(GgufValueType::INT32, std::vector<int64_t>{-5, 6, -7}));
  w.add("a.u64", t::gguf_array(GgufValueType::UINT64, std::vector<uint64_t>{1ull << 63}));
  w.add("a.i64", t::gguf_array(GgufValueType::INT64, std::vector<int64_t>{-(1ll << 62)}));
  w.add("a.f32", t::gguf_array(GgufValueType::FLOAT32, std::vector<double>{0.5, -1.25}));
  w.add("a.f64", t::gguf_array(GgufValueType::FLOAT64, std::vector<double>{1e300, -1e-300}));
  w.add("a.bool", t::gguf_array(std::vector<bool>{true, false, true}));
  w.add("a.str", t::gguf_array(std::vector<std::string>{"x", "", "Ġthe"}));
  w.add("a.empty", t::gguf_array(GgufValueType::INT32, std::vector<int64_t>{}));
}

}  // namespace

TEST_CASE("every metadata type round trips", "[unit]") {
  for (uint32_t version : {2u, 3u}) {
    for (uint32_t alignment : {32u, 1u, 8u, 64u, 256u}) {
      INFO("version " << version << " alignment " << alignment);
      t::GgufWriter w(version, alignment);
      add_every_type(w);
      const std::string path = t::temp_path("roundtrip.gguf");
      w.write(path);
      GgufFile f(path);
      CHECK(f.path() == path);
      CHECK(f.version() == version);
      CHECK(f.alignment() == alignment);
      CHECK(f.has("general.alignment") == (alignment != 32));
      CHECK(f.get_int("k.u8") == 255);
      CHECK(f.get_int("k.i8") == -128);
      CHECK(f.get_int("k.u16") == 65535);
      CHECK(f.get_int("k.i16") == -32768);
      CHECK(f.get_int("k.u32") == 4294967295ll);
      CHECK(f.get_int("k.i32") == std::numeric_limits<int32_t>::min());
      CHECK(f.get_float("k.f32") == static_cast<double>(-0.1f));
      CHECK(f.get_bool("k.bool_t"));
      CHECK_FALSE(f.get_bool("k.bool_f"));
      CHECK(f.get_string("k.str") == "héllo\nworld");
      CHECK(f.get_string("k.empty_str").empty());
      CHECK(std::get<uint64_t>(f.metadata().at("k.u64").value) ==
            std::numeric_limits<uint64_t>::max());
      CHECK(f.get_int("k.i64") == std::numeric_limits<int64_t>::min());
      CHECK(f.get_float("k.f64") == 3.141592653589793);
      CHECK(f.metadata().at("k.u16").type == GgufValueType::UINT16);
      CHECK(f.metadata().at("k.f32").type == GgufValueType::FLOAT32);

      CHECK(f.get_int_array("a.u8") == std::vector<int64_t>{0, 1, 255});
      CHECK(f.metadata().at("a.u8").array_type == GgufValueType::UINT8);
      CHECK(f.get_int_array("a.i8") == std::vector<int64_t>{-128, 0, 127});
      CHECK(f.get_int_array("a.u16") == std::vector<int64_t>{65535, 7});
      CHECK(f.get_int_array("a.i16") == std::vector<int64_t>{-32768, 32767});
      CHECK(f.get_int_array("a.u32") == std::vector<int64_t>{4294967295ll});
      CHECK(f.get_int_array("a.i32") == std::vector<int64_t>{-5, 6, -7});
      CHECK(std::get<std::vector<uint64_t>>(f.metadata().at("a.u64").value) ==
            std::vector<uint64_t>{1ull << 63});
      CHECK(f.get_int_array("a.i64") == std::vector<int64_t>{-(1ll << 62)});
      CHECK(f.get_float_array("a.f32") == std::vector<double>{0.5, -1.25});
      CHECK(f.get_float_array("a.f64") == std::vector<double>{1e300, -1e-300});
      CHECK(f.get_float_array("a.i32") == std::vector<double>{-5, 6, -7});
      CHECK(std::get<std::vector<bool>>(f.metadata().at("a.bool").value) ==
            std::vector<bool>{true, false, true});
      CHECK(f.get_string_array("a.str") == std::vector<std::string>{"x", "", "Ġthe"});
      CHECK(f.get_int_array("a.empty").empty());
      CHECK(f.tensors().empty());
    }
  }
}

TEST_CASE("typed getters check types and fall back for missing keys", "[unit]") {
  t::GgufWriter w;
  add_every_type(w);
  const std::string path = t::temp_path("getters.gguf");
  w.write(path);
  GgufFile f(path);
  CHECK(f.get_float("k.i32") == static_cast<double>(std::numeric_limits<int32_t>::min()));
  CHECK(f.get_float("k.u8") == 255.0);
  CHECK_THROWS_AS(f.get_int("k.f32"), InputError);
  CHECK_THROWS_AS(f.get_int("k.str"), InputError);
  CHECK_THROWS_AS(f.get_int("k.u64"), InputError);  // does not fit in int64
  CHECK_THROWS_AS(f.get_int("a.i32"), InputError);
  CHECK_THROWS_AS(f.get_string("k.u8"), InputError);
  CHECK_THROWS_AS(f.get_bool("k.u8"), InputError);
  CHECK_THROWS_AS(f.get_string_array("a.i32"), InputError);
  CHECK_THROWS_AS(f.get_int_array("a.str"), InputError);
  CHECK_THROWS_AS(f.get_int_array("a.f32"), InputError);
  CHECK_THROWS_AS(f.get_int_array("a.u64"), InputError);
  CHECK_THROWS_AS(f.get_float_array("a.bool"), InputError);
  CHECK_THROWS_AS(f.get_float("missing"), InputError);
  CHECK(f.get_int("missing", 7) == 7);
  CHECK(f.get_float("missing", 0.5) == 0.5);
  CHECK(f.get_bool("missing", true));
  CHECK(f.get_string("missing", "x") == "x");
  CHECK(f.get_int("k.i8", 7) == -128);
  try {
    f.get_int("k.str");
  } catch (const InputError& e) {
    CHECK(contains(e.what(), path));
    CHECK(contains(e.what(), "k.str"));
  }
}

TEST_CASE("the tensor table gives shapes, types, offsets and data", "[unit]") {
  for (uint32_t alignment : {32u, 64u, 16u}) {
    t::GgufWriter w(3, alignment);
    std::vector<float> a(96), b(7), c(256 * 2);
    for (size_t i = 0; i < a.size(); ++i) a[i] = 0.01f * static_cast<float>(i) - 0.3f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) + 0.5f;
    for (size_t i = 0; i < c.size(); ++i) c[i] = std::cos(static_cast<float>(i));
    w.add_tensor("a", {32, 3}, GgmlType::Q8_0, a);
    w.add_tensor("b", {7}, GgmlType::F32, b);
    w.add_tensor("c16", {64, 2, 2, 2}, GgmlType::F16, c);
    w.add_tensor("cbf", {256, 2}, GgmlType::BF16, c);
    w.add_tensor("q41", {64, 8}, GgmlType::Q4_1, c);
    std::vector<uint8_t> k_block(144 * 2, 0x11);
    w.add_tensor_bytes("q4k", {256, 2}, GgmlType::Q4_K, k_block);
    const std::string path = t::temp_path("tensors.gguf");
    w.write(path);
    GgufFile f(path);
    REQUIRE(f.tensors().size() == 6);
    const auto& ta = f.tensor("a");
    CHECK(ta.shape == std::vector<int64_t>{32, 3});
    CHECK(ta.type == GgmlType::Q8_0);
    CHECK(ta.offset == 0);
    CHECK(ta.n_elements() == 96);
    CHECK(ta.n_bytes() == 3 * 34);
    const auto& tb = f.tensor("b");
    CHECK(tb.offset % alignment == 0);
    CHECK(tb.offset >= static_cast<uint64_t>(ta.n_bytes()));
    CHECK(tb.data == ta.data + tb.offset);
    CHECK(std::memcmp(tb.data, b.data(), b.size() * 4) == 0);
    CHECK(f.tensor("c16").shape == std::vector<int64_t>{64, 2, 2, 2});
    CHECK(f.tensor("c16").n_bytes() == 512 * 2);
    CHECK(f.tensor("q4k").n_bytes() == 288);
    CHECK(std::memcmp(f.tensor("q4k").data, k_block.data(), k_block.size()) == 0);
    for (const auto& info : f.tensors()) CHECK(info.offset % alignment == 0);
    CHECK(f.find_tensor("missing") == nullptr);
    CHECK(f.find_tensor("b") == &tb);
    CHECK_THROWS_AS(f.tensor("missing"), InputError);

    std::vector<float> out(96);
    kvbench::dequantize_row(ta.type, ta.data, out.data(), 96);
    for (size_t i = 0; i < out.size(); ++i) CHECK(std::fabs(out[i] - a[i]) < 0.003f);
    std::vector<float> c_out(c.size());
    kvbench::dequantize_row(GgmlType::F16, f.tensor("c16").data, c_out.data(), 512);
    for (size_t i = 0; i < c.size(); ++i) CHECK(std::fabs(c_out[i] - c[i]) < 1e-3f);
  }
}

TEST_CASE("arrays of arrays are parsed without crashing", "[unit]") {
  // [[1, 2], [3]] of int32, then a key after it to prove the cursor moved correctly.
  std::vector<uint8_t> nested =
      concat({le32(9), le64(2), le32(5), le64(2), le32(1), le32(2), le32(5), le64(1), le32(3)});
  t::GgufWriter w;
  w.add_raw("nested", GgufValueType::ARRAY, nested);
  // An array of arrays of strings.
  w.add_raw("nested_str", GgufValueType::ARRAY,
            concat({le32(9), le64(1), le32(8), le64(1), le64(2), {'h', 'i'}}));
  w.add("after", t::gguf_u32(42));
  const std::string path = t::temp_path("nested.gguf");
  w.write(path);
  GgufFile f(path);
  CHECK(f.get_int("after") == 42);
  CHECK(f.metadata().at("nested").array_type == GgufValueType::ARRAY);
  CHECK_THROWS_AS(f.get_int_array("nested"), InputError);

  // Nesting 200 levels deep is rejected with a message, not a stack overflow.
  std::vector<uint8_t> deep;
  for (int i = 0; i < 200; ++i) deep = concat({deep, le32(9), le64(1)});
  t::GgufWriter deep_writer;
  deep_writer.add_raw("deep", GgufValueType::ARRAY, deep);
  CHECK(contains(open_error(deep_writer.bytes(), "deep.gguf"), "nested"));
}

TEST_CASE("every truncation of a valid file is an InputError", "[unit]") {
  const std::vector<uint8_t> good = t::small_gguf_bytes();
  REQUIRE(open_error(good, "small.gguf").empty());
  for (size_t len = 0; len < good.size(); ++len) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(len));
    const std::string msg = open_error(cut, "cut.gguf");
    if (msg.empty()) FAIL("truncated at " << len << " bytes still parsed");
  }
  const std::string msg = open_error({good.begin(), good.begin() + 100}, "cut.gguf");
  CHECK(contains(msg, "truncated"));
  CHECK(contains(msg, "(file is 100 bytes)"));
  const std::string in_key = open_error({good.begin(), good.begin() + 400}, "cut.gguf");
  CHECK(contains(in_key, "truncated at byte"));
  CHECK(contains(in_key, "while reading metadata key"));
}

// Byte flips of a small file: each is rejected with one line naming it, or parses into a file
// of the original's shape whose tensor data lies inside the mapping (open_error dequantizes
// every tensor; CI also runs this under ASan, where a read outside it aborts).
TEST_CASE("random corruption never crashes the reader", "[unit]") {
  const std::vector<uint8_t> good = t::small_gguf_bytes();
  const std::string good_path = t::temp_path("flip_good.gguf");
  t::write_file(good_path, good);
  const GgufFile original(good_path);
  std::mt19937 gen(3);
  int rejected = 0, accepted = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    std::vector<uint8_t> bad = good;
    const int flips = 1 + static_cast<int>(gen() % 4);
    for (int i = 0; i < flips; ++i) {
      bad[gen() % bad.size()] = static_cast<uint8_t>(gen());
    }
    if (!open_error(bad, "fuzz.gguf").empty()) {
      ++rejected;
      continue;
    }
    ++accepted;
    const GgufFile f(t::temp_path("fuzz.gguf"));
    CHECK((f.version() == 2 || f.version() == 3));
    CHECK(f.metadata().size() == original.metadata().size());
    REQUIRE(f.tensors().size() == original.tensors().size());
    for (const kvbench::GgufTensorInfo& info : f.tensors()) {
      CHECK(info.n_bytes() >= 0);
      CHECK(info.n_bytes() <= static_cast<int64_t>(bad.size()));
    }
  }
  CHECK(rejected > 0);
  CHECK(accepted > 0);  // flips inside values and names parse, and were checked above
}

// Issue 20: one corrupted count made the reader allocate up to 8 times the file (a uint8
// array read into 8-byte elements, empty strings, the tensor table); a file's metadata may
// now hold at most the file's own size (and 1 MiB) in memory.
TEST_CASE("a count that would hold more in memory than the file is refused", "[unit]") {
  constexpr uint64_t kCount = uint64_t{3} << 20;  // 3 MiB of uint8 in the file, 24 MiB held
  std::vector<uint8_t> payload = concat({le32(0), le64(kCount)});
  payload.resize(payload.size() + kCount, 1);
  t::GgufWriter w;
  w.add_raw("bytes", GgufValueType::ARRAY, payload);
  CHECK(contains(open_error(w.bytes(), "amplified.gguf"), "would hold more in memory"));
  // Empty strings: 8 bytes each in the file, a std::string each in memory.
  std::vector<uint8_t> strings = concat({le32(8), le64(kCount / 8)});
  strings.resize(strings.size() + kCount, 0);
  t::GgufWriter s;
  s.add_raw("strings", GgufValueType::ARRAY, strings);
  CHECK(contains(open_error(s.bytes(), "amplified_strings.gguf"), "would hold more in memory"));
  // Real arrays fit: the small file and the tiny llama's vocabulary parse.
  CHECK(open_error(t::small_gguf_bytes(), "small.gguf").empty());
}


TEST_CASE("malformed headers are rejected with a clear message", "[unit]") {
  const std::vector<uint8_t> good = t::small_gguf_bytes();

  SECTION("bad magic") {
    auto bad = good;
    bad[0] = 'X';
    CHECK(contains(open_error(bad, "magic.gguf"), "bad magic"));
  }
  SECTION("version 1") {
    auto bad = good;
    patch<uint32_t>(bad, 4, 1);
    CHECK(contains(open_error(bad, "v1.gguf"), "version 1 is not supported"));
  }
  SECTION("version 4") {
    auto bad = good;
    patch<uint32_t>(bad, 4, 4);
    CHECK(contains(open_error(bad, "v4.gguf"), "unsupported GGUF version 4"));
  }
  SECTION("absurd metadata count") {
    auto bad = good;
    patch<uint64_t>(bad, 16, 1ull << 62);
    CHECK(contains(open_error(bad, "kv.gguf"), "metadata count"));
  }
  SECTION("absurd tensor count") {
    auto bad = good;
    patch<uint64_t>(bad, 8, ~0ull);
    CHECK(contains(open_error(bad, "nt.gguf"), "tensor count"));
  }
  SECTION("absurd key length") {
    auto bad = good;
    patch<uint64_t>(bad, 24, ~0ull - 3);
    CHECK(contains(open_error(bad, "key.gguf"), "string length"));
  }
  SECTION("missing file, directory, empty file") {
    CHECK_THROWS_AS(GgufFile(t::temp_path("does_not_exist.gguf")), InputError);
    const std::string dir = t::temp_path("a_dir");
    ::mkdir(dir.c_str(), 0700);
    CHECK_THROWS_AS(GgufFile(dir), InputError);
    CHECK(contains(open_error({}, "empty.gguf"), "truncated at byte 0"));
  }
}

TEST_CASE("malformed metadata is rejected", "[unit]") {
  auto error_for = [](const std::string& key, GgufValueType type, std::vector<uint8_t> payload) {
    t::GgufWriter w;
    w.add("first", t::gguf_u8(1));
    w.add_raw(key, type, std::move(payload));
    return open_error(w.bytes(), "meta.gguf");
  };
  CHECK(contains(error_for("huge_str", GgufValueType::STRING, le64(1ull << 62)), "huge_str"));
  CHECK(contains(error_for("huge_arr", GgufValueType::ARRAY, concat({le32(5), le64(1ull << 61)})),
                 "count"));
  CHECK(
      contains(error_for("huge_str_arr", GgufValueType::ARRAY, concat({le32(8), le64(~0ull / 2)})),
               "count"));
  CHECK(contains(error_for("bad_type", static_cast<GgufValueType>(13), {}), "unknown value type"));
  CHECK(contains(error_for("bad_elem", GgufValueType::ARRAY, concat({le32(77), le64(1)})),
                 "unknown value type 77"));
  CHECK(contains(error_for("bad_bool", GgufValueType::BOOL, {2}), "bool"));

  t::GgufWriter dup;
  dup.add("same", t::gguf_u8(1));
  dup.add("same", t::gguf_u8(2));
  CHECK(contains(open_error(dup.bytes(), "dup.gguf"), "duplicate metadata key 'same'"));

  for (uint32_t alignment : {0u, 48u}) {
    t::GgufWriter w;
    w.add("general.alignment", t::gguf_u32(alignment));
    CHECK(contains(open_error(w.bytes(), "align.gguf"), "general.alignment"));
  }
  t::GgufWriter wrong_type;
  wrong_type.add("general.alignment", t::gguf_u64(32));
  CHECK(contains(open_error(wrong_type.bytes(), "align64.gguf"), "general.alignment"));
}

TEST_CASE("malformed tensor infos are rejected", "[unit]") {
  const std::vector<float> values(64, 0.5f);
  const std::vector<uint8_t> raw(256, 0);

  t::GgufWriter unknown;
  unknown.add_tensor_bytes("blk.0.weird", {32}, static_cast<GgmlType>(10), raw);  // Q2_K
  const std::string msg = open_error(unknown.bytes(), "unknown_type.gguf");
  CHECK(contains(msg, "blk.0.weird"));
  CHECK(contains(msg, "type 10"));

  t::GgufWriter five_dims;
  five_dims.add_tensor_bytes("five", {1, 1, 1, 1, 1}, GgmlType::F32, raw);
  CHECK(contains(open_error(five_dims.bytes(), "dims.gguf"), "at most 4"));

  t::GgufWriter negative;
  negative.add_tensor_bytes("neg", {-4}, GgmlType::F32, raw);
  CHECK(contains(open_error(negative.bytes(), "neg.gguf"), "negative"));

  t::GgufWriter overflow;
  overflow.add_tensor_bytes("big", {1ll << 40, 1ll << 40}, GgmlType::F32, raw);
  CHECK(contains(open_error(overflow.bytes(), "overflow.gguf"), "big"));

  t::GgufWriter too_big_bytes;  // elements fit in int64, bytes do not
  too_big_bytes.add_tensor_bytes("huge", {1ll << 31, 1ll << 31}, GgmlType::F32, raw);
  CHECK(contains(open_error(too_big_bytes.bytes(), "huge.gguf"), "huge"));

  t::GgufWriter past_end;  // shape claims more data than the file holds
  past_end.add_tensor_bytes("short", {1024}, GgmlType::F32, raw);
  CHECK(contains(open_error(past_end.bytes(), "past_end.gguf"), "runs past the end"));

  t::GgufWriter ragged;
  ragged.add_tensor_bytes("ragged", {48}, GgmlType::Q8_0, raw);
  CHECK(contains(open_error(ragged.bytes(), "ragged.gguf"), "multiple of 32"));

  t::GgufWriter dup;
  dup.add_tensor("w", {32}, GgmlType::F32, std::vector<float>(32, 1.0f));
  dup.add_tensor("w", {32}, GgmlType::F32, std::vector<float>(32, 1.0f));
  CHECK(contains(open_error(dup.bytes(), "dup_tensor.gguf"), "duplicate tensor name 'w'"));

  // Patch the offset field of the second tensor: misaligned, then far out of range.
  t::GgufWriter two;
  two.add_tensor("first", {64}, GgmlType::F32, values);
  two.add_tensor("second", {64}, GgmlType::F32, values);
  const std::vector<uint8_t> good = two.bytes();
  REQUIRE(open_error(good, "two.gguf").empty());
  const size_t offset_field = find_name(good, "second") + 4 + 8 + 4;
  auto misaligned = good;
  patch<uint64_t>(misaligned, offset_field, 256 + 4);
  CHECK(contains(open_error(misaligned, "misaligned.gguf"), "not a multiple of the alignment"));
  auto far = good;
  patch<uint64_t>(far, offset_field, ~0ull - 31);
  CHECK(contains(open_error(far, "far.gguf"), "runs past the end"));
}

TEST_CASE("the tiny llama file parses back with llama.cpp's keys and shapes", "[unit]") {
  const t::TinyLlamaSpec spec;
  const std::string path = t::temp_path("tiny.gguf");
  t::write_tiny_llama_gguf(path, spec);
  GgufFile f(path);
  CHECK(f.version() == 3);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_int("llama.block_count") == 2);
  CHECK(f.get_int("llama.context_length") == 256);
  CHECK(f.get_int("llama.embedding_length") == 64);
  CHECK(f.get_int("llama.feed_forward_length") == 128);
  CHECK(f.get_int("llama.attention.head_count") == 4);
  CHECK(f.get_int("llama.attention.head_count_kv") == 2);
  CHECK(f.get_float("llama.rope.freq_base") == 10000.0);
  CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon") == static_cast<double>(1e-5f));
  CHECK(f.get_int("llama.rope.dimension_count") == 16);
  CHECK(f.get_string("tokenizer.ggml.model") == "gpt2");
  CHECK(f.get_string("tokenizer.ggml.pre") == "smollm");
  CHECK(f.get_int("tokenizer.ggml.bos_token_id") == 1);
  CHECK(f.get_int("tokenizer.ggml.eos_token_id") == 2);
  CHECK_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  CHECK(contains(f.get_string("tokenizer.chat_template"), "<|im_start|>"));

  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  CHECK(f.get_int("llama.vocab_size") == static_cast<int64_t>(tokens.size()));
  CHECK(tokens == t::tiny_llama_tokens());
  CHECK(tokens[0] == "<|endoftext|>");
  CHECK(tokens[2] == "<|im_end|>");
  CHECK(tokens[t::kTinyLlamaByteTokenBase + ' '] == "Ġ");
  CHECK(tokens[t::kTinyLlamaByteTokenBase + 'a'] == "a");
  const auto types = f.get_int_array("tokenizer.ggml.token_type");
  REQUIRE(types.size() == tokens.size());
  CHECK(types[1] == 3);
  CHECK(types[10] == 1);
  const auto merges = f.get_string_array("tokenizer.ggml.merges");
  // Every merge joins two existing tokens into another existing token.
  for (const std::string& m : merges) {
    const size_t space = m.find(' ');
    REQUIRE(space != std::string::npos);
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    CHECK(std::find(tokens.begin(), tokens.end(), left) != tokens.end());
    CHECK(std::find(tokens.begin(), tokens.end(), right) != tokens.end());
    CHECK(std::find(tokens.begin(), tokens.end(), left + right) != tokens.end());
  }

  const int64_t vocab = static_cast<int64_t>(tokens.size());
  CHECK(f.tensors().size() == 2 + 9 * 2);
  CHECK(f.find_tensor("output.weight") == nullptr);
  CHECK(f.tensor("token_embd.weight").shape == std::vector<int64_t>{64, vocab});
  CHECK(f.tensor("token_embd.weight").type == GgmlType::Q8_0);
  CHECK(f.tensor("output_norm.weight").type == GgmlType::F32);
  CHECK(f.tensor("blk.1.attn_q.weight").shape == std::vector<int64_t>{64, 64});
  CHECK(f.tensor("blk.1.attn_k.weight").shape == std::vector<int64_t>{64, 32});
  CHECK(f.tensor("blk.1.attn_v.weight").shape == std::vector<int64_t>{64, 32});
  CHECK(f.tensor("blk.1.attn_output.weight").shape == std::vector<int64_t>{64, 64});
  CHECK(f.tensor("blk.0.ffn_gate.weight").shape == std::vector<int64_t>{64, 128});
  CHECK(f.tensor("blk.0.ffn_up.weight").shape == std::vector<int64_t>{64, 128});
  CHECK(f.tensor("blk.0.ffn_down.weight").shape == std::vector<int64_t>{128, 64});
  CHECK(f.tensor("blk.0.ffn_norm.weight").shape == std::vector<int64_t>{64});
  CHECK(f.tensor("blk.0.attn_norm.weight").shape == std::vector<int64_t>{64});

  std::vector<float> norm(64);
  kvbench::dequantize_row(GgmlType::F32, f.tensor("blk.0.attn_norm.weight").data, norm.data(), 64);
  for (float x : norm) CHECK(std::fabs(x - 1.0f) < 0.5f);

  // Same seed, same bytes; another seed, other weights.
  const std::string again = t::temp_path("tiny_again.gguf");
  t::write_tiny_llama_gguf(again, spec);
  CHECK(t::read_file_bytes(again) == t::read_file_bytes(path));
  t::TinyLlamaSpec other = spec;
  other.seed = 2;
  t::write_tiny_llama_gguf(again, other);
  CHECK(t::read_file_bytes(again) != t::read_file_bytes(path));
}

TEST_CASE("tiny llama options: untied output, biases, rope factors, weight types", "[unit]") {
  t::TinyLlamaSpec spec;
  spec.tied_embeddings = false;
  spec.qkv_bias = true;
  spec.llama3_rope_scaling = true;
  spec.rope_theta = 500000.0f;
  spec.context_length = 512;
  spec.n_layer = 3;
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                        GgmlType::Q4_0, GgmlType::Q4_1}) {
    spec.weight_type = type;
    const std::string path = t::temp_path("tiny_opts.gguf");
    t::write_tiny_llama_gguf(path, spec);
    GgufFile f(path);
    INFO("weight type " << kvbench::ggml_type_name(type));
    CHECK(f.tensors().size() == 4 + 12 * 3);
    CHECK(f.tensor("output.weight").type == type);
    CHECK(f.tensor("blk.2.ffn_down.weight").type == type);
    CHECK(f.tensor("blk.2.attn_q.bias").shape == std::vector<int64_t>{64});
    CHECK(f.tensor("blk.2.attn_k.bias").shape == std::vector<int64_t>{32});
    CHECK(f.tensor("blk.2.attn_v.bias").type == GgmlType::F32);
    const auto& freqs = f.tensor("rope_freqs.weight");
    REQUIRE(freqs.shape == std::vector<int64_t>{8});
    std::vector<float> factors(8);
    kvbench::dequantize_row(GgmlType::F32, freqs.data, factors.data(), 8);
    CHECK(factors[0] == 1.0f);  // highest frequency is left alone
    CHECK(factors[7] == 8.0f);  // lowest frequency is divided by the full factor
  }
}
