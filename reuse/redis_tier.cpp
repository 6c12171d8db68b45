#include "reuse/redis_tier.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <vector>

#include "common/input_error.h"
#include "reuse/replacement.h"

namespace kvbench {
namespace {

std::atomic<uint64_t> instance_counter{0};

timeval to_timeval(double seconds) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

// hiredis 0.14 write()s to its socket, and a write to a closed one raises SIGPIPE, which
// would kill the process. Block it around each call and swallow one it caused, leaving the
// process's handlers alone.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeGuard() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

struct ReplyFree {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

}  // namespace

RedisTier::RedisTier(const std::string& address, double timeout_s, double retry_s, Codec codec)
    : address_(address), timeout_s_(timeout_s), retry_s_(retry_s), codec_(make_block_codec(codec)) {
  stats_.name = "redis";
  const size_t colon = address.rfind(':');
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  bool ok = colon != std::string::npos && colon > 0 && !port.empty() && port.size() <= 5 &&
            port.find_first_not_of("0123456789") == std::string::npos;
  if (ok) {
    host_ = address.substr(0, colon);
    port_ = std::stoi(port);
    ok = port_ >= 1 && port_ <= 65535;
  }
  if (!ok) throw InputError("redis address '" + address + "': expected host:port");
  prefix_ =
      "kvbench:" + std::to_string(::getpid()) + ":" + std::to_string(instance_counter++) + ":";
}

RedisTier::~RedisTier() {
  // Best effort: a destructor has no one to report to. Respects the retry interval, so a
  // dead server does not cost a connection timeout here.
  if (!written_.empty() && connected()) {
    SigpipeGuard guard;
    std::vector<std::string> names;
    for (const auto& key : written_) names.push_back(prefix_ + key);
    for (size_t first = 0; first < names.size() && ctx_; first += 256) {
      std::vector<const char*> argv{"DEL"};
      std::vector<size_t> lengths{3};
      for (size_t i = first; i < names.size() && i < first + 256; ++i) {
        argv.push_back(names[i].data());
        lengths.push_back(names[i].size());
      }
      Reply reply(static_cast<redisReply*>(
          redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lengths.data())));
      if (!reply) break;
    }
  }
  if (ctx_) redisFree(ctx_);
}

bool RedisTier::connected() {
  if (ctx_) return true;
  const double now = steady_seconds();
  if (now < next_attempt_s_) return false;
  ++connect_attempts_;
  redisContext* ctx = redisConnectWithTimeout(host_.c_str(), port_, to_timeval(timeout_s_));
  if (!ctx || ctx->err) {
    down_reason_ = ctx ? ctx->errstr : "cannot allocate a connection";
    if (ctx) redisFree(ctx);
    // From the end of the attempt: a connect that timed out must not make the next call
    // wait out the timeout again.
    next_attempt_s_ = steady_seconds() + retry_s_;
    return false;
  }
  redisSetTimeout(ctx, to_timeval(timeout_s_));
  ctx_ = ctx;
  return true;
}

void RedisTier::unreachable(const std::string& op) {
  fault("redis " + address_ + " unreachable: " + down_reason_ + " (" + op + ")");
}

void RedisTier::lost(const std::string& op) {
  down_reason_ = ctx_->errstr;
  redisFree(ctx_);
  ctx_ = nullptr;
  next_attempt_s_ = steady_seconds() + retry_s_;
  unreachable(op);
}

std::optional<int64_t> RedisTier::put(const std::string& key, const SharedBytes& value) {
  const std::string op = "put " + key;
  if (!value) {
    fault("redis " + address_ + ": no value (" + op + ")");
    return std::nullopt;
  }
  if (!connected()) {
    unreachable(op);
    return std::nullopt;
  }
  SharedBytes encoded;
  const std::string bad = codec_->encode(value, &encoded);
  if (!bad.empty()) {
    erase(key);  // a failed put leaves the key absent, not an older value
    fault("redis " + address_ + ": " + bad + " (" + op + ")");
    return std::nullopt;
  }
  const std::string name = prefix_ + key;
  SigpipeGuard guard;
  written_.insert(key);
  Reply reply(static_cast<redisReply*>(redisCommand(ctx_, "SET %b %b", name.data(), name.size(),
                                                    encoded->data(), encoded->size())));
  if (!reply) {
    lost(op);
    return std::nullopt;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    keys_.erase(key);  // an error may leave an older value: it is not ours to serve
    fault("redis " + address_ + ": " + std::string(reply->str, reply->len) + " (" + op + ")");
    return std::nullopt;
  }
  keys_[key] = value->size();
  return static_cast<int64_t>(encoded->size());
}

SharedBytes RedisTier::get(const std::string& key) {
  const auto written = keys_.find(key);
  if (written == keys_.end()) return nullptr;
  const uint64_t size = written->second;
  const std::string op = "get " + key;
  if (!connected()) {
    unreachable(op);
    return nullptr;
  }
  const std::string name = prefix_ + key;
  SigpipeGuard guard;
  Reply reply(static_cast<redisReply*>(redisCommand(ctx_, "GET %b", name.data(), name.size())));
  if (!reply) {
    lost(op);
    return nullptr;
  }
  if (reply->type == REDIS_REPLY_STRING) {
    SharedBytes value;
    const std::string bad = codec_->decode(
        std::make_shared<Bytes>(reply->str, reply->str + reply->len), size, &value);
    if (bad.empty()) return value;
    keys_.erase(key);
    fault("redis " + address_ + ": " + bad + " (" + op + ")");
    return nullptr;
  }
  keys_.erase(key);
  if (reply->type == REDIS_REPLY_NIL) {
    fault("redis " + address_ + ": key gone from the server (evicted or flushed) (" + op + ")");
  } else if (reply->type == REDIS_REPLY_ERROR) {
    fault("redis " + address_ + ": " + std::string(reply->str, reply->len) + " (" + op + ")");
  } else {
    fault("redis " + address_ + ": unexpected reply type " + std::to_string(reply->type) + " (" +
          op + ")");
  }
  return nullptr;
}

void RedisTier::erase(const std::string& key) {
  keys_.erase(key);
  // No reconnect for a delete: a key left behind is deleted by the destructor.
  if (!written_.count(key) || !ctx_) return;
  const std::string name = prefix_ + key;
  SigpipeGuard guard;
  Reply reply(static_cast<redisReply*>(redisCommand(ctx_, "DEL %b", name.data(), name.size())));
  if (!reply) {
    lost("erase " + key);
  } else if (reply->type != REDIS_REPLY_ERROR) {
    written_.erase(key);
  }
}

}  // namespace kvbench
