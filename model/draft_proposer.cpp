#include "model/draft_proposer.hpp"

#include <algorithm>
#include <string>

namespace troupe::model {

TokenId DraftProposer::argmax(std::span<const float> logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Result<void> DraftProposer::propose(std::span<const DraftWork> work, StepInput& step,
                                    std::span<std::optional<ProposalGuide>> guides) {
  if (!guides.empty() && guides.size() != work.size()) {
    return make_error(ErrorCode::invalid_argument, "draft work: one guide per work item");
  }
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::invalid_argument, "draft work: " + what);
  };
  // Each proposing sequence's first placeholder row in `step`, checked against it: the
  // chunk there is its last token (at the position after `tokens`) and then k rows.
  std::vector<std::int32_t> placeholder(work.size(), -1);
  std::int32_t most = 0;
  for (std::size_t w = 0; w < work.size(); ++w) {
    const DraftWork& d = work[w];
    if (d.seq < 0 || d.seq >= step.num_seqs()) return bad("a sequence outside the step");
    if (d.tokens.empty() || d.first_position < 0 || d.num_proposals < 0) {
      return bad("a sequence with no tokens, or a negative position or count");
    }
    const std::int32_t begin = step.query_start[d.seq], end = step.query_start[d.seq + 1];
    const std::int32_t last = d.first_position + static_cast<std::int32_t>(d.tokens.size()) - 1;
    if (d.num_proposals > 0 &&
        (end - begin != 1 + d.num_proposals || step.positions[begin] != last ||
         step.tokens[begin] != d.tokens.back())) {
      return bad("sequence " + std::to_string(d.seq) +
                 "'s chunk is not its last token and room for its proposals");
    }
    if (d.num_proposals == 0 && last >= step.context_lens[d.seq]) {
      return bad("sequence " + std::to_string(d.seq) + " catches up past its blocks");
    }
    placeholder[w] = begin + 1;
    most = std::max(most, d.num_proposals);
  }
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  // Pass j proposes token j of every sequence that wants that many: the first runs the
  // unseen tokens (logits at the last of each proposing one's), the others the token the
  // pass before proposed.
  for (std::int32_t j = 0; j < std::max(most, 1); ++j) {
    StepInput pass;
    std::vector<std::size_t> rows_of;  // work index of each logit row
    for (std::size_t w = 0; w < work.size(); ++w) {
      const DraftWork& d = work[w];
      const auto table = step.block_table(d.seq);
      if (j == 0) {
        append_sequence(pass, d.tokens, d.first_position, table, d.num_proposals > 0);
      } else if (d.num_proposals > j) {
        const std::int32_t row = placeholder[w] + j - 1;
        append_sequence(pass, std::span<const TokenId>(&step.tokens[row], 1), step.positions[row],
                        table, true);
      } else {
        continue;
      }
      if (d.num_proposals > j) rows_of.push_back(w);
    }
    if (pass.num_tokens() == 0) break;
    TROUPE_TRY_VOID(model_.forward(pass, logits_));
    for (std::size_t r = 0; r < rows_of.size(); ++r) {
      const std::span<const float> row(logits_.data() + r * vocab, vocab);
      const std::size_t w = rows_of[r];
      step.tokens[placeholder[w] + j] =
          !guides.empty() && guides[w] ? guides[w]->choose(row) : argmax(row);
    }
  }
  return {};
}

}  // namespace troupe::model
