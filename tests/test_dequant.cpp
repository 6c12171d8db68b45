// Dequantization and the test writer's quantizers, bit for bit against gguf-py fixtures
// (scripts/make_dequant_fixtures.py).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "gguf_writer.h"
#include "harness/model/dequant.h"
#include "harness/model/gguf.h"

using kvbench::GgmlType;

namespace {

constexpr GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                                  GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                                  GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

GgmlType type_from_name(const std::string& name) {
  for (GgmlType t : kAllTypes) {
    if (name == kvbench::ggml_type_name(t)) return t;
  }
  FAIL("unknown type name in fixture: " << name);
  return GgmlType::F32;
}

std::vector<uint8_t> parse_hex_bytes(const std::string& hex) {
  REQUIRE(hex.size() % 2 == 0);
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

std::vector<float> parse_hex_floats(const std::string& words) {
  std::istringstream in(words);
  std::vector<float> out;
  std::string w;
  while (in >> w) {
    const auto bits = static_cast<uint32_t>(std::stoul(w, nullptr, 16));
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    out.push_back(f);
  }
  return out;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// One fixture record: "key value" lines from one "type" line to the next.
using Record = std::map<std::string, std::string>;

std::vector<Record> load_fixture(const std::string& name) {
  const std::string path = std::string(KVBENCH_FIXTURES) + "/" + name;
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<Record> records;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    REQUIRE(space != std::string::npos);
    const std::string key = line.substr(0, space);
    if (key == "type") records.emplace_back();
    REQUIRE(!records.empty());
    records.back()[key] = line.substr(space + 1);
  }
  return records;
}

}  // namespace

TEST_CASE("type traits follow ggml's block layouts", "[unit]") {
  CHECK(kvbench::ggml_block_elements(GgmlType::F32) == 1);
  CHECK(kvbench::ggml_block_bytes(GgmlType::F32) == 4);
  CHECK(kvbench::ggml_block_bytes(GgmlType::F16) == 2);
  CHECK(kvbench::ggml_block_bytes(GgmlType::BF16) == 2);
  CHECK(kvbench::ggml_block_elements(GgmlType::Q8_0) == 32);
  CHECK(kvbench::ggml_block_bytes(GgmlType::Q8_0) == 34);
  CHECK(kvbench::ggml_block_bytes(GgmlType::Q4_0) == 18);
  CHECK(kvbench::ggml_block_bytes(GgmlType::Q4_1) == 20);
  CHECK(kvbench::ggml_block_elements(GgmlType::Q5_0) == 32);
  CHECK(kvbench::ggml_block_bytes(GgmlType::Q5_0) == 22);
  CHECK(kvbench::ggml_block_bytes(GgmlType::Q5_1) == 24);
  CHECK(kvbench::ggml_block_elements(GgmlType::Q4_K) == 256);
  CHECK(kvbench::ggml_block_bytes(GgmlType::Q4_K) == 144);
  CHECK(kvbench::ggml_block_elements(GgmlType::Q5_K) == 256);
  CHECK(kvbench::ggml_block_bytes(GgmlType::Q5_K) == 176);
  CHECK(kvbench::ggml_block_bytes(GgmlType::Q6_K) == 210);
  CHECK(kvbench::ggml_row_bytes(GgmlType::Q4_1, 576) == 18 * 20);
  CHECK(kvbench::ggml_row_bytes(GgmlType::Q5_0, 896) == 28 * 22);
  CHECK(kvbench::ggml_row_bytes(GgmlType::Q6_K, 512) == 420);
  for (GgmlType t : kAllTypes) CHECK(kvbench::ggml_type_supported(t));
  CHECK(std::string(kvbench::ggml_type_name(GgmlType::Q4_K)) == "Q4_K");
  CHECK(std::string(kvbench::ggml_type_name(GgmlType::Q5_0)) == "Q5_0");
  const auto q2_k = static_cast<GgmlType>(10);  // a real ggml type kvbench does not decode
  CHECK_FALSE(kvbench::ggml_type_supported(q2_k));
  CHECK(std::string(kvbench::ggml_type_name(q2_k)) == "unknown");
  CHECK(kvbench::ggml_block_bytes(q2_k) == 0);
}

TEST_CASE("dequantize_row matches gguf-py bit for bit", "[unit]") {
  const std::vector<Record> records = load_fixture("dequant_expected.txt");
  REQUIRE(records.size() == std::size(kAllTypes));
  for (const Record& r : records) {
    const GgmlType type = type_from_name(r.at("type"));
    const int64_t n = std::stoll(r.at("elements"));
    const std::vector<uint8_t> raw = parse_hex_bytes(r.at("bytes"));
    const std::vector<float> expected = parse_hex_floats(r.at("values"));
    INFO("type " << r.at("type"));
    REQUIRE(static_cast<int64_t>(expected.size()) == n);
    REQUIRE(static_cast<int64_t>(raw.size()) == kvbench::ggml_row_bytes(type, n));
    std::vector<float> got(static_cast<size_t>(n));
    kvbench::dequantize_row(type, raw.data(), got.data(), n);
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (bits_of(got[i]) != bits_of(expected[i]) && mismatches++ < 5) {
        FAIL_CHECK("element " << i << ": got " << got[i] << " expected " << expected[i]);
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("dequantize_row reads unaligned source blocks", "[unit]") {
  const std::vector<Record> records = load_fixture("dequant_expected.txt");
  for (const Record& r : records) {
    const GgmlType type = type_from_name(r.at("type"));
    const int64_t n = std::stoll(r.at("elements"));
    const std::vector<uint8_t> raw = parse_hex_bytes(r.at("bytes"));
    std::vector<uint8_t> shifted(raw.size() + 1);
    std::memcpy(shifted.data() + 1, raw.data(), raw.size());
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    kvbench::dequantize_row(type, raw.data(), a.data(), n);
    kvbench::dequantize_row(type, shifted.data() + 1, b.data(), n);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("dequantize_row rejects unsupported types", "[unit]") {
  uint8_t block[64] = {};
  float out[32];
  CHECK_THROWS_AS(kvbench::dequantize_row(static_cast<GgmlType>(10), block, out, 32),
                  kvbench::InputError);
}

TEST_CASE("the writer quantizes like gguf-py", "[unit]") {
  const std::vector<Record> records = load_fixture("dequant_quantize.txt");
  REQUIRE(records.size() == 5);
  for (const Record& r : records) {
    const GgmlType type = type_from_name(r.at("type"));
    const std::vector<float> input = parse_hex_floats(r.at("input"));
    const std::vector<uint8_t> expected = parse_hex_bytes(r.at("bytes"));
    INFO("type " << r.at("type"));
    REQUIRE(static_cast<int64_t>(input.size()) == std::stoll(r.at("elements")));
    const std::vector<uint8_t> got =
        kvbench::testing::quantize(type, input.data(), static_cast<int64_t>(input.size()));
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != expected[i]) {
        FAIL("byte " << i << ": got " << int{got[i]} << " expected " << int{expected[i]});
      }
    }
  }
}

TEST_CASE("quantize then dequantize stays within half a step", "[unit]") {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> x(32 * 17);
  for (float& v : x) v = normal(gen);
  const auto n = static_cast<int64_t>(x.size());
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1}) {
    const std::vector<uint8_t> q = kvbench::testing::quantize(type, x.data(), n);
    REQUIRE(static_cast<int64_t>(q.size()) == kvbench::ggml_row_bytes(type, n));
    std::vector<float> y(x.size());
    kvbench::dequantize_row(type, q.data(), y.data(), n);
    for (size_t b = 0; b < x.size() / 32; ++b) {
      uint16_t d_bits;
      std::memcpy(&d_bits, q.data() + b * static_cast<size_t>(kvbench::ggml_block_bytes(type)), 2);
      const float step = std::fabs(kvbench::fp16_to_fp32(d_bits));
      for (size_t j = b * 32; j < b * 32 + 32; ++j) {
        // Half a step plus the fp16 rounding of the scales; Q4_0 clamps its top level, so
        // its largest error is a full step.
        const float limit = (type == GgmlType::Q4_0 ? 1.1f : 0.6f) * step;
        CHECK(std::fabs(x[j] - y[j]) <= limit);
      }
    }
  }
}

TEST_CASE("fp16 conversions round trip and round to nearest even", "[unit]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = kvbench::fp16_to_fp32(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0;
    if (is_nan) {
      CHECK(std::isnan(f));
      CHECK(std::isnan(kvbench::fp16_to_fp32(kvbench::fp32_to_fp16(f))));
    } else if (kvbench::fp32_to_fp16(f) != h) {
      FAIL("fp16 " << h << " does not round trip");
    }
  }
  CHECK(kvbench::fp16_to_fp32(0x3C00) == 1.0f);
  CHECK(kvbench::fp16_to_fp32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(kvbench::fp16_to_fp32(0xFBFF) == -65504.0f);
  CHECK(kvbench::fp32_to_fp16(65519.0f) == 0x7BFF);
  CHECK(kvbench::fp32_to_fp16(65520.0f) == 0x7C00);          // midpoint rounds to even: inf
  CHECK(kvbench::fp32_to_fp16(std::ldexp(1.0f, -25)) == 0);  // tie with zero goes to zero
  CHECK(kvbench::fp32_to_fp16(std::ldexp(1.5f, -25)) == 1);
  CHECK(kvbench::fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);  // tie to even
  CHECK(kvbench::fp32_to_fp16(1.0f + std::ldexp(3.0f, -11)) == 0x3C02);  // tie to even
  CHECK(kvbench::bf16_to_fp32(0x3F80) == 1.0f);
  CHECK(kvbench::bf16_to_fp32(0xC040) == -3.0f);
}

#if defined(__F16C__)
TEST_CASE("fp32_to_fp16 agrees with the F16C instruction", "[unit]") {
  std::mt19937 gen(11);
  for (int i = 0; i < (1 << 22); ++i) {
    // Uniform bit patterns cover every exponent; NaNs are skipped (payloads differ).
    const uint32_t bits = gen();
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    if (std::isnan(f)) continue;
    const auto hw = static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
    if (kvbench::fp32_to_fp16(f) != hw) FAIL("bits " << bits << " hw " << hw);
  }
}
#endif
