// Prefix reuse on a tiny random-weight model written by the test: chained keys, the block
// format's checks, loading a cached prefix into fresh caches (full, KIVI, Quest) against a
// plain prefill, the session's multi-request mode, and faults (a corrupt file on disk).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "gguf_writer.h"
#include "harness/model/llama_model.h"
#include "harness/session.h"
#include "tests/session_by_text.h"
#include "prefix_requests.h"
#include "reuse/block_codec.h"
#include "reuse/block_key.h"
#include "reuse/cachegen_codec.h"
#include "reuse/kv_block.h"
#include "reuse/prefix_cache.h"

using namespace kvbench;
namespace fs = std::filesystem;

namespace {

using testing::max_difference;
using testing::prompt_tokens;
using testing::request;

const LlamaModel& tiny_model() { return testing::prefix_test_model(); }

ReuseConfig config_with_block(int64_t block) {
  ReuseConfig config;
  config.block_tokens = block;
  return config;
}

// Largest difference between two caches' stored KV, every layer, as slots hold them.
float max_kv_difference(const KvCache& a, const KvCache& b) {
  float worst = 0;
  for (int32_t l = 0; l < a.shape().n_layers; ++l) {
    const DenseKv x = a.layer(l).view(), y = b.layer(l).view();
    REQUIRE(x.n_tokens == y.n_tokens);
    for (int32_t h = 0; h < x.n_kv_heads; ++h) {
      for (int64_t t = 0; t < x.n_tokens; ++t) {
        REQUIRE(x.positions[h * x.capacity + t] == y.positions[h * y.capacity + t]);
        for (int32_t d = 0; d < x.head_dim; ++d) {
          const int64_t i = (h * x.capacity + t) * x.head_dim + d;
          const int64_t j = (h * y.capacity + t) * y.head_dim + d;
          worst = std::max({worst, std::abs(x.k[i] - y.k[j]), std::abs(x.v[i] - y.v[j])});
        }
      }
    }
  }
  return worst;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = testing::temp_path(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("block keys: chained over the prefix, the model and the block size", "[unit]") {
  const std::vector<int32_t> a = prompt_tokens(100);
  std::vector<int32_t> b = a;
  b[40] += 1;  // inside block 2 of 16-token blocks
  const auto ka = chain_block_keys("model-1", a.data(), 100, 16);
  const auto kb = chain_block_keys("model-1", b.data(), 100, 16);
  REQUIRE(ka.size() == 6);  // whole blocks only
  CHECK(ka[0] == kb[0]);
  CHECK(ka[1] == kb[1]);
  for (size_t i = 2; i < ka.size(); ++i) CHECK(ka[i] != kb[i]);  // the change carries on
  CHECK(chain_block_keys("model-2", a.data(), 100, 16)[0] != ka[0]);
  CHECK(chain_block_keys("model-1", a.data(), 100, 32)[0] != ka[0]);  // tokens 0..31 vs 0..15
  CHECK(chain_block_keys("model-1", a.data(), 15, 16).empty());
  CHECK(ka[0].size() == 64);
}

TEST_CASE("KV blocks: a block decodes only as itself", "[unit]") {
  const KvBlockShape shape{2, 2, 8};
  const std::vector<int32_t> tokens = prompt_tokens(4);
  KvBlockWriter writer("key-a", "model-a", shape, tokens.data(), 4, 32);
  for (int32_t l = 0; l < 2; ++l) {
    for (int64_t i = 0; i < 4 * shape.kv_width(); ++i) {
      writer.k(l)[i] = static_cast<float>(l * 1000 + i);
      writer.v(l)[i] = -static_cast<float>(l * 1000 + i);
    }
  }
  const SharedBytes bytes = writer.finish();
  CHECK(static_cast<int64_t>(bytes->size()) == kv_block_bytes(shape, 4));
  KvBlockView view;
  REQUIRE(decode_kv_block(*bytes, "key-a", "model-a", shape, tokens.data(), 4, &view).empty());
  CHECK(view.first_position == 32);
  CHECK(view.k(1)[5] == 1005.f);
  CHECK(view.v(0)[63] == -63.f);

  CHECK(decode_kv_block(*bytes, "key-b", "model-a", shape, tokens.data(), 4, &view) ==
        "block stored under another key");
  CHECK(decode_kv_block(*bytes, "key-a", "model-b", shape, tokens.data(), 4, &view) ==
        "block of another model");
  std::vector<int32_t> other = tokens;
  other[3] += 1;
  CHECK(decode_kv_block(*bytes, "key-a", "model-a", shape, other.data(), 4, &view) ==
        "block of other tokens");
  CHECK(decode_kv_block(*bytes, "key-a", "model-a", KvBlockShape{2, 2, 16}, tokens.data(), 4,
                        &view) == "block of another shape");
  Bytes flipped = *bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  CHECK(decode_kv_block(flipped, "key-a", "model-a", shape, tokens.data(), 4, &view) ==
        "checksum mismatch");
  Bytes cut(bytes->begin(), bytes->end() - 9);
  CHECK_FALSE(decode_kv_block(cut, "key-a", "model-a", shape, tokens.data(), 4, &view).empty());
}

TEST_CASE("prefix cache: a loaded prefix gives the KV and logits of a full prefill", "[unit]") {
  const LlamaModel& model = tiny_model();
  const std::vector<int32_t> prompt = prompt_tokens(90);
  KvCache reference = make_full_cache(model.kv_shape());
  const std::vector<float> expected = model.forward(prompt, reference);

  PrefixCache reuse(config_with_block(16), "tiny", model.kv_shape());
  ReuseTurn first;
  KvCache cold = make_full_cache(model.kv_shape());
  request(reuse, cold, prompt, first);
  CHECK(first.tokens_reused == 0);
  CHECK(first.blocks_missed == 1);
  CHECK(first.blocks_stored == 5);  // 90 tokens: 5 whole blocks of 16

  ReuseTurn second;
  KvCache warm = make_full_cache(model.kv_shape());
  const std::vector<float> logits = request(reuse, warm, prompt, second);
  CHECK(second.tokens_looked_up == 90);
  CHECK(second.tokens_reused == 80);
  CHECK(second.blocks_hit == 5);
  CHECK(second.served_by == "device");
  CHECK(second.bytes_loaded == 5 * kv_block_bytes(KvBlockShape{2, 2, 32}, 16));
  CHECK(second.hit_ratio() == Approx(80.0 / 90.0));
  CHECK(warm.next_position() == 90);
  CHECK(max_kv_difference(warm, reference) < 1e-5f);
  CHECK(max_difference(logits, expected) < 1e-4f);

  // A prompt of exactly 5 blocks loads 4: its last token is computed for the logits.
  ReuseTurn exact;
  KvCache whole = make_full_cache(model.kv_shape());
  request(reuse, whole, std::vector<int32_t>(prompt.begin(), prompt.begin() + 80), exact);
  CHECK(exact.tokens_reused == 64);

  // Another model, or a prompt that differs early, finds nothing.
  PrefixCache other(config_with_block(16), "another model", model.kv_shape());
  ReuseTurn none;
  KvCache fresh = make_full_cache(model.kv_shape());
  CHECK(other.load(prompt, fresh, none) == 0);
  std::vector<int32_t> changed = prompt;
  changed[20] = 9;
  ReuseTurn partial;
  KvCache branch = make_full_cache(model.kv_shape());
  CHECK(reuse.load(changed, branch, partial) == 16);  // block 0 only
}

TEST_CASE("prefix cache: KIVI and Quest caches start from loaded blocks as from a prefill",
          "[unit]") {
  const LlamaModel& model = tiny_model();
  const std::vector<int32_t> prompt = prompt_tokens(300, 5);
  for (const std::string spec : {"kivi:bits=4,residual=32", "quest:budget=64,page=16"}) {
    INFO(spec);
    // The reference is prefilled in the same two chunks (the cached 288 tokens, then the
    // rest): KIVI packs at the end of a forward, so the second chunk attends over packed
    // blocks either way.
    KvCache reference = make_cache(spec, model.kv_shape());
    model.forward(std::vector<int32_t>(prompt.begin(), prompt.begin() + 288), reference);
    const std::vector<float> expected =
        model.forward(std::vector<int32_t>(prompt.begin() + 288, prompt.end()), reference);
    PrefixCache reuse(config_with_block(32), "tiny", model.kv_shape());
    ReuseTurn first, second;
    KvCache cold = make_cache(spec, model.kv_shape());
    request(reuse, cold, prompt, first);
    KvCache warm = make_cache(spec, model.kv_shape());
    const std::vector<float> logits = request(reuse, warm, prompt, second);
    CHECK(second.tokens_reused == 288);
    CHECK(warm.stats().tokens_per_layer == reference.stats().tokens_per_layer);
    CHECK(max_kv_difference(warm, reference) < 1e-4f);
    CHECK(max_difference(logits, expected) < 1e-3f);
  }
}

TEST_CASE("prefix cache: blocks go through the disk tier, and a corrupt file is a miss",
          "[unit]") {
  const LlamaModel& model = tiny_model();
  const std::vector<int32_t> prompt = prompt_tokens(70, 3);
  KvCache reference = make_full_cache(model.kv_shape());
  const std::vector<float> expected = model.forward(prompt, reference);

  ReuseConfig config = config_with_block(16);
  config.tiers.device_bytes = 1024;  // smaller than a block: the disk tier serves
  config.tiers.disk_dir = fresh_dir("prefix_disk");
  PrefixCache reuse(config, "tiny", model.kv_shape());
  ReuseTurn first, second;
  KvCache cold = make_full_cache(model.kv_shape());
  request(reuse, cold, prompt, first);
  KvCache warm = make_full_cache(model.kv_shape());
  CHECK(max_difference(request(reuse, warm, prompt, second), expected) < 1e-4f);
  CHECK(second.tokens_reused == 64);
  CHECK(second.served_by == "disk");
  CHECK(second.faults.empty());

  // Flip one byte in every stored file: every lookup fails its check, is reported, and the
  // prefix is prefilled instead, to the same logits.
  int corrupted = 0;
  for (const auto& entry : fs::recursive_directory_iterator(config.tiers.disk_dir)) {
    if (!entry.is_regular_file()) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(entry.file_size() / 2));
    char c = 0;
    f.seekg(static_cast<std::streamoff>(entry.file_size() / 2));
    f.get(c);
    f.seekp(static_cast<std::streamoff>(entry.file_size() / 2));
    f.put(static_cast<char>(c ^ 0x5a));
    ++corrupted;
  }
  REQUIRE(corrupted == 4);
  ReuseTurn third;
  KvCache after = make_full_cache(model.kv_shape());
  CHECK(max_difference(request(reuse, after, prompt, third), expected) < 1e-4f);
  CHECK(third.tokens_reused == 0);
  const std::vector<TierStats> tiers = reuse.tier_stats();
  REQUIRE(tiers.back().name == "disk");
  CHECK(tiers.back().faults >= 1);
  CHECK_FALSE(tiers.back().last_fault.empty());
}

// A lossy tier: what the cache loads is the cachegen decoding of the blocks the model
// computed (bit for bit), within half a quantization step of them; the turn prefills the
// rest from those values.
TEST_CASE("prefix cache: a cachegen disk tier serves its decoded blocks", "[unit]") {
  const LlamaModel& model = tiny_model();
  const KvShape shape = model.kv_shape();
  const std::vector<int32_t> prompt = prompt_tokens(70, 5);
  KvCache reference = make_full_cache(shape);
  const std::vector<float> expected = model.forward(prompt, reference);

  ReuseConfig config = config_with_block(16);
  config.tiers.device_bytes = 1024;  // smaller than a block: the disk tier serves
  config.tiers.disk_dir = fresh_dir("prefix_cachegen");
  config.tiers.disk_codec = Codec::CacheGen;
  PrefixCache reuse(config, "tiny", shape);
  ReuseTurn first, second;
  KvCache cold = make_full_cache(shape);
  request(reuse, cold, prompt, first);
  KvCache warm = make_full_cache(shape);
  const std::vector<float> logits = request(reuse, warm, prompt, second);
  CHECK(second.tokens_reused == 64);
  CHECK(second.served_by == "disk");
  CHECK(second.faults.empty());
  const TierStats disk = reuse.tier_stats().back();
  CHECK(disk.bytes_resident * 4 < disk.bytes_in);  // 4 blocks in, well under a quarter kept

  const KvBlockShape block_shape{shape.n_layers, shape.n_kv_heads, shape.head_dim};
  const int64_t width = block_shape.kv_width();
  auto codec = make_block_codec(Codec::CacheGen);
  const int bins = cachegen_key_bins(shape.n_layers).at(0);  // 32: under 10 layers
  for (int64_t block = 0; block < 4; ++block) {
    // The rows the model computed for this block, encoded and decoded as the tier does.
    KvBlockWriter writer("key", "tiny", block_shape, prompt.data() + block * 16, 16,
                         static_cast<int32_t>(block * 16));
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      const DenseKv x = reference.layer(l).view();
      for (int64_t t = 0; t < 16; ++t) {
        for (int32_t h = 0; h < x.n_kv_heads; ++h) {
          const int64_t from = (h * x.capacity + block * 16 + t) * x.head_dim;
          std::copy(x.k + from, x.k + from + x.head_dim, writer.k(l) + t * width + h * x.head_dim);
          std::copy(x.v + from, x.v + from + x.head_dim, writer.v(l) + t * width + h * x.head_dim);
        }
      }
    }
    const SharedBytes computed = writer.finish();
    SharedBytes encoded, decoded;
    REQUIRE(codec->encode(computed, &encoded).empty());
    REQUIRE(codec->decode(encoded, computed->size(), &decoded).empty());
    KvBlockView want, was;
    REQUIRE(decode_kv_block(*decoded, "key", "tiny", block_shape, prompt.data() + block * 16, 16,
                            &want).empty());
    REQUIRE(decode_kv_block(*computed, "key", "tiny", block_shape, prompt.data() + block * 16, 16,
                            &was).empty());
    float worst = 0;
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      const DenseKv y = warm.layer(l).view();
      for (int64_t t = 0; t < 16; ++t) {
        float k_max = 0, v_max = 0, k_err = 0, v_err = 0;
        for (int32_t h = 0; h < y.n_kv_heads; ++h) {
          for (int32_t d = 0; d < y.head_dim; ++d) {
            const int64_t at = (h * y.capacity + block * 16 + t) * y.head_dim + d;
            const int64_t row = t * width + h * y.head_dim + d;
            REQUIRE(y.k[at] == want.k(l)[row]);  // the decoded values, as loaded
            REQUIRE(y.v[at] == want.v(l)[row]);
            k_max = std::max(k_max, std::abs(was.k(l)[row]));
            v_max = std::max(v_max, std::abs(was.v(l)[row]));
            k_err = std::max(k_err, std::abs(y.k[at] - was.k(l)[row]));
            v_err = std::max(v_err, std::abs(y.v[at] - was.v(l)[row]));
          }
        }
        CHECK(k_err <= cachegen_max_error(k_max, bins) * (1 + 1e-5));
        CHECK(v_err <= cachegen_max_error(v_max, bins) * (1 + 1e-5));
        worst = std::max({worst, k_err, v_err});
      }
    }
    CHECK(worst > 0);  // lossy
  }
  // The answer's logits move with the KV, a little.
  const float moved = max_difference(logits, expected);
  CHECK(moved > 0);
  CHECK(moved < 1.0f);
}

