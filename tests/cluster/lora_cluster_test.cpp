// LoRA adapters on cluster nodes (issue 33): a head with two nodes serves an adapter given
// at start-up and one loaded at run time (each node reads the file at the same path), with
// the greedy text one process gives; an unloaded adapter is then a 404 on the cluster.
#include "cluster/cluster_support.hpp"
#include "model/random_model.hpp"

using namespace troupe;
using namespace troupe::test::cluster;

namespace {

// A random adapter of every matrix for the cluster's model, strong enough to change its
// greedy text.
std::string cluster_adapter(const std::string& name, std::uint64_t seed) {
  model::RandomAdapterSpec spec;
  spec.base_path = cluster_model();
  spec.rank = 8;
  spec.seed = seed;
  spec.stddev = 0.08f;
  const std::string path = test::temp_path(name + ".gguf");
  REQUIRE(model::write_random_adapter(spec, path).has_value());
  return path;
}

std::string completion_for(const std::string& model, int i) {
  return R"({"model":")" + model + R"(","prompt":)" + ids(prompt_for(i, 9)) +
         R"(,"max_tokens":10,"temperature":0,"ignore_eos":true})";
}

std::string text_of(const Reply& r) {
  return json_of(r.body)["choices"].array[0]["text"].string;
}

}  // namespace

TEST_CASE(
    "LoRA adapters on cluster nodes, at start-up and loaded at run time, answer as one "
    "process does",
    "[cluster][lora]") {
  const std::string first = cluster_adapter("cluster-lora-a", 11);
  const std::string second = cluster_adapter("cluster-lora-b", 12);
  const std::vector<std::string> lora_flags = {"--lora-modules", "a=" + first, "--max-loras", "2",
                                               "--enable-runtime-lora-updating"};
  std::vector<std::string> argv = {TROUPE_BINARY, "serve",     "-m", cluster_model(), "--port",
                                   "0",           "--threads", "1",  "--kv-cache-gb", "0.02"};
  argv.insert(argv.end(), lora_flags.begin(), lora_flags.end());
  ChildProcess single(argv);
  const auto single_port = single.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  INFO(single.output());
  REQUIRE(single_port.has_value());
  const auto alone = static_cast<std::uint16_t>(std::stoi(*single_port));
  Cluster cluster(2, "round-robin", lora_flags);

  const std::string load = R"({"lora_name":"b","lora_path":")" + second + R"("})";
  REQUIRE(http(alone, "POST", "/v1/load_lora_adapter", load).status == 200);
  const Reply loaded = cluster.post("/v1/load_lora_adapter", load);
  INFO(loaded.body);
  REQUIRE(loaded.status == 200);

  int changed = 0;
  for (const std::string model : {"a", "b"}) {
    for (int i = 0; i < 4; ++i) {  // round-robin: each replica serves two of them
      const Reply one = http(alone, "POST", "/v1/completions", completion_for(model, i));
      const Reply spread = cluster.post("/v1/completions", completion_for(model, i));
      REQUIRE(one.status == 200);
      REQUIRE(spread.status == 200);
      CHECK(text_of(spread) == text_of(one));
      CHECK(json_of(spread.body)["model"].string == model);
      const Reply base = http(alone, "POST", "/v1/completions", completion(prompt_for(i, 9), 10));
      if (text_of(base) != text_of(one)) ++changed;
    }
  }
  CHECK(changed >= 4);  // the adapters really change the text
  const test::Json state = cluster.cluster();
  for (const auto& r : state["replicas"].array) CHECK(r["num_routed"].number >= 4);

  REQUIRE(cluster.post("/v1/unload_lora_adapter", R"({"lora_name":"b"})").status == 200);
  CHECK(cluster.post("/v1/completions", completion_for("b", 0)).status == 404);
  CHECK(cluster.post("/v1/completions", completion_for("a", 0)).status == 200);
  std::filesystem::remove(first);
  std::filesystem::remove(second);
}
