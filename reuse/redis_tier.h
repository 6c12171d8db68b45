// A tier in a Redis server (hiredis, blocking calls with a timeout). Values are stored as
// the tier's codec encodes them (reuse/block_codec.h): raw by default, as they are, since
// the blocks carry their own checksum and zstd saves too little on fp32 KV to pay for the
// CPU on every put; cachegen stores a KV block in about a fifth of its bytes, lossily. A
// value that fails to decode is a miss and a fault.
//
// Keys are namespaced per instance, "kvbench:<pid>:<n>:<key>", and the destructor deletes
// them (best effort), so runs sharing a server are independent and repeatable.
//
// Never throws on I/O: an unreachable server or an error reply is a miss (get) or nullopt
// (put) and a fault saying why. A lost connection is retried lazily on a later call, at most
// once per `retry_s`, so a dead server costs a call almost nothing.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "reuse/block_codec.h"
#include "reuse/tier.h"

struct redisContext;

namespace kvbench {

class RedisTier : public Tier {
 public:
  // `address` is "host:port" (InputError otherwise). Does not connect yet.
  explicit RedisTier(const std::string& address, double timeout_s = 2.0, double retry_s = 1.0,
                     Codec codec = Codec::Raw);
  ~RedisTier() override;
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  const std::string& name() const override { return stats_.name; }
  // Returns the bytes the server holds (the encoding).
  std::optional<int64_t> put(const std::string& key, const SharedBytes& value) override;
  SharedBytes get(const std::string& key) override;
  void erase(const std::string& key) override;

  const std::string& prefix() const { return prefix_; }  // of this instance's keys
  Codec codec() const { return codec_->kind(); }
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
  std::unique_ptr<BlockCodec> codec_;
  // Readable (written and not erased), with their value sizes.
  std::unordered_map<std::string, uint64_t> keys_;
  std::unordered_set<std::string> written_;  // on the server maybe: deleted by the destructor
};

}  // namespace kvbench