TEST_CASE("session: multi-request reuses the shared context's blocks", "[unit]") {
  const LlamaModel& model = tiny_model();
  const Sample sample = testing::shared_context_sample("reuse-1", 300);
  const SessionOptions options = testing::multi_request_options();
  const SessionResult full = run_session(model, sample, "full", options, nullptr);
  const SampleReference reference = reference_of(full);
  const SessionResult reused = run_session(model, sample, "prefix:block=16", options, &reference);
  REQUIRE(reused.turns.size() == 3);
  const int64_t context_blocks = reused.context_tokens / 16;
  REQUIRE(context_blocks >= 2);
  CHECK(reused.turns[0].reuse.tokens_reused == 0);
  for (size_t t = 0; t < 3; ++t) {
    INFO("turn " << t + 1);
    const TurnRecord& r = reused.turns[t];
    if (t > 0) {
      // The context's whole blocks; a block past them holds another request's query.
      const int64_t looked_up = (r.prompt_tokens - 1) / 16;
      CHECK(r.reuse.tokens_reused == context_blocks * 16);
      CHECK(r.cache.hits == context_blocks);
      CHECK(r.cache.misses == (looked_up > context_blocks ? 1 : 0));
    }
    CHECK(r.cache.bytes_moved == r.reuse.bytes_loaded + r.reuse.bytes_stored);
    CHECK(r.reuse.tokens_looked_up == r.prompt_tokens);
    CHECK(r.prediction == full.turns[t].prediction);
    CHECK(r.first_token_kl < 1e-6);
    CHECK(r.top1_agreement == 1.0);
    REQUIRE(r.reuse_tiers.size() == 1);
    CHECK(r.reuse_tiers[0].name == "device");
  }
}

