// Plain layout structs shared by the CPU kernels (kernels/cpu) and their CUDA twins
// (kernels/cuda). Framework-free: raw pointers with the shape written beside each one.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace kvbench {

// Keys and values of one layer, stored per KV head (GQA stays GQA: never expanded per query
// head). Token t of head h lives at k[(h * capacity + t) * head_dim]. Each KV head has its
// own positions because per-head eviction (SnapKV, H2O, Knorm) keeps different tokens in
// different heads; every head holds the same number of tokens, except in a view of a layer
// whose heads hold their own counts (head_tokens).
struct DenseKv {
  const float* k;            // [n_kv_heads, capacity, head_dim]
  const float* v;            // [n_kv_heads, capacity, head_dim]
  const int32_t* positions;  // [n_kv_heads, capacity] original sequence position of each slot
  int32_t n_kv_heads;
  int32_t head_dim;
  int64_t capacity;          // row stride between heads, in tokens
  int64_t n_tokens;          // stored tokens, all valid (the largest head's, see head_tokens)
  // nullptr: every head holds n_tokens. Else the view is of a layer whose heads hold their
  // own counts (head-wise budgets, after a ragged RetainPlan; cache/ragged_view.h): KV head h
  // holds its first head_tokens[h] rows, each count <= n_tokens, and the rows after them to
  // n_tokens are padding (keys and values 0, position kPaddingPosition, which no query
  // attends: attention and its scores skip them as they skip any later position).
  const int64_t* head_tokens = nullptr;

  // The tokens KV head h holds.
  int64_t tokens(int32_t h) const {
    check_head(h);
    return head_tokens ? head_tokens[h] : n_tokens;
  }
  // Token t of KV head h: its key and its value (head_dim floats each) and its position.
  // A head's tokens are `capacity` rows apart, not n_tokens (the two differ once the cache
  // has room for more), so code outside the kernels reads through these; each checks that
  // h < n_kv_heads and t < tokens(h) (std::out_of_range otherwise), once a row.
  const float* key(int32_t h, int64_t t) const { return k + row(h, t) * head_dim; }
  const float* value(int32_t h, int64_t t) const { return v + row(h, t) * head_dim; }
  int32_t position(int32_t h, int64_t t) const { return positions[row(h, t)]; }
  int64_t row(int32_t h, int64_t t) const {
    if (t < 0 || t >= tokens(h)) {
      throw std::out_of_range("DenseKv: token " + std::to_string(t) + " of KV head " +
                              std::to_string(h) + " (" + std::to_string(tokens(h)) +
                              " tokens in that head, " + std::to_string(n_kv_heads) + " heads)");
    }
    return static_cast<int64_t>(h) * capacity + t;
  }
  int32_t check_head(int32_t h) const {
    if (h < 0 || h >= n_kv_heads) {
      throw std::out_of_range("DenseKv: KV head " + std::to_string(h) + " of " +
                              std::to_string(n_kv_heads));
    }
    return h;
  }
};

// The position of a ragged view's padding rows (DenseKv::head_tokens): after every real one,
// so causal attention never reads them.
constexpr int32_t kPaddingPosition = 0x7fffffff;

// How a narrow store holds each key and value element (kernels/cpu/narrow.h converts):
// IEEE fp16 or bf16, as engines hold their caches, or fp8 e4m3 (OCP "e4m3fn": no
// infinities, largest 448) times a scale per row (one token of one KV head).
enum class KvElement : int32_t { F16, BF16, F8E4M3 };

constexpr int32_t kv_element_bytes(KvElement element) {
  return element == KvElement::F8E4M3 ? 1 : 2;
}

// DenseKv's layout with narrow elements: token t of head h holds
// k[(h * capacity + t) * head_dim] .. + head_dim elements of `element`; for fp8 its row
// scale is k_scale[h * capacity + t] (value = e4m3 code's value * scale), nullptr otherwise.
struct NarrowKv {
  const void* k;             // [n_kv_heads, capacity, head_dim] elements
  const void* v;             // [n_kv_heads, capacity, head_dim] elements
  const float* k_scale;      // [n_kv_heads, capacity] fp8 only
  const float* v_scale;      // [n_kv_heads, capacity] fp8 only
  const int32_t* positions;  // [n_kv_heads, capacity]
  KvElement element;
  int32_t n_kv_heads;
  int32_t head_dim;
  int64_t capacity;          // row stride between heads, in tokens
  int64_t n_tokens;          // stored tokens, all valid
};

// How a query chunk's activations are rounded (AttentionQuery::rounding).
enum class QueryRounding : int32_t { None, Int8 };

