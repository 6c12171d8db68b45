// The Redis tier against a real redis-server on loopback, started per test case (label
// redis): round trips, a server killed mid-run, a restarted one, an address with nothing
// listening. Exits 77 (skipped) when redis-server is not installed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/input_error.h"
#include "reuse/redis_tier.h"
#include "reuse/tiered_store.h"
#include "tests/random_floats.h"

extern char** environ;

namespace kvbench {
namespace {

std::string redis_server_binary() {
  if (access("/usr/bin/redis-server", X_OK) == 0) return "/usr/bin/redis-server";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = dir + "/redis-server";
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

void require_redis_server() {
  if (redis_server_binary().empty()) {
    std::puts("redis-server not found: skipped");
    std::exit(77);
  }
}

// A command on a fresh connection, for checks behind the tier's back. nullptr if unreachable.
std::unique_ptr<redisReply, void (*)(void*)> ask(int port, const std::string& command,
                                                 const std::string& arg = "") {
  std::unique_ptr<redisReply, void (*)(void*)> none(nullptr, freeReplyObject);
  redisContext* ctx = redisConnectWithTimeout("127.0.0.1", port, timeval{0, 200000});
  if (!ctx || ctx->err) {
    if (ctx) redisFree(ctx);
    return none;
  }
  void* reply = arg.empty() ? redisCommand(ctx, command.c_str())
                            : redisCommand(ctx, (command + " %b").c_str(), arg.data(), arg.size());
  redisFree(ctx);
  return {static_cast<redisReply*>(reply), freeReplyObject};
}

// A redis-server child on 127.0.0.1 and a random free port, killed on destruction.
class RedisServer {
 public:
  RedisServer() {
    std::mt19937 rng(std::random_device{}());
    for (int attempt = 0; attempt < 20; ++attempt) {
      if (start(20000 + static_cast<int>(rng() % 40000))) return;
    }
    FAIL("could not start redis-server on any of 20 random ports");
  }
  ~RedisServer() { kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  bool restart() { return start(port_); }

 private:
  // Starts a server on `port` and waits until it answers as itself (not another test's
  // server on the same port). False when it exits first or never answers.
  bool start(int port) {
    kill();
    const std::string binary = redis_server_binary();
    const std::string port_text = std::to_string(port);
    std::vector<const char*> argv{
        binary.c_str(), "--port", port_text.c_str(), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no",     "--daemonize",     "no",     "--dir",     "/tmp",   nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr,
                               const_cast<char* const*>(argv.data()), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return false;
    pid_ = pid;
    port_ = port;
    const std::string own = "process_id:" + std::to_string(pid);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {  // exited: the port was taken
        pid_ = -1;
        return false;
      }
      auto info = ask(port, "INFO server");
      if (info && info->type == REDIS_REPLY_STRING &&
          std::string(info->str, info->len).find(own) != std::string::npos) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a child starting up
    }
    kill();
    return false;
  }

  pid_t pid_ = -1;
  int port_ = 0;
};

// A loopback port with nothing listening (bound and released).
int unused_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

SharedBytes kv_bytes(size_t n, uint32_t seed) {
  const std::vector<float> floats = testing::random_floats(n / sizeof(float) + 1, seed);
  auto bytes = std::make_shared<Bytes>(n);
  if (n > 0) std::memcpy(bytes->data(), floats.data(), n);  // data() may be null when empty
  return bytes;
}

bool exists_on(int port, const std::string& name) {
  auto reply = ask(port, "EXISTS", name);
  REQUIRE(reply);
  return reply->integer == 1;
}

TEST_CASE("redis tier round trip, keys namespaced and deleted with the tier") {
  require_redis_server();
  RedisServer server;
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
  require_redis_server();
  RedisServer server;
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

TEST_CASE("a killed server: misses with a fault, failed puts, no reconnect storm") {
  require_redis_server();
  RedisServer server;
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
  require_redis_server();
  RedisServer server;
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
  require_redis_server();
  RedisServer server;
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
  const std::string address = "127.0.0.1:" + std::to_string(unused_port());
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
