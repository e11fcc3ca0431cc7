// LoRA adapters compute what llama.cpp computes with them (../shared/golden/lora: the three
// random adapters of ../shared/models/lora on their archs/ base models, llama.cpp b4747 at
// scale 1, F32 KV cache, 32 greedy tokens; the tolerances of ../shared/golden/archs), the
// base model beside them still computes its own outputs, and every prompt of every adapter
// and of the base model as one mixed batch gives what each gives alone: driven directly (a
// greedy loop over LlamaModel::forward, each sequence with its slot) and through the
// engine's step loop (BatchGenerator, each request with its slot).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "golden/golden_support.hpp"
#include "model/lora_adapter.hpp"
#include "support/rounded_model.hpp"

using namespace troupe;

namespace {

using test::Json;
using test::JsonParser;
using test::read_text;

constexpr std::int32_t kSteps = 32;
constexpr std::int32_t kBlockSize = 16;

Json golden_file(const std::string& relative) {
  return JsonParser(read_text(test::shared_file("golden/" + relative))).parse();
}

struct Sequence {
  std::vector<TokenId> prompt;
  std::int32_t slot = 0;  // the adapter's, 0: the base model
};

struct Generated {
  std::vector<int> ids;
  std::vector<float> first_logits;
};

// Greedy decoding of every sequence at once (lowest id on ties, never stopping): one step
// with all the prompts, then one token a sequence a step. Each sequence has blocks of its own.
std::vector<Generated> generate(model::LlamaModel& model, const std::vector<Sequence>& seqs) {
  const auto vocab = static_cast<std::size_t>(model.config().vocab_size);
  std::vector<std::vector<std::int32_t>> tables;
  std::int32_t next_block = 0;
  for (const auto& s : seqs) {
    const auto length = static_cast<std::int32_t>(s.prompt.size()) + kSteps;
    std::vector<std::int32_t> table;
    for (std::int32_t b = 0; b < (length + kBlockSize - 1) / kBlockSize; ++b) {
      table.push_back(next_block++);
    }
    tables.push_back(std::move(table));
  }
  REQUIRE(next_block <= model.backend().kv_cache_shape().num_blocks);
  std::vector<Generated> out(seqs.size());
  std::vector<float> logits;
  for (std::int32_t t = 0; t < kSteps; ++t) {
    model::StepInput step;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const auto& s = seqs[i];
      if (t == 0) {
        model::append_sequence(step, s.prompt, 0, tables[i], true, s.slot);
      } else {
        const std::vector<TokenId> last = {out[i].ids.back()};
        model::append_sequence(step, last, static_cast<std::int32_t>(s.prompt.size()) + t - 1,
                               tables[i], true, s.slot);
      }
    }
    const auto ran = model.forward(step, logits);
    REQUIRE(ran.has_value());
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const float* row = logits.data() + i * vocab;
      if (t == 0) out[i].first_logits.assign(row, row + vocab);
      std::size_t best = 0;
      for (std::size_t j = 1; j < vocab; ++j) {
        if (row[j] > row[best]) best = j;
      }
      out[i].ids.push_back(static_cast<int>(best));
    }
  }
  return out;
}

std::vector<TokenId> prompt_of(const Json& p) {
  std::vector<TokenId> ids;
  for (int id : p["prompt_ids"].ints()) ids.push_back(id);
  return ids;
}

// The references' rule: ids equal up to the first step of margin < 0.02 (all when none);
// there, llama.cpp's top 1 or top 2; first-step logits within tolerance of max |logit|.
void check_against(const Generated& got, const Json& p, double tolerance) {
  const auto want = p["output_ids"].ints();
  REQUIRE(got.ids.size() == want.size());
  const Json& low = p["first_low_margin_step"];
  const std::size_t k =
      low.kind == Json::Kind::null ? want.size() : static_cast<std::size_t>(low.number);
  const auto head = [k](const std::vector<int>& ids) {
    return std::vector<int>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k));
  };
  CHECK(head(got.ids) == head(want));
  if (k < want.size()) {
    const auto& top = p["top5_per_step"].array[k].array;
    CHECK((got.ids[k] == static_cast<int>(top[0]["id"].number) ||
           got.ids[k] == static_cast<int>(top[1]["id"].number)));
  }
  const auto& reference = p["logits_first"].array;
  REQUIRE(got.first_logits.size() == reference.size());
  double max_ref = 0.0, max_diff = 0.0;
  for (std::size_t j = 0; j < reference.size(); ++j) {
    max_ref = std::max(max_ref, std::fabs(reference[j].number));
    max_diff = std::max(max_diff, std::fabs(got.first_logits[j] - reference[j].number));
  }
  INFO("first-step logits differ by up to " << max_diff << " (max |logit| " << max_ref << ")");
  CHECK(max_diff <= tolerance * max_ref);
}

// A base model on the CPU with an F32 KV cache (as the references), its adapters attached
// in order: slot 1, 2, ...
struct AdaptedModel {
  test::LoadedTestModel loaded;
  std::vector<Json> goldens;  // the adapters', by slot - 1
};

AdaptedModel open_adapted(const std::string& base_path, const std::vector<std::string>& adapters) {
  AdaptedModel m{test::LoadedTestModel::open(base_path, 160, kBlockSize, 2, KvCacheDtype::f32), {}};
  for (const auto& name : adapters) {
    auto adapter = model::LoraAdapter::open(test::shared_file("models/lora/" + name + ".gguf"),
                                            *m.loaded.file, m.loaded.config);
    REQUIRE(adapter.has_value());
    auto slot =
        m.loaded.model->attach_adapter(std::make_shared<model::LoraAdapter>(std::move(*adapter)));
    REQUIRE(slot.has_value());
    CHECK(*slot == static_cast<std::int32_t>(m.goldens.size()) + 1);
    m.goldens.push_back(golden_file("lora/" + name + ".json"));
  }
  return m;
}