// Queries of one layer for a chunk of new tokens, and where the result goes.
// Causal by position: query i sees slot t of KV head h iff
// positions[h * capacity + t] <= q_positions[i].
struct AttentionQuery {
  const float* q;              // [n_queries, n_heads, head_dim], RoPE already applied
  const int32_t* q_positions;  // [n_queries]
  float* out;                  // [n_queries, n_heads, head_dim]
  int32_t n_queries;
  int32_t n_heads;             // multiple of n_kv_heads; head h reads KV head h / (n_heads / n_kv_heads)
  float scale;                 // usually 1 / sqrt(head_dim)
  // Int8: the chunk runs on int8 activations (--decode-activations / --prefill-activations
  // int8), and a kernel reading a quantized cache may round q and the probabilities to int8
  // as llama.cpp does against its quantized KV (KIVI, kernels/cpu/kivi_attention.cpp).
  QueryRounding rounding = QueryRounding::None;
};

// The chunk's last query row alone (TOVA scores by it): the same output pointer, which the
// callers that use this slice do not write through.
inline AttentionQuery last_query_row(const AttentionQuery& query, int32_t head_dim) {
  AttentionQuery last = query;
  last.q += static_cast<int64_t>(query.n_queries - 1) * query.n_heads * head_dim;
  last.q_positions += query.n_queries - 1;
  last.n_queries = 1;
  return last;
}

// Weights in a ggml block format, row-major: row r starts at data + r * row_bytes.
enum class BlockFormat : int32_t { F32, Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q6_K };

// Elements of one block: 256 for the K-quant super-blocks, 32 for the others (F32 counts
// in blocks of 32 floats).
constexpr int64_t block_format_elements(BlockFormat format) {
  return format == BlockFormat::Q4_K || format == BlockFormat::Q6_K ? 256 : 32;
}

// Bytes of one block: Q4_0 fp16 d + 16 nibble bytes; Q4_1 fp16 d, m + 16;
// Q5_0 fp16 d + 4 bytes of fifth bits + 16; Q5_1 fp16 d, m + 4 + 16; Q8_0 fp16 d + 32 int8;
// Q4_K fp16 d, dmin + 12 bytes of 6-bit scales and mins + 128 nibble bytes; Q6_K 128 bytes
// of low nibbles + 64 of high bit pairs + 16 int8 scales + fp16 d; F32 32 floats.
constexpr int64_t block_format_bytes(BlockFormat format) {
  switch (format) {
    case BlockFormat::Q4_0: return 18;
    case BlockFormat::Q4_1: return 20;
    case BlockFormat::Q8_0: return 34;
    case BlockFormat::Q5_0: return 22;
    case BlockFormat::Q5_1: return 24;
    case BlockFormat::Q4_K: return 144;
    case BlockFormat::Q6_K: return 210;
    case BlockFormat::F32: return 128;
  }
  return 0;
}

struct BlockMatrix {
  const void* data;  // [rows, row_bytes]
  BlockFormat format;
  int64_t rows;      // output features
  int64_t cols;      // input features, a multiple of block_format_elements(format)
  int64_t row_bytes;
};

// Groups of values quantized to `bits` (2 or 4) with asymmetric min/max, as KIVI stores
// keys (a group = one channel over a block of tokens) and values (a group = a run of one
// token's channels): q = round((x - min) / scale), scale = (max - min) / (2^bits - 1),
// x ~ min + q * scale. A group's codes are packed low bits first: value i sits in byte
// i / (8 / bits) at bit (i % (8 / bits)) * bits. Where the group sits in the float array is
// the kernel's arguments (two strides), so one layout serves keys and values.
struct QuantGroups {
  uint8_t* packed;     // [n_groups, group_bytes()]
  float* scale;        // [n_groups]
  float* min;          // [n_groups]
  int64_t n_groups;
  int32_t group_size;  // values per group; group_size * bits a multiple of 8
  int32_t bits;        // 2 or 4
  int64_t group_bytes() const { return static_cast<int64_t>(group_size) * bits / 8; }
};

// cos and sin of position * inv_freq[i] for every position in [0, 2^24), from three tables
// of 256 angles: position = a * 65536 + b * 256 + c, and the sum's cos and sin by complex
// products (no trigonometry where keys are read).
struct RopeAngles {
  const double* cos_sin;  // [3, 256, n_pairs, 2]: (l, x, i) cos and sin of x 256^l inv_freq[i]
  int32_t n_pairs;        // head_dim / 2; RoPE turns the pairs (2i, 2i + 1)
};

// Values kept apart from the codes, in fp16, per KV head (KVQuant's dense-and-sparse
// quantization), as compressed sparse rows: slot t's are entries [start[t], start[t + 1]).
// Channel c < head_dim is key channel c, c >= head_dim value channel c - head_dim; the
// entry's value replaces what the codes give there.
struct SparseRows {
  const int32_t* start;     // [n_tokens + 1]
  const uint16_t* channel;  // [start[n_tokens]]
  const uint16_t* value;    // [start[n_tokens]] IEEE fp16 bits
};

