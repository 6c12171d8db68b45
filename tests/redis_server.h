// A redis-server child on 127.0.0.1 for tests and benchmarks: started on a free port, killed
// on destruction. Header-only, no test framework: the caller decides what "not installed"
// or "could not start" means (a test exits 77, a benchmark skips its Redis cases).
//
//   testing::RedisServer::skip_unless_installed();  // exit 77 (ctest: skipped) without one
//   testing::RedisServer server;
//   REQUIRE(server.start());
//   RedisTier tier(server.address());
//   server.kill();     // the tier now sees a dead server
//   server.restart();  // the same port again
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kvbench::testing {

// A command on a fresh connection to 127.0.0.1:`port`, for checks behind a tier's back
// (`arg` is passed as one binary-safe argument). nullptr when nothing answers.
inline std::unique_ptr<redisReply, void (*)(void*)> redis_ask(int port, const std::string& command,
                                                              const std::string& arg = "") {
  std::unique_ptr<redisReply, void (*)(void*)> none(nullptr, freeReplyObject);
  redisContext* ctx = redisConnectWithTimeout("127.0.0.1", port, timeval{0, 200000});
  if (!ctx || ctx->err) {
    if (ctx) redisFree(ctx);
    return none;
  }
  redisSetTimeout(ctx, timeval{2, 0});
  void* reply = arg.empty() ? redisCommand(ctx, command.c_str())
                            : redisCommand(ctx, (command + " %b").c_str(), arg.data(), arg.size());
  redisFree(ctx);
  return {static_cast<redisReply*>(reply), freeReplyObject};
}

// A loopback port with nothing listening at the time of the call (bound to port 0, read,
// released); 0 if no socket could be bound.
inline int unused_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

class RedisServer {
 public:
  RedisServer() = default;  // not started: start() it
  ~RedisServer() { kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // The redis-server executable (/usr/bin, else the first on PATH), "" when not installed.
  static std::string binary() {
    if (access("/usr/bin/redis-server", X_OK) == 0) return "/usr/bin/redis-server";
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "");
    for (std::string dir; std::getline(dirs, dir, ':');) {
      const std::string candidate = dir + "/redis-server";
      if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return "";
  }
  static bool installed() { return !binary().empty(); }
  // For a test binary: exits with 77 (ctest's SKIP_RETURN_CODE) when none is installed.
  static void skip_unless_installed() {
    if (!installed()) {
      std::puts("redis-server not found: skipped");
      std::exit(77);
    }
  }

  // Starts a server on a free loopback port, trying up to `attempts` ports (another process
  // may take one between the choice and the bind). False when none started or redis-server
  // is not installed. Kills a server this object runs already.
  bool start(int attempts = 20) {
    for (int attempt = 0; attempt < attempts; ++attempt) {
      const int port = unused_loopback_port();
      if (port > 0 && start_on(port)) return true;
    }
    return false;
  }
  // Starts a server on `port` and waits (up to 10 s) until it answers as itself, not another
  // process's server on the same port. False when it exits first or never answers.
  bool start_on(int port) {
    kill();
    const std::string exe = binary();
    if (exe.empty() || port <= 0) return false;
    const std::string port_text = std::to_string(port);
    std::vector<const char*> argv{
        exe.c_str(),    "--port", port_text.c_str(), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no",     "--daemonize",     "no",     "--dir",     "/tmp",   nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr,
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
      auto info = redis_ask(port, "INFO server");
      if (info && info->type == REDIS_REPLY_STRING &&
          std::string(info->str, info->len).find(own) != std::string::npos) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a child starting up
    }
    kill();
    return false;
  }
  // The same port again (after kill()): a fresh, empty server.
  bool restart() { return start_on(port_); }

  // SIGKILL and reap; the port stays noted (restart(), or an address with nothing behind it).
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  bool running() const { return pid_ > 0; }
  int port() const { return port_; }  // 0 before the first start
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace kvbench::testing