TEST_CASE("session: an eviction method's compressed context is reused whole", "[unit]") {
  const LlamaModel& model = tiny_model();
  const Sample sample = testing::shared_context_sample("snapshot-1", 200, 'b');
  const SessionOptions options = testing::multi_request_options();
  const SampleReference reference = reference_of(run_session(model, sample, "full", options, nullptr));
  for (const std::string method : {"snapkv:budget=48", "h2o:budget=48"}) {
    INFO(method);
    const SessionResult alone = run_session(model, sample, method, options, &reference);
    const SessionResult reused = run_session(model, sample, method + "+prefix", options, &reference);
    REQUIRE(reused.turns.size() == 3);
    for (size_t t = 0; t < 3; ++t) {
      INFO("turn " << t + 1);
      const TurnRecord& r = reused.turns[t];
      // The same cache as compressing afresh: the same answers, bit for bit.
      CHECK(r.prediction == alone.turns[t].prediction);
      CHECK(r.first_token_kl == alone.turns[t].first_token_kl);
      CHECK(r.top1_agreement == alone.turns[t].top1_agreement);
      CHECK(r.kv_bytes == alone.turns[t].kv_bytes);
      CHECK(r.reuse.tokens_reused == (t == 0 ? 0 : reused.context_tokens));
      CHECK(r.reuse.blocks_stored == (t == 0 ? 1 : 0));
      CHECK(r.cache.hits == (t == 0 ? 0 : 1));
      REQUIRE(r.reuse_tiers.size() == 1);
      CHECK(r.reuse_tiers[0].entries == 1);
      CHECK(r.reuse_tiers[0].bytes_resident == reused.turns[0].reuse.bytes_stored);
    }
  }
}

