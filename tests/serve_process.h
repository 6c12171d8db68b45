// `kvbench serve` as a test runs it: a child process on a free port, and a client's POST.
#pragma once

#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace kvbench::testing {

// `kvbench --model MODEL --threads 1 serve --port 0 EXTRA...`, its port read from its output;
// killed when it goes out of scope.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  FILE* output = nullptr;
  std::string log;

  ServerProcess(const std::string& model, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        KVBENCH_BINARY, "--model", model, "--threads",           "1",
        "serve",        "--port",  "0",   "--served-model-name", "tiny"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    output = fdopen(fds[0], "r");
    char line[4096];
    const std::string mark = "listening on http://127.0.0.1:";
    while (fgets(line, sizeof line, output)) {
      log += line;
      const size_t at = std::string(line).find(mark);
      if (at != std::string::npos) {
        port = std::atoi(line + at + mark.size());
        break;
      }
    }
    INFO(log);
    REQUIRE(port > 0);
  }
  // The exit status once it ends (waits).
  int wait_exit() {
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    pid = -1;
    char line[4096];
    while (fgets(line, sizeof line, output)) log += line;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  ~ServerProcess() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (output) fclose(output);
  }
};

// A request's status and body.
struct Reply {
  int status = 0;
  std::string body;
};

// No Catch2 assertion inside: clients call it from their own threads (Catch2 v2's
// assertions are not thread-safe). Status 0: no response.
inline Reply post(int port, const std::string& path, const std::string& body,
                  const std::string& type = "application/json") {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  const auto start = std::chrono::steady_clock::now();
  const auto res = client.Post(path.c_str(), body, type.c_str());
  if (!res) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    return {0,
            "no response after " + std::to_string(ms) + " ms: " + httplib::to_string(res.error())};
  }
  return {res->status, res->body};
}

}  // namespace kvbench::testing
