// `bench forward --profile`: where one prefill's and one decode step's time goes, op by op,
// on the CPU backend, against the processor's int8 peak and the memory's read bandwidth.
#pragma once

#include <cstdint>
#include <vector>

#include "model/loaded_model.hpp"

namespace troupe::bench {

// Profiles a prefill of prompt_len tokens and 16 decode steps at each batch size (no history),
// printing each op's share; bandwidth_gb_s: the measured read bandwidth (0: not measured).
// num_adapters > 0: the decode steps' sequences are spread over that many attached LoRA
// adapters (sequence s under adapter 1 + s % num_adapters), so lora_add shows among the ops.
// Returns false, printing why, where the backend is not the CPU's.
bool print_profile(model::LoadedModel& loaded, std::int32_t prompt_len,
                   const std::vector<std::int32_t>& batches, std::int32_t block_size, int threads,
                   double bandwidth_gb_s, std::int32_t num_adapters = 0);

}  // namespace troupe::bench