TEST_CASE("spec: reuse composes with every per-sequence method", "[unit]") {
  CHECK(resolve_method_spec("prefix").canonical == "prefix:block=256");
  CHECK(resolve_method_spec("snapkv:budget=64+prefix").components.size() == 2);
  CHECK(resolve_method_spec("h2o:budget=64+prefix+tiers:device=64MB,policy=fifo").components.size() == 3);
  CHECK(resolve_method_spec("prefix:block=64+kivi:bits=2").components.size() == 2);
  CHECK(resolve_method_spec("quest:budget=64+prefix").components.size() == 2);
  const ResolvedSpec tiers = resolve_method_spec(
      "prefix:block=256+tiers:device=64MB,cpu=1GB,disk=/tmp/kv,redis=127.0.0.1:6379,policy=lru");
  const std::unique_ptr<ReuseConfig> config = prefix_reuse_config(tiers);
  REQUIRE(config);
  CHECK(config->block_tokens == 256);
  CHECK(config->tiers.device_bytes == 64ll << 20);
  CHECK(config->tiers.cpu_bytes == 1ll << 30);
  CHECK(config->tiers.disk_dir == "/tmp/kv");
  CHECK(config->tiers.redis == "127.0.0.1:6379");
  CHECK(config->tiers.policy == Replacement::Lru);
  CHECK(config->tiers.disk_codec == Codec::Zstd);  // as before codecs
  CHECK(config->tiers.redis_codec == Codec::Raw);
  const std::unique_ptr<ReuseConfig> coded = prefix_reuse_config(
      resolve_method_spec("prefix+tiers:disk=/tmp/kv,disk_codec=cachegen,redis_codec=zstd"));
  CHECK(coded->tiers.disk_codec == Codec::CacheGen);
  CHECK(coded->tiers.redis_codec == Codec::Zstd);
  CHECK(prefix_reuse_config(resolve_method_spec("kivi")) == nullptr);

  const auto refused = [](const std::string& spec, const std::string& says) {
    INFO(spec);
    try {
      resolve_method_spec(spec);
      FAIL("accepted");
    } catch (const InputError& e) {
      CHECK_THAT(e.what(), Catch::Contains(says) && Catch::Contains(spec));
    }
  };
  refused("snapkv:budget=64+prefix+tiers:disk=/tmp/kv", "'disk' tier holds uncompressed blocks");
  refused("h2o:budget=64+prefix+tiers:cpu=1GB", "'cpu' tier holds uncompressed blocks");
  refused("cacheblend+snapkv:budget=64", "'cacheblend' recomputes");
  refused("tiers:device=1GB", "needs a reuse method that keeps blocks (prefix)");
  refused("cacheblend+tiers:device=1GB", "needs a reuse method that keeps blocks (prefix)");
  refused("prefix+tiers:device=12XB", "must be a size");
  refused("prefix+prefix", "at most one reuse");
  refused("prefix:block=0", "block");
  refused("prefix+tiers:disk_codec=lz4", "disk_codec");
  refused("prefix+tiers:redis_codec=none", "redis_codec");
  refused("prefix+tiers:policy=mru", "lru");
}
