#include "reuse/prefix_cache.h"

#include <chrono>
#include <stdexcept>

#include "cache/registry.h"
#include "common/elapsed.h"
#include "reuse/block_key.h"
#include "reuse/kv_block.h"

namespace kvbench {

namespace {

using Clock = std::chrono::steady_clock;

void add_fault(std::string& faults, const std::string& what) {
  faults += (faults.empty() ? "" : "; ") + what;
}

KvBlockShape block_shape(const KvShape& shape) {
  return KvBlockShape{shape.n_layers, shape.n_kv_heads, shape.head_dim};
}

}  // namespace

std::unique_ptr<ReuseConfig> prefix_reuse_config(const ResolvedSpec& spec) {
  const MethodParams* prefix = spec.find(MethodKind::Reuse);
  if (!prefix || !prefix->has("block")) return nullptr;
  auto config = std::make_unique<ReuseConfig>();
  config->block_tokens = prefix->get_int("block");
  if (const MethodParams* tiers = spec.find(MethodKind::Tiers)) {
    TierConfig& t = config->tiers;
    t.device_bytes = tiers->get_bytes("device");
    t.cpu_bytes = tiers->get_bytes("cpu");
    t.disk_dir = tiers->has("disk") ? tiers->get("disk") : "";
    t.disk_bytes = tiers->get_bytes("disk_size");
    t.disk_codec = parse_codec(tiers->get("disk_codec"));
    t.redis = tiers->has("redis") ? tiers->get("redis") : "";
    t.redis_bytes = tiers->get_bytes("redis_size");
    t.redis_codec = parse_codec(tiers->get("redis_codec"));
    t.policy = parse_replacement(tiers->get("policy"));
    t.ttl_s = tiers->get_float("ttl");
  } else {
    config->tiers.device_bytes = int64_t{1} << 30;  // as tiers' default
  }
  if (const MethodParams* pin = spec.find(MethodKind::Pinning)) {
    config->tiers.pin_ttl_s = pin->get_float("ttl");
  }
  return config;
}

// The blocks being recorded for store(): one encoded block per whole block of the prompt
// from the first uncached one, filled row by row as the model hands the cache its KV.
struct PrefixCache::Capture {
  KvCache* cache = nullptr;
  int64_t first_block = 0;
  std::vector<std::string> keys;
  std::vector<KvBlockWriter> writers;
  std::vector<int64_t> rows_filled;  // per block: rows written, over all layers
};

PrefixCache::PrefixCache(const ReuseConfig& config, const std::string& model_id,
                         const KvShape& shape, std::function<double()> clock)
    : config_(config), model_id_(model_id), shape_(shape), store_(config.tiers, std::move(clock)) {}

PrefixCache::~PrefixCache() {
  if (capture_ && capture_->cache) capture_->cache->set_tap(nullptr);
}

int64_t PrefixCache::load(const std::vector<int32_t>& prompt, KvCache& cache, ReuseTurn& turn) {
  if (cache.next_position() != 0) throw std::logic_error("PrefixCache::load: the cache is not empty");
  const auto start = Clock::now();
  store_.expire();  // a pin that ran out while no request came is freed before the lookup
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t b = config_.block_tokens;
  turn.tokens_looked_up = n;
  // The last token is always computed: its logits answer the request.
  const std::vector<std::string> keys = chain_block_keys(model_id_, prompt.data(), n - 1, b);
  std::vector<int32_t> positions(b);
  int64_t loaded = 0;
  for (const std::string& key : keys) {
    std::string from;
    const SharedBytes bytes = store_.get(key, &from);
    if (!bytes) {
      ++turn.blocks_missed;
      break;
    }
    KvBlockView view;
    const std::string bad = decode_kv_block(*bytes, key, model_id_, block_shape(shape_),
                                            prompt.data() + loaded, b, &view);
    if (!bad.empty() || view.first_position != loaded) {
      // Never served: dropped from every tier and prefilled instead.
      add_fault(turn.faults, "block " + key.substr(0, 12) + " from " + from + ": " +
                                 (bad.empty() ? "stored at another position" : bad));
      store_.erase(key);
      ++turn.blocks_missed;
      break;
    }
    for (int64_t i = 0; i < b; ++i) positions[i] = static_cast<int32_t>(loaded + i);
    for (int32_t l = 0; l < shape_.n_layers; ++l) {
      cache.append(l, view.k(l), view.v(l), positions.data(), b);
    }
    cache.advance(static_cast<int32_t>(b));
    loaded += b;
    ++turn.blocks_hit;
    turn.bytes_loaded += static_cast<int64_t>(bytes->size());
    if (turn.served_by.find(from) == std::string::npos) {
      turn.served_by += (turn.served_by.empty() ? "" : ",") + from;
    }
  }
  turn.tokens_reused = loaded;
  turn.load_ms = ms_since(start);
  return loaded;
}

void PrefixCache::start_capture(KvCache& cache, const std::vector<int32_t>& prompt, int64_t from) {
  const int64_t b = config_.block_tokens;
  auto capture = std::make_unique<Capture>();
  capture->cache = &cache;
  capture->first_block = (from + b - 1) / b;
  const std::vector<std::string> keys =
      chain_block_keys(model_id_, prompt.data(), static_cast<int64_t>(prompt.size()), b);
  for (size_t i = capture->first_block; i < keys.size(); ++i) {
    capture->keys.push_back(keys[i]);
    capture->writers.emplace_back(keys[i], model_id_, block_shape(shape_), prompt.data() + i * b,
                                  b, static_cast<int32_t>(i * b));
    capture->rows_filled.push_back(0);
  }
  capture_ = std::move(capture);
  cache.set_tap(this);
}

void PrefixCache::appended(int32_t layer, const float* k, const float* v, const int32_t* positions,
                           int64_t n) {
  Capture& c = *capture_;
  const int64_t b = config_.block_tokens;
  const int64_t width = static_cast<int64_t>(shape_.n_kv_heads) * shape_.head_dim;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t block = positions[i] / b - c.first_block;
    if (block < 0 || block >= static_cast<int64_t>(c.writers.size())) continue;
    const int64_t row = positions[i] % b;
    std::copy(k + i * width, k + (i + 1) * width, c.writers[block].k(layer) + row * width);
    std::copy(v + i * width, v + (i + 1) * width, c.writers[block].v(layer) + row * width);
    ++c.rows_filled[block];
  }
}

void PrefixCache::store(KvCache& cache, ReuseTurn& turn) {
  cache.set_tap(nullptr);
  if (!capture_) return;
  const auto start = Clock::now();
  Capture& c = *capture_;
  const int64_t full = config_.block_tokens * shape_.n_layers;
  for (size_t i = 0; i < c.writers.size(); ++i) {
    if (c.rows_filled[i] != full) break;  // a block not fed whole is not stored (nor any after it)
    const SharedBytes bytes = c.writers[i].finish();
    store_.put(c.keys[i], bytes);
    ++turn.blocks_stored;
    turn.bytes_stored += static_cast<int64_t>(bytes->size());
  }
  capture_.reset();
  turn.store_ms = ms_since(start);
}

}  // namespace kvbench