// Each adapter's prompts alone, the base model's prompts alone (its archs/ reference), then
// everything in one mixed batch, bit for bit what each gave alone.
void check_base_and_adapters(const std::string& base, const std::vector<std::string>& adapters) {
  auto m = open_adapted(test::shared_file("models/archs/" + base + ".gguf"), adapters);
  const Json base_golden = golden_file("archs/" + base + ".json");
  const double tolerance = base_golden["tolerance_advice"]["logits_first_rel"].number;
  std::vector<Sequence> all;
  std::vector<const Json*> references;
  for (std::int32_t slot = 0; slot <= static_cast<std::int32_t>(adapters.size()); ++slot) {
    const Json& golden = slot == 0 ? base_golden : m.goldens[static_cast<std::size_t>(slot - 1)];
    for (const auto& p : golden["prompts"].array) {
      all.push_back({prompt_of(p), slot});
      references.push_back(&p);
    }
  }
  std::vector<Generated> alone;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::string who =
        all[i].slot == 0 ? base : adapters[static_cast<std::size_t>(all[i].slot - 1)];
    INFO(who << " prompt " << (*references[i])["name"].string << " alone");
    alone.push_back(generate(*m.loaded.model, {all[i]}).front());
    check_against(alone.back(), *references[i], tolerance);
  }
  INFO("every prompt of " << base << " and its adapters in one mixed batch");
  const auto together = generate(*m.loaded.model, all);
  for (std::size_t i = 0; i < all.size(); ++i) {
    CHECK(together[i].ids == alone[i].ids);
    const auto& a = together[i].first_logits;
    const auto& b = alone[i].first_logits;
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
  // The same through the engine's step loop (EngineCore, run_step): each request's slot
  // reaches its sequence's rows, whole prompts and in prefill chunks of 5.
  std::vector<test::GenerationRequest> requests;
  for (const auto& seq : all) {
    test::GenerationRequest r;
    r.prompt = seq.prompt;
    r.params.temperature = 0.0f;
    r.params.max_tokens = kSteps;
    r.params.ignore_eos = true;
    r.adapter = seq.slot;
    requests.push_back(std::move(r));
  }
  test::BatchGenerator generator(*m.loaded.model, {});
  for (const std::int32_t chunk : {0, 5}) {
    INFO("through the engine, prefill chunk " << chunk);
    auto engine = generator.run(requests, chunk);
    REQUIRE(engine.has_value());
    for (std::size_t i = 0; i < all.size(); ++i) {
      CHECK(std::vector<int>((*engine)[i].output.begin(), (*engine)[i].output.end()) ==
            alone[i].ids);
      if (chunk == 0) {
        const auto& a = (*engine)[i].first_logits;
        REQUIRE(a.size() == alone[i].first_logits.size());
        CHECK(std::memcmp(a.data(), alone[i].first_logits.data(), a.size() * sizeof(float)) == 0);
      }
    }
  }
}

double max_rel_diff(const std::vector<float>& got, const Json& p) {
  const auto& reference = p["logits_first"].array;
  double max_ref = 0.0, max_diff = 0.0;
  for (std::size_t j = 0; j < reference.size(); ++j) {
    max_ref = std::max(max_ref, std::fabs(reference[j].number));
    max_diff = std::max(max_diff, std::fabs(got[j] - reference[j].number));
  }
  return max_diff / max_ref;
}

}  // namespace

TEST_CASE("llama-attn-r8 and llama-all-r16 compute what llama.cpp computes, mixed with the base",
          "[golden][lora][shared]") {
  check_base_and_adapters("llama", {"llama-attn-r8", "llama-all-r16"});
}

TEST_CASE("qwen2-qv-r4 computes what llama.cpp computes, mixed with the base",
          "[golden][lora][shared]") {
  check_base_and_adapters("qwen2", {"qwen2-qv-r4"});
}

TEST_CASE("an adapter on quantized base weights: the low-rank part stays float",
          "[golden][lora][shared]") {
  // llama's matrices in Q8_0 (the CPU's int8 kernels), with llama-all-r16: its first-step
  // logits are as near llama.cpp's with the F32 weights and the adapter as the Q8_0 base's
  // are to the F32 base's (the same prompts), and far from the base's.
  const std::string path =
      test::with_matrices_in(test::shared_file("models/archs/llama.gguf"), gguf::TensorType::q8_0);
  auto m = open_adapted(path, {"llama-all-r16"});
  const Json base_golden = golden_file("archs/llama.json");
  const auto& prompts = m.goldens.front()["prompts"].array;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const Json& p = prompts[i];
    const Json& base_p = base_golden["prompts"].array[i];
    REQUIRE(base_p["prompt_ids"].ints() == p["prompt_ids"].ints());
    INFO("prompt " << p["name"].string);
    const auto with = generate(*m.loaded.model, {{prompt_of(p), 1}}).front();
    const auto without = generate(*m.loaded.model, {{prompt_of(p), 0}}).front();
    const double adapted = max_rel_diff(with.first_logits, p);
    const double base = max_rel_diff(without.first_logits, base_p);
    const double far = max_rel_diff(without.first_logits, p);
    INFO("Q8_0 with the adapter " << adapted << " from llama.cpp's F32 with it; Q8_0 base " << base
                                  << " from F32 base; Q8_0 base " << far
                                  << " from F32 with the adapter");
    CHECK(adapted < 0.1);
    CHECK(adapted < 3 * base);
    CHECK(far > 10 * adapted);
  }
}
