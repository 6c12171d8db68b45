// Stage 4 in specs: `prefix` (reuse of cached prefix blocks), `tiers` (where they are
// stored) and `cacheblend` (reuse of documents' KV in any order). None changes a sequence's
// cache: the session loads KV into it (reuse/prefix_cache.h, harness/cache_blend.h), so
// they compose with full, storage and retrieval methods:
// prefix:block=256+tiers:device=64MB,cpu=1GB,disk=/tmp/kv,redis=127.0.0.1:6379,policy=lru
// The slow tiers encode blocks by their codec: disk_codec=zstd|raw|cachegen (zstd by
// default), redis_codec=raw|zstd|cachegen (raw by default); reuse/block_codec.h.
// `apc_ttl` pins what prefix reuse keeps in device memory for a time-to-live between
// requests (Continuum): prefix:block=256+apc_ttl:ttl=30, with or without tiers.
#include "cache/registry.h"

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
  m.reuses_blocks = true;
  return m;
}

MethodInfo tiers_method() {
  MethodInfo m;
  m.name = "tiers";
  m.kind = MethodKind::Tiers;
  m.stage = "4 (across requests)";
  m.summary =
      "where reused blocks live: device memory, then CPU memory, local disk, Redis; written "
      "through, served from the highest tier that has them; disk and Redis encode blocks "
      "raw (store only), with zstd, or with CacheGen's lossy codec";
  m.paper =
      "LMCache (arXiv 2510.09665); CacheGen: KV Cache Compression and Streaming for Fast "
      "Large Language Model Serving (SIGCOMM'24)";
  m.choices = {
      "codecs apply to the disk and Redis tiers only; device and CPU memory hold blocks as "
      "computed (LMCache: its serde encodes for remote backends), so a block served from "
      "memory is exact and one served from a cachegen tier (and promoted above) is decoded",
      "cachegen follows LMCache's encoder: per-token symmetric quantization of each layer's K "
      "and V rows, keys 32 bins in layers 0-9 and 16 after, values 32 in layers 0-1 and 16 "
      "after (32 everywhere below 10 layers), codes kept per channel over a block's tokens",
      "cachegen's entropy coder is zstd over the codes and scales, not LMCache's per-channel "
      "arithmetic coder (torchac); no delta against anchor tokens (the paper's, not in "
      "LMCache's encoder); the chunk is the prefix block; scales are fp32",
      "every disk file carries an XXH3 checksum of its encoding, so a corrupt raw file is a "
      "miss like a corrupt zstd one",
  };
  m.uncompressed_tiers = {"cpu", "disk", "redis"};
  m.params = {
      bytes_param("device", "1GB", "bytes of blocks kept where the model computes (host memory in "
                                  "this CPU build)"),
      bytes_param("cpu", "0", "bytes in the CPU-memory tier (0: none)"),
      text_param("disk", "", "directory of the disk tier (unset: none)"),
      bytes_param("disk_size", "4GB", "bytes the disk tier may hold (as encoded)"),
      choice_param("disk_codec", "zstd", {"zstd", "raw", "cachegen"},
                   "how the disk tier encodes blocks: zstd, raw (store only) or cachegen "
                   "(lossy)"),
      text_param("redis", "", "host:port of a Redis server (unset: none)"),
      bytes_param("redis_size", "1GB", "bytes the Redis tier may hold (as encoded)"),
      choice_param("redis_codec", "raw", {"raw", "zstd", "cachegen"},
                   "how the Redis tier encodes blocks"),
      choice_param("policy", "lru", {"lru", "lfu", "fifo", "ttl"}, "replacement in every tier"),
      float_param("ttl", "600", 0, kNoMax, "seconds a block lives under policy=ttl"),
  };
  m.params[9].min_exclusive = true;  // ttl
  return m;
}

// Continuum (arXiv 2511.02230) pins a multi-turn program's KV cache in GPU memory when a
// request ends, for a time-to-live predicted from the tool call that follows; the next
// request of the program finds it if it comes before the TTL runs out, else the pin is
// dropped and the KV is evicted (recomputed or loaded from a lower tier). The authors' code
// (github.com/Hanchenli/vllm-continuum) was not reachable here: this is the paper's rule.
//
// Authors' settings: the TTL comes from the distribution of the tool's past durations,
// bounded by what the KV cache costs to hold; there is no fixed default.
MethodInfo apc_ttl_method() {
  MethodInfo m;
  m.name = "apc_ttl";
  m.kind = MethodKind::Pinning;
  m.stage = "4 (across requests)";
  m.summary =
      "prefix reuse whose device-memory blocks (or compressed context) stay pinned ttl "
      "simulated seconds after their last use, then are evicted: a turn gap longer than the "
      "ttl turns hits into misses (--turn-gap)";
  m.paper =
      "Continuum: Efficient and Robust Multi-Turn LLM Agent Scheduling with KV Cache "
      "Time-to-Live (arXiv 2511.02230)";
  m.choices = {
      "a fixed ttl: Continuum predicts it per tool call from past tool durations, and "
      "kvbench's tasks have no tool calls",
      "time is simulated: the session's clock advances only by the turn gap between requests "
      "(turn_gap_s), never by the requests themselves, so a run is deterministic; a gap "
      "equal to the ttl expires",
      "what is pinned is what prefix reuse keeps in the device tier: the conversation's "
      "blocks (or, with an eviction method, its compressed context), renewed by every hit "
      "and put; the cpu, disk and Redis tiers keep tiers' policy, so an expired block can "
      "still be served from below, as Continuum's DRAM offloading would",
      "an expired pin is evicted (its bytes freed) before the next lookup; Continuum only "
      "unpins it, leaving it to the allocator; with one conversation per session kvbench "
      "has no other request to need the memory",
      "under capacity pressure the soonest to expire goes first (Continuum's scheduler "
      "would hold the request instead)",
      "multi-request mode only: a multi-turn conversation keeps its cache in the session",
  };
  m.params = {float_param("ttl", "30", 0, kNoMax, "simulated seconds a block stays pinned "
                                                  "after its last use")};
  m.params[0].min_exclusive = true;
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
