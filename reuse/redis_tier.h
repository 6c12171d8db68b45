// A tier in a Redis server (hiredis, blocking calls with a timeout). Values are stored as
// they are, not compressed: the blocks carry their own checksum, and fp32 KV compresses too
// little to pay for the CPU on every put.
//
// Keys are namespaced per instance, "kvbench:<pid>:<n>:<key>", and the destructor deletes
// them (best effort), so runs sharing a server are independent and repeatable.
//
// Never throws on I/O: an unreachable server or an error reply is a miss (get) or nullopt
// (put) and a fault saying why. A lost connection is retried lazily on a later call, at most
// once per `retry_s`, so a dead server costs a call almost nothing.
#pragma once

#include <string>
#include <unordered_set>

#include "reuse/tier.h"

struct redisContext;

namespace kvbench {

class RedisTier : public Tier {
 public:
  // `address` is "host:port" (InputError otherwise). Does not connect yet.
  explicit RedisTier(const std::string& address, double timeout_s = 2.0, double retry_s = 1.0);
  ~RedisTier() override;
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  const std::string& name() const override { return stats_.name; }
  std::optional<int64_t> put(const std::string& key, const SharedBytes& value) override;
  SharedBytes get(const std::string& key) override;
  void erase(const std::string& key) override;

  const std::string& prefix() const { return prefix_; }  // of this instance's keys
  int64_t connect_attempts() const { return connect_attempts_; }

 private:
  bool connected();                  // connects when not, unless a recent attempt failed
  void lost(const std::string& op);  // drops the connection after an I/O error, with a fault
  void unreachable(const std::string& op);

  std::string address_;
  std::string host_;
  int port_ = 0;
  double timeout_s_;
  double retry_s_;
  std::string prefix_;
  redisContext* ctx_ = nullptr;
  double next_attempt_s_ = 0;
  std::string down_reason_;  // why the last connection failed or was lost
  int64_t connect_attempts_ = 0;
  std::unordered_set<std::string> keys_;     // readable: written and not erased
  std::unordered_set<std::string> written_;  // on the server maybe: deleted by the destructor
};

}  // namespace kvbench
