// Stage 4 in specs: `prefix` (reuse of cached prefix blocks) and `tiers` (where they are
// stored). Neither changes a sequence's cache: the session loads and stores blocks around
// it (reuse/prefix_cache.h), so they compose with full, storage and retrieval methods:
// prefix:block=256+tiers:device=64MB,cpu=1GB,disk=/tmp/kv,redis=127.0.0.1:6379,policy=lru
#include "methods/registry.h"

namespace kvbench {

MethodInfo prefix_method() {
  MethodInfo m;
  m.name = "prefix";
  m.kind = MethodKind::Reuse;
  m.stage = "4 (across requests)";
  m.summary =
      "KV of whole token blocks under chained hashes; a request loads its longest cached "
      "prefix and prefills the rest (multi-request: the shared context once per sample)";
  m.paper = "vLLM automatic prefix caching, SGLang RadixAttention, LMCache";
  m.params = {int_param("block", 256, 1, 65536, "tokens per block")};
  return m;
}

MethodInfo tiers_method() {
  MethodInfo m;
  m.name = "tiers";
  m.kind = MethodKind::Tiers;
  m.stage = "4 (across requests)";
  m.summary =
      "where reused blocks live: device memory, then CPU memory, local disk (zstd files), "
      "Redis; written through, served from the highest tier that has them";
  m.paper = "LMCache (arXiv 2510.09665)";
  m.params = {
      bytes_param("device", "1GB", "bytes of blocks kept where the model computes (host memory in "
                                  "this CPU build)"),
      bytes_param("cpu", "0", "bytes in the CPU-memory tier (0: none)"),
      text_param("disk", "", "directory of the disk tier (unset: none)"),
      bytes_param("disk_size", "4GB", "bytes the disk tier may hold (compressed)"),
      text_param("redis", "", "host:port of a Redis server (unset: none)"),
      bytes_param("redis_size", "1GB", "bytes the Redis tier may hold"),
      choice_param("policy", "lru", {"lru", "lfu", "fifo", "ttl"}, "replacement in every tier"),
      float_param("ttl", "600", 0, kNoMax, "seconds a block lives under policy=ttl"),
  };
  m.params[7].min_exclusive = true;
  return m;
}

}  // namespace kvbench
