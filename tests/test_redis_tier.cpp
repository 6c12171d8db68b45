// The Redis tier against a real redis-server on loopback, started per test case (label
// redis): round trips, a server killed mid-run, a restarted one, an address with nothing
// listening; a cachegen-encoded tier. Exits 77 (skipped) when redis-server is not installed.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/input_error.h"
#include "reuse/kv_block.h"
#include "reuse/redis_tier.h"
#include "reuse/tiered_store.h"
#include "tests/random_floats.h"
#include "tests/redis_server.h"

namespace kvbench {
namespace {

using testing::RedisServer;

// A running server for one test case; exits 77 (skipped) when redis-server is not installed.
void start(RedisServer& server) {
  RedisServer::skip_unless_installed();
  REQUIRE(server.start());
}

SharedBytes kv_bytes(size_t n, uint32_t seed) {
  const std::vector<float> floats = testing::random_floats(n / sizeof(float) + 1, seed);
  auto bytes = std::make_shared<Bytes>(n);
  if (n > 0) std::memcpy(bytes->data(), floats.data(), n);  // data() may be null when empty
  return bytes;
}

bool exists_on(int port, const std::string& name) {
  auto reply = testing::redis_ask(port, "EXISTS", name);
  REQUIRE(reply);
  return reply->integer == 1;
}

TEST_CASE("redis tier round trip, keys namespaced and deleted with the tier") {
  RedisServer server;
  start(server);
  std::string name;
  {
    RedisTier tier(server.address());
    CHECK(tier.name() == "redis");
    CHECK(tier.prefix().rfind("kvbench:" + std::to_string(getpid()) + ":", 0) == 0);
    for (size_t size : {size_t{0}, size_t{1}, size_t{3} << 20}) {
      const std::string key = "key-" + std::to_string(size);
      const SharedBytes value = kv_bytes(size, static_cast<uint32_t>(size));
      CHECK(tier.put(key, value) == static_cast<int64_t>(size));
      const SharedBytes back = tier.get(key);
      REQUIRE(back);
      CHECK(*back == *value);
    }
    CHECK(tier.get("never-put") == nullptr);
    tier.erase("key-0");
    CHECK(tier.get("key-0") == nullptr);
    CHECK_FALSE(exists_on(server.port(), tier.prefix() + "key-0"));
    name = tier.prefix() + "key-1";
    CHECK(exists_on(server.port(), name));
    CHECK(tier.stats().faults == 0);
    CHECK(tier.connect_attempts() == 1);
  }
  CHECK_FALSE(exists_on(server.port(), name));
}

TEST_CASE("a store with a redis tier serves from it and promotes") {
  RedisServer server;
  start(server);
  TierConfig config;
  config.device_bytes = 1000;
  config.redis = server.address();
  TieredStore store(config);
  store.put("big", kv_bytes(5000, 1));  // skips device
  store.put("k1", kv_bytes(1000, 2));
  store.put("k2", kv_bytes(1000, 3));
  std::string from;
  SharedBytes value = store.get("big", &from);
  REQUIRE(value);
  CHECK(*value == *kv_bytes(5000, 1));
  CHECK(from == "redis");
  REQUIRE(store.get("k1", &from));
  CHECK(from == "redis");
  REQUIRE(store.get("k1", &from));
  CHECK(from == "device");
  const auto stats = store.stats();
  REQUIRE(stats.size() == 2);
  CHECK(stats[1].hits == 2);
  CHECK(stats[1].bytes_out == 6000);
  CHECK(stats[1].entries == 3);
  CHECK(stats[1].bytes_resident == 7000);
  CHECK(stats[1].faults == 0);
}

// A KV block of 4 layers, 2 heads of 32, 64 tokens of normal floats.
SharedBytes kv_block(uint32_t seed) {
  const KvBlockShape shape{4, 2, 32};
  const std::vector<int32_t> tokens(64, 9);
  KvBlockWriter writer("key", "model", shape, tokens.data(), 64, 0);
  const std::vector<float> floats = testing::random_floats(2 * 4 * 64 * 64, seed);
  for (int32_t l = 0; l < 4; ++l) {
    std::copy(floats.begin() + 2 * l * 4096, floats.begin() + (2 * l + 1) * 4096, writer.k(l));
    std::copy(floats.begin() + (2 * l + 1) * 4096, floats.begin() + (2 * l + 2) * 4096,
              writer.v(l));
  }
  return writer.finish();
}

TEST_CASE("redis tier with cachegen: stores the encoding, serves the decoded block") {
  RedisServer server;
  start(server);
  const SharedBytes block = kv_block(1);
  RedisTier tier(server.address(), 2.0, 1.0, Codec::CacheGen);
  CHECK(tier.codec() == Codec::CacheGen);
  const auto stored = tier.put("k", block);
  REQUIRE(stored);
  CHECK(*stored < static_cast<int64_t>(block->size()) / 5);
  auto held = testing::redis_ask(server.port(), "STRLEN", tier.prefix() + "k");
  REQUIRE(held);
  CHECK(held->integer == *stored);
  const SharedBytes back = tier.get("k");
  REQUIRE(back);
  CHECK(back->size() == block->size());
  CHECK(*back != *block);  // lossy
  KvBlockLayout layout;
  CHECK(check_kv_block(back->data(), back->size(), &layout).empty());  // sealed anew
  CHECK(tier.stats().faults == 0);

  SECTION("a value changed on the server is a miss and a fault") {
    REQUIRE(testing::redis_ask(server.port(), "SETRANGE " + tier.prefix() + "k 200", "xyz"));
  }
  SECTION("a value cut short on the server is a miss and a fault") {
    const std::string half(reinterpret_cast<const char*>(block->data()), 100);
    REQUIRE(testing::redis_ask(server.port(), "SET " + tier.prefix() + "k", half));
  }
  CHECK(tier.get("k") == nullptr);
  CHECK(tier.stats().faults == 1);
  CHECK_THAT(tier.stats().last_fault, Catch::Contains("cachegen"));
  CHECK(tier.get("k") == nullptr);  // forgotten: a plain miss now
  CHECK(tier.stats().faults == 1);
}

TEST_CASE("a store with a cachegen redis tier counts the encoded bytes") {
  RedisServer server;
  start(server);
  TierConfig config;
  config.device_bytes = 0;
  config.redis = server.address();
  config.redis_codec = Codec::CacheGen;
  const SharedBytes block = kv_block(2);
  config.redis_bytes = static_cast<int64_t>(block->size()) / 2;  // holds encodings, not blocks
  TieredStore store(config);
  store.put("a", block);
  store.put("b", kv_block(3));
  std::string from;
  const SharedBytes a = store.get("a", &from);
  REQUIRE(a);
  CHECK(from == "redis");
  CHECK(a->size() == block->size());
  const TierStats redis = store.stats().back();
  CHECK(redis.entries == 2);
  CHECK(redis.bytes_in == 2 * static_cast<int64_t>(block->size()));
  CHECK(redis.bytes_resident < redis.bytes_in / 5);
  CHECK(redis.faults == 0);
}

TEST_CASE("a killed server: misses with a fault, failed puts, no reconnect storm") {
  RedisServer server;
  start(server);
  RedisTier tier(server.address(), 1.0, 3600);  // one attempt per hour: counts are exact
  REQUIRE(tier.put("a", kv_bytes(1000, 1)));
  server.kill();
  // Writing megabytes into the dead socket raises SIGPIPE, which must not end the process.
  CHECK_FALSE(tier.put("big", kv_bytes(8 << 20, 4)));
  CHECK(tier.stats().faults == 1);
  CHECK(tier.get("a") == nullptr);
  CHECK(tier.stats().faults == 2);
  CHECK_THAT(tier.stats().last_fault,
             Catch::Contains(server.address()) && Catch::Contains("unreachable"));
  CHECK_FALSE(tier.put("b", kv_bytes(1000, 2)));
  const int64_t attempts = tier.connect_attempts();
  for (int i = 0; i < 50; ++i) {
    CHECK(tier.get("a") == nullptr);
    CHECK_FALSE(tier.put("c", kv_bytes(10, 3)));
  }
  CHECK(tier.connect_attempts() == attempts);
  CHECK(tier.stats().faults == 103);
}

TEST_CASE("a killed server: the store still serves from memory") {
  RedisServer server;
  start(server);
  TierConfig config;
  config.device_bytes = 1000;
  config.redis = server.address();
  TieredStore store(config);
  store.put("a", kv_bytes(1000, 1));
  store.put("b", kv_bytes(1000, 2));  // device now holds b only
  server.kill();
  std::string from;
  REQUIRE(store.get("b", &from));
  CHECK(from == "device");
  CHECK(store.get("a", &from) == nullptr);
  TierStats redis = store.stats()[1];
  CHECK(redis.faults == 1);
  CHECK(redis.misses == 1);
  CHECK_THAT(redis.last_fault, Catch::Contains("unreachable"));
  store.put("c", kv_bytes(1000, 3));
  REQUIRE(store.get("c", &from));
  CHECK(from == "device");
  redis = store.stats()[1];
  CHECK(redis.faults == 2);
  CHECK(redis.entries == 1);  // b: unread since, still listed; a and c are not
}

TEST_CASE("a restarted server is reconnected on a later call") {
  RedisServer server;
  start(server);
  RedisTier tier(server.address(), 1.0, 0);  // retry at once
  REQUIRE(tier.put("a", kv_bytes(1000, 1)));
  server.kill();
  CHECK(tier.get("a") == nullptr);
  CHECK_THAT(tier.stats().last_fault, Catch::Contains("unreachable"));
  REQUIRE(server.restart());
  REQUIRE(tier.put("b", kv_bytes(1000, 2)));
  CHECK(*tier.get("b") == *kv_bytes(1000, 2));
  CHECK(tier.get("a") == nullptr);  // the new server never had it
  CHECK_THAT(tier.stats().last_fault, Catch::Contains("gone from the server"));
}

TEST_CASE("an address with nothing listening: misses and faults, no throw") {
  const std::string address = "127.0.0.1:" + std::to_string(testing::unused_loopback_port());
  RedisTier tier(address);
  CHECK_FALSE(tier.put("a", kv_bytes(1000, 1)));
  CHECK(tier.get("a") == nullptr);
  CHECK(tier.stats().faults == 1);
  CHECK_THAT(tier.stats().last_fault, Catch::Contains(address) && Catch::Contains("unreachable"));

  TierConfig config;
  config.redis = address;
  TieredStore store(config);
  store.put("a", kv_bytes(1000, 1));
  std::string from;
  REQUIRE(store.get("a", &from));
  CHECK(from == "device");
  const TierStats redis = store.stats()[1];
  CHECK(redis.name == "redis");
  CHECK(redis.faults == 1);
  CHECK(redis.entries == 0);
}

TEST_CASE("a malformed redis address is an input error") {
  for (const char* address : {"localhost", "host:", ":6379", "host:99999", "host:63a"}) {
    REQUIRE_THROWS_AS(RedisTier(address), InputError);
    REQUIRE_THROWS_WITH(RedisTier(address), Catch::Contains(address));
  }
}

}  // namespace
}  // namespace kvbench
