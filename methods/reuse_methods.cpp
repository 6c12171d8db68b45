// Stage 4 in specs: `prefix` (reuse of cached prefix blocks), `tiers` (where they are
// stored) and `cacheblend` (reuse of documents' KV in any order). None changes a sequence's
// cache: the session loads KV into it (reuse/prefix_cache.h, harness/cache_blend.h), so
// they compose with full, storage and retrieval methods:
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

MethodInfo cacheblend_method() {
  MethodInfo m;
  m.name = "cacheblend";
  m.kind = MethodKind::Reuse;
  m.stage = "4 (across requests)";
  m.summary =
      "documents' KV computed once each, re-rotated to their place in any order; the tokens "
      "that deviate most at select_layer are recomputed (samples with documents: docs_kv)";
  m.paper = "CacheBlend: Fast LLM Serving for RAG with Cached Knowledge Fusion (EuroSys'25)";
  m.params = {
      float_param("ratio", "0.15", 0, 1, "fraction of the documents' tokens recomputed"),
      int_param("select_layer", 1, 0, 1000, "layer whose key deviation picks them"),
      choice_param("chunks", "alone", {"alone", "after_head"},
                   "each document prefilled alone (positions from 0), or after the chat header "
                   "a request starts with"),
  };
  return m;
}

}  // namespace kvbench