// One layer of KVQuant storage (kvquant_keys): every token of every KV head as `bits`-bit
// codes of its key before RoPE, per channel (x ~ k_min[c] + code * k_scale[c], one range per
// channel of the KV head), and of its value, per token (x ~ v_min + code * v_scale), plus its
// outliers. A row's codes are a bit stream, element i at bits [i bits, (i + 1) bits), low
// bits first (QuantGroups' packing at 2 and 4 bits). Keys are turned to their positions with
// `rope` as they are read.
struct KvQuantKv {
  const uint8_t* k_codes;      // [n_kv_heads, capacity, head_dim * bits / 8] keys before RoPE
  const uint8_t* v_codes;      // [n_kv_heads, capacity, head_dim * bits / 8]
  const float* k_scale;        // [n_kv_heads, head_dim] per channel
  const float* k_min;          // [n_kv_heads, head_dim]
  const float* v_scale;        // [n_kv_heads, capacity] per token
  const float* v_min;          // [n_kv_heads, capacity]
  const int32_t* positions;    // [n_kv_heads, capacity]
  const SparseRows* outliers;  // [n_kv_heads]
  RopeAngles rope;
  int32_t n_kv_heads;
  int32_t head_dim;  // a multiple of 8
  int32_t bits;      // 2, 3 or 4
  int64_t capacity;  // row stride between heads, in tokens
  int64_t n_tokens;  // stored tokens, all valid
};

// Pages of stored slots that attention reads (Quest): KV head h reads slots
// [p * page_tokens, min((p + 1) * page_tokens, n_tokens)) for each page p in
// pages[h * n_selected + i], ascending in i. Absent (nullptr): every slot is read.
struct PageSelection {
  const int32_t* pages;  // [n_kv_heads, n_selected]
  int32_t n_selected;
  int32_t page_tokens;
};

// Which keys a prefill chunk's attention reads (sparse prefill: A-shape, Tri-shape,
// MInference's vertical-slash), by position. Query head h at position qp reads a stored key
// at position kp <= qp iff qp >= dense_from (the prompt's last rows attend densely), or
// kp < sink, or qp - kp < local, or kp is one of h's columns, or qp - kp one of h's
// offsets (diagonals). Keys it does not read are neither computed nor attended.
struct SparsePattern {
  int32_t sink;            // key positions [0, sink) are read by every query
  int32_t local;           // the last `local` positions up to the query's own
  int32_t dense_from;      // query positions from here read every key
  const int32_t* columns;  // [n_heads, n_columns] key positions; nullptr when n_columns 0
  int32_t n_columns;
  const int32_t* offsets;  // [n_heads, n_offsets] qp - kp >= 0; nullptr when n_offsets 0
  int32_t n_offsets;
};

// Query-key pairs of a sparse prefill, counted per query head: those computed (the
// pattern's, causal) and those a dense causal attention of the same rows computes.
struct AttentionPairs {
  int64_t computed = 0;
  int64_t dense = 0;
};

// Quest's page metadata for one layer: the elementwise minimum and maximum of the keys of
// each page of page_tokens consecutive slots (the last page may be partial).
struct PageBounds {
  float* k_min;           // [n_kv_heads, page_capacity, head_dim]
  float* k_max;           // [n_kv_heads, page_capacity, head_dim]
  int32_t n_kv_heads;
  int32_t head_dim;
  int32_t page_tokens;
  int64_t page_capacity;  // row stride between heads, in pages
  int64_t n_pages;        // pages holding at least one slot
};

// One layer of KIVI storage: blocks of `group` slots quantized to `bits` (keys per channel
// over the block's tokens, values per token in groups of `group` channels; QuantGroups'
// packing), then a fp32 tail of the most recent tokens. Slots [0, n_blocks * group) are
// the blocks (block b holds slots b * group + i), the tail's slot t is n_blocks * group + t.
// Block-major, so a new block is appended without moving the others.
struct KiviKv {
  const uint8_t* k_codes;    // [n_blocks, n_kv_heads, head_dim, group * bits / 8]
  const float* k_scale;      // [n_blocks, n_kv_heads, head_dim]
  const float* k_min;        // [n_blocks, n_kv_heads, head_dim]
  const uint8_t* v_codes;    // [n_blocks, n_kv_heads, group, head_dim * bits / 8]
  const float* v_scale;      // [n_blocks, n_kv_heads, group, head_dim / group]
  const float* v_min;        // [n_blocks, n_kv_heads, group, head_dim / group]
  const int32_t* positions;  // [n_blocks, n_kv_heads, group]
  int64_t n_blocks;
  int32_t group;             // 32; head_dim a multiple of it
  int32_t bits;              // 2 or 4
  DenseKv tail;              // the fp32 tail (n_kv_heads and head_dim as the blocks')
};

}  // namespace kvbench
