// Spec strings: the parser's syntax rules and the registry's validation. Every error is
// an InputError whose one line names the spec and quotes the expected form.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "cache/budget.h"
#include "cache/registry.h"
#include "cache_feed.h"
#include "common/input_error.h"

using namespace kvbench;

namespace {

// The message of the InputError `spec` raises, or "" when it resolves.
std::string error_of(const std::string& spec) {
  try {
    resolve_method_spec(spec);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("spec parser splits components and parameters", "[unit]") {
  const MethodSpec spec = parse_method_spec("snapkv:budget=512,window=32+kivi:bits=2");
  REQUIRE(spec.components.size() == 2);
  CHECK(spec.components[0].name == "snapkv");
  REQUIRE(spec.components[0].params.size() == 2);
  CHECK(spec.components[0].params[1].first == "window");
  CHECK(spec.components[0].params[1].second == "32");
  CHECK(spec.components[1].name == "kivi");
  CHECK(parse_method_spec("full").components[0].params.empty());
}

TEST_CASE("a value may hold ':' (host:port): only the first ':' ends a name", "[unit]") {
  const MethodSpec spec = parse_method_spec("tiers:redis=127.0.0.1:6379,disk=/tmp/kv");
  REQUIRE(spec.components[0].params.size() == 2);
  CHECK(spec.components[0].params[0].second == "127.0.0.1:6379");
  CHECK(spec.components[0].params[1].second == "/tmp/kv");
}

TEST_CASE("spec syntax errors name the spec and the expected form", "[unit]") {
  for (const std::string bad :
       {"", ":x=1", "snapkv:", "snapkv:budget", "snapkv:budget=", "snapkv:=3", "a+", "+a",
        "snap kv", "snapkv:budget=1,budget=2", "snapkv:budget=1,,window=2", "h2o:budget=1=2",
        "snapkv:budget=5 6", "prefix:block=1\t2"}) {
    INFO("spec '" << bad << "'");
    std::string message;
    try {
      parse_method_spec(bad);
    } catch (const InputError& e) {
      message = e.what();
    }
    CHECK(message.find("bad method spec '" + bad + "'") == 0);
    CHECK(message.find(kSpecForm) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
}

TEST_CASE("registry rejects unknown methods and parameters of full", "[unit]") {
  CHECK(error_of("full").empty());
  CHECK(resolve_method_spec("full").canonical == "full");
  const std::string unknown = error_of("nosuch:budget=3");
  CHECK(unknown.find("unknown method 'nosuch'") != std::string::npos);
  CHECK(unknown.find("no plugin was loaded") != std::string::npos);
  CHECK(unknown.find("full") != std::string::npos);  // lists what exists
  CHECK(error_of("full:budget=1").find("method 'full' has no parameter 'budget' (it takes none)") !=
        std::string::npos);
  CHECK(error_of("full+full").find("cannot compose") != std::string::npos);
}

TEST_CASE("every registered method documents itself and resolves with its defaults", "[unit]") {
  for (const MethodInfo& m : method_registry()) {
    INFO(m.name);
    CHECK(!m.summary.empty());
    CHECK(!m.stage.empty());
    CHECK(!m.paper.empty());
    // Policies plan for eviction methods and for storage that picks precision (zipcache).
    if (m.kind != MethodKind::Storage) {
      CHECK((m.kind == MethodKind::Eviction) == static_cast<bool>(m.make_policy));
    }
    CHECK((m.kind == MethodKind::Storage) == static_cast<bool>(m.make_layers));
    CHECK((m.kind == MethodKind::Retrieval) == static_cast<bool>(m.make_reader));
    for (const ParamInfo& p : m.params) CHECK(!p.help.empty());
    // The canonical text resolves to itself: what the results db stores can be re-run.
    // (tiers says where prefix blocks go, so it resolves beside prefix; mikv keeps what an
    // eviction method drops, so it resolves behind one.)
    const std::string base = m.kind == MethodKind::Tiers ||
                                     m.kind == MethodKind::Pinning
                                 ? "prefix+" + m.name
                             : m.needs_eviction                 ? "snapkv+" + m.name
                             : m.kind == MethodKind::Allocation ? m.name + "+snapkv"
                                                                : m.name;
    std::vector<std::string> specs = {base};
    for (const ParamInfo& p : m.params) {
      if (p.name == "ratio") specs.push_back(base + ":ratio=0.5");
    }
    for (const std::string& spec : specs) {
      const ResolvedSpec r = resolve_method_spec(spec);
      CHECK(resolve_method_spec(r.canonical).canonical == r.canonical);
    }
  }
}

TEST_CASE("budget parameters: ranges, budget xor ratio, resolution", "[unit]") {
  Budget tokens;
  tokens.tokens = 300;
  CHECK(tokens.resolve(1000) == 300);
  Budget ratio;
  ratio.ratio = 0.25;
  CHECK(ratio.resolve(1000) == 250);
  CHECK(ratio.resolve(1001) == 251);  // rounded up
  CHECK(ratio.resolve(1) == 1);       // never zero
  ratio.ratio = 1.0;
  CHECK(ratio.resolve(777) == 777);
  if (!find_method("snapkv")) return;  // the rest needs a budgeted method
  CHECK(error_of("snapkv:ratio=0").find("ratio must be in (0, 1]") != std::string::npos);
  CHECK(error_of("snapkv:ratio=1.5").find("ratio must be in (0, 1]") != std::string::npos);
  CHECK(error_of("snapkv:ratio=abc").find("ratio must be a number") != std::string::npos);
  CHECK(error_of("snapkv:budget=-5").find("budget must be in [1, 16777216]") != std::string::npos);
  CHECK(error_of("snapkv:budget=1.5").find("budget must be an integer") != std::string::npos);
  CHECK(error_of("snapkv:budget=64,ratio=0.5").find("not both") != std::string::npos);
  CHECK(error_of("snapkv:windw=3").find("method 'snapkv' has no parameter 'windw'") !=
        std::string::npos);
  CHECK(error_of("snapkv:budget=512+h2o:budget=512").find("cannot compose") != std::string::npos);
  CHECK(error_of("full+snapkv").find("cannot compose") != std::string::npos);
  const ResolvedSpec r = resolve_method_spec("snapkv:ratio=0.25");
  CHECK(r.canonical.find("ratio=0.25") != std::string::npos);
  CHECK(r.canonical.find("window=") != std::string::npos);  // defaults written out
  CHECK(r.canonical.find("budget=") == std::string::npos);  // the ratio stands in for it
  CHECK(resolve_method_spec(r.canonical).canonical == r.canonical);
}

TEST_CASE("compositions: eviction or retrieval, then storage last", "[unit]") {
  CHECK(resolve_method_spec("snapkv:budget=1024+kivi:bits=2").canonical ==
        "snapkv:budget=1024,window=32,kernel=5,pool=avg+kivi:bits=2,residual=128,tail=kivi");
  CHECK(resolve_method_spec("quest:budget=512+kivi:bits=4").canonical ==
        "quest:budget=512,page=16,dense_layers=2,min_pages=3+kivi:bits=4,residual=128,tail=kivi");
  CHECK(resolve_method_spec("kvmerger:ratio=0.5+kivi").components.size() == 2);
  CHECK(error_of("kivi+snapkv").find("'kivi' stores what the methods before it keep, so it "
                                     "comes last") != std::string::npos);
  CHECK(error_of("kivi:bits=2+kivi:bits=4").find("at most one storage method") !=
        std::string::npos);
  CHECK(error_of("snapkv+quest").find("retrieval reads pages of the whole cache") !=
        std::string::npos);
  CHECK(error_of("quest+tova").find("cannot follow eviction") != std::string::npos);
  CHECK(error_of("full+kivi").find("cannot compose with anything") != std::string::npos);
  CHECK(error_of("kivi:bits=3").find("bits must be one of 2, 4") != std::string::npos);
  CHECK(error_of("kivi:residual=100").find("multiple of 32") != std::string::npos);
}

TEST_CASE("a streamed prefill takes a chunk a forward can honour and a token budget", "[unit]") {
  // The model feeds at most 512 rows a forward: a larger chunk would act as 512.
  CHECK(error_of("keydiff:budget=256,prefill=stream,chunk=512").empty());
  CHECK(error_of("keydiff:budget=256,prefill=stream,chunk=1024").find("chunk") !=
        std::string::npos);
  // A ratio resolves only once the whole context is in.
  const std::string error = error_of("streamingllm:ratio=0.5,prefill=stream");
  CHECK(error.find("prefill=stream needs a token budget") != std::string::npos);
  CHECK(error_of("streamingllm:ratio=0.5").empty());
}

// Issue 20: window=10^17 was checked only against token budgets, so a ratio budget let it
// through to QueryWindow, which allocated window x row floats up front (int64 overflow or
// gigabytes per layer); kivi's residual likewise overflowed residual + group.
TEST_CASE("hostile sizes: token counts are bounded, and the bound costs only what is seen", "[unit]") {
  for (const std::string spec :
       {"snapkv:ratio=0.5,window=100000000000000000", "pyramidkv:ratio=0.5,window=100000000000000000",
        "kvmerger:ratio=0.5,window=100000000000000000",
        "h2o:budget=64+kivi:residual=9223372036854775776", "streamingllm:ratio=0.5,sink=99999999999",
        "snapkv:budget=100000000000000000"}) {
    INFO(spec);
    CHECK(error_of(spec).find("must be in [") != std::string::npos);
  }
  // The largest allowed values hold only the rows a 40-token context gives them.
  const KvShape shape{2, 2, 32};
  for (const std::string spec :
       {"snapkv:ratio=0.5,window=16777216", "pyramidkv:ratio=0.5,window=16777216",
        "kvmerger:ratio=0.5,window=16777216", "h2o:budget=16+kivi:residual=16777216",
        "snapkv:ratio=0.5,window=16777216+kivi:residual=16777216",
        "cam:ratio=0.5,window=16777216,merge=16777216,seed=4294967295",
        "chelsea:ratio=0.5,window=16777216,chunk=16777216", "chelsea:ratio=0.5,chunk=16777216"}) {
    INFO(spec);
    KvCache cache = make_cache(spec, shape);
    std::mt19937 rng(3);
    testing::feed(cache, 4, testing::random_chunk(40, shape, 4, rng));
    CHECK(cache.bytes_resident() < (int64_t{1} << 20));  // the query windows held: 40 rows
    cache.end_context();
    testing::decode_step(cache, 4, testing::random_chunk(1, shape, 4, rng));
    CHECK(cache.bytes_resident() < (int64_t{1} << 20));
  }
}
