// SHA-256 against FIPS 180-4's example vectors, fed whole and in odd pieces.
#include <catch2/catch.hpp>

#include <string>

#include "gguf_writer.h"
#include "common/input_error.h"
#include "common/sha256.h"

using namespace kvbench;

namespace {

std::string hash_of(const std::string& text, size_t piece) {
  Sha256 h;
  for (size_t i = 0; i < text.size(); i += piece) h.update(text.data() + i, std::min(piece, text.size() - i));
  return h.hex_digest();
}

}  // namespace

TEST_CASE("sha256: FIPS 180-4 vectors, in any split", "[unit]") {
  const std::string million_a(1000000, 'a');
  const struct {
    std::string text;
    const char* digest;
  } cases[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {million_a, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
  };
  for (const auto& c : cases) {
    for (size_t piece : {size_t{1}, size_t{7}, size_t{63}, size_t{64}, size_t{65}, size_t{1} << 20}) {
      if (c.text.size() > 100000 && piece < 64) continue;
      INFO(c.text.size() << " bytes in pieces of " << piece);
      CHECK(hash_of(c.text, piece) == c.digest);
    }
  }
}

TEST_CASE("sha256: a file, and a missing one named", "[unit]") {
  const std::string path = testing::temp_path("hash_me.bin");
  testing::write_file(path, std::vector<uint8_t>{'a', 'b', 'c'});
  CHECK(sha256_file(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK_THROWS_WITH(sha256_file(path + ".missing"), Catch::Contains(path + ".missing"));
}
