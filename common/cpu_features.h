// The instruction sets this build was compiled to use (-march, KVBENCH_MARCH), checked
// against the CPU it runs on: a binary built on one machine and run on an older one would
// otherwise die of SIGILL in the middle of a sweep.
#pragma once

namespace kvbench {

// The first instruction set the build relies on that this CPU lacks ("avx512vnni", ...),
// or nullptr when it has them all.
inline const char* missing_cpu_feature() {
  __builtin_cpu_init();
#if defined(__AVX2__)
  if (!__builtin_cpu_supports("avx2")) return "avx2";
#endif
#if defined(__FMA__)
  if (!__builtin_cpu_supports("fma")) return "fma";
#endif
#if defined(__AVX512F__)
  if (!__builtin_cpu_supports("avx512f")) return "avx512f";
#endif
#if defined(__AVX512BW__)
  if (!__builtin_cpu_supports("avx512bw")) return "avx512bw";
#endif
#if defined(__AVX512VNNI__)
  if (!__builtin_cpu_supports("avx512vnni")) return "avx512vnni";
#endif
  return nullptr;
}

}  // namespace kvbench
