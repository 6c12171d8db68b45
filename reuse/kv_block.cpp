#include "reuse/kv_block.h"

#include <xxhash.h>

#include <cstring>

namespace kvbench {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'B', 'L', 'O', 'C', 'K', '1'};

// Fixed-size header; the key and model id are hex SHA-256 strings (64 characters).
struct Header {
  char magic[8];
  char key[64];
  char model_id[64];
  int32_t n_layers;
  int32_t n_kv_heads;
  int32_t head_dim;
  int32_t first_position;
  int64_t n_tokens;
};
static_assert(sizeof(Header) == 160, "the header is written as is");

void copy_id(char* out, const std::string& id) {
  std::memset(out, 0, 64);
  std::memcpy(out, id.data(), std::min<size_t>(id.size(), 64));
}

bool same_id(const char* stored, const std::string& id) {
  char expected[64];
  copy_id(expected, id);
  return std::memcmp(stored, expected, 64) == 0;
}

int64_t tokens_bytes(int64_t n) {  // padded to 8 bytes so the floats after stay aligned
  return (n * static_cast<int64_t>(sizeof(int32_t)) + 7) / 8 * 8;
}

int64_t payload_bytes(const KvBlockShape& shape, int64_t n) {
  return 2ll * shape.n_layers * n * shape.kv_width() * static_cast<int64_t>(sizeof(float));
}

}  // namespace

int64_t kv_block_bytes(const KvBlockShape& shape, int64_t n_tokens) {
  return static_cast<int64_t>(sizeof(Header)) + tokens_bytes(n_tokens) +
         payload_bytes(shape, n_tokens) + static_cast<int64_t>(sizeof(uint64_t));
}

KvBlockWriter::KvBlockWriter(const std::string& key, const std::string& model_id,
                             const KvBlockShape& shape, const int32_t* tokens, int64_t n_tokens,
                             int32_t first_position)
    : bytes_(kv_block_bytes(shape, n_tokens)), shape_(shape), n_tokens_(n_tokens) {
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  copy_id(header.key, key);
  copy_id(header.model_id, model_id);
  header.n_layers = shape.n_layers;
  header.n_kv_heads = shape.n_kv_heads;
  header.head_dim = shape.head_dim;
  header.first_position = first_position;
  header.n_tokens = n_tokens;
  std::memcpy(bytes_.data(), &header, sizeof(header));
  std::memcpy(bytes_.data() + sizeof(header), tokens, n_tokens * sizeof(int32_t));
}

float* KvBlockWriter::k(int32_t layer) {
  const int64_t layer_floats = 2 * n_tokens_ * shape_.kv_width();
  return reinterpret_cast<float*>(bytes_.data() + sizeof(Header) + tokens_bytes(n_tokens_)) +
         layer * layer_floats;
}

float* KvBlockWriter::v(int32_t layer) { return k(layer) + n_tokens_ * shape_.kv_width(); }

SharedBytes KvBlockWriter::finish() {
  seal_kv_block(bytes_.data(), bytes_.size());
  return std::make_shared<const Bytes>(std::move(bytes_));
}

void seal_kv_block(uint8_t* bytes, size_t n) {
  const size_t body = n - sizeof(uint64_t);
  const uint64_t checksum = XXH3_64bits(bytes, body);
  std::memcpy(bytes + body, &checksum, sizeof(checksum));
}

std::string read_kv_block_layout(const uint8_t* bytes, size_t n, KvBlockLayout* layout) {
  if (n < sizeof(Header) + sizeof(uint64_t)) return "truncated block";
  Header header;
  std::memcpy(&header, bytes, sizeof(header));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) return "not a kvbench KV block";
  const KvBlockShape shape{header.n_layers, header.n_kv_heads, header.head_dim};
  if (shape.n_layers < 1 || shape.n_layers > 1024 || shape.n_kv_heads < 1 ||
      shape.head_dim < 1 || shape.n_kv_heads > 65536 || shape.head_dim > 65536 ||
      shape.kv_width() > 65536 || header.n_tokens < 0 || header.n_tokens > (int64_t{1} << 24)) {
    return "block header with a shape out of bounds";
  }
  const int64_t offset = static_cast<int64_t>(sizeof(Header)) + tokens_bytes(header.n_tokens);
  if (static_cast<int64_t>(n) < offset + static_cast<int64_t>(sizeof(uint64_t))) {
    return "truncated block";
  }
  layout->shape = shape;
  layout->n_tokens = header.n_tokens;
  layout->payload_offset = offset;
  layout->total_bytes = kv_block_bytes(shape, header.n_tokens);
  return "";
}

std::string check_kv_block(const uint8_t* bytes, size_t n, KvBlockLayout* layout) {
  const std::string why = read_kv_block_layout(bytes, n, layout);
  if (!why.empty()) return why;
  if (static_cast<int64_t>(n) != layout->total_bytes) return "block of the wrong size";
  const size_t body = n - sizeof(uint64_t);
  uint64_t stored = 0;
  std::memcpy(&stored, bytes + body, sizeof(stored));
  if (XXH3_64bits(bytes, body) != stored) return "checksum mismatch";
  return "";
}

const float* KvBlockView::k(int32_t layer) const {
  return reinterpret_cast<const float*>(payload) + layer * 2 * n_tokens * shape.kv_width();
}

const float* KvBlockView::v(int32_t layer) const { return k(layer) + n_tokens * shape.kv_width(); }

std::string decode_kv_block(const Bytes& bytes, const std::string& key, const std::string& model_id,
                            const KvBlockShape& shape, const int32_t* tokens, int64_t n_tokens,
                            KvBlockView* view) {
  if (bytes.size() < sizeof(Header) + sizeof(uint64_t)) return "truncated block";
  Header header;
  std::memcpy(&header, bytes.data(), sizeof(header));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) return "not a kvbench KV block";
  if (header.n_tokens != n_tokens || header.n_layers != shape.n_layers ||
      header.n_kv_heads != shape.n_kv_heads || header.head_dim != shape.head_dim) {
    return "block of another shape";
  }
  if (static_cast<int64_t>(bytes.size()) != kv_block_bytes(shape, n_tokens)) {
    return "block of the wrong size";
  }
  const size_t body = bytes.size() - sizeof(uint64_t);
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + body, sizeof(stored));
  if (XXH3_64bits(bytes.data(), body) != stored) return "checksum mismatch";
  if (!same_id(header.key, key)) return "block stored under another key";
  if (!same_id(header.model_id, model_id)) return "block of another model";
  const int32_t* stored_tokens = reinterpret_cast<const int32_t*>(bytes.data() + sizeof(Header));
  if (std::memcmp(stored_tokens, tokens, n_tokens * sizeof(int32_t)) != 0) {
    return "block of other tokens";
  }
  view->n_tokens = n_tokens;
  view->first_position = header.first_position;
  view->tokens = stored_tokens;
  view->shape = shape;
  view->payload = bytes.data() + sizeof(Header) + tokens_bytes(n_tokens);
  return "";
}

}  // namespace kvbench
