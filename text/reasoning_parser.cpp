#include "text/reasoning_parser.hpp"

#include <algorithm>

namespace troupe::text {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
// Harmony's markers (control tokens, shown as text: the server renders them for gpt_oss).
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kChannel = "<|channel|>";
// A marker's name is short: "<|" without "|>" this far on is text, not a marker.
constexpr std::size_t kMostMarkerBytes = 16;
// A header this long without its <|message|> is no harmony header: the text is the answer.
constexpr std::size_t kMostHeaderBytes = 1024;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view trim_right(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

void trim_left(std::string& s) {
  const auto first = std::find_if_not(s.begin(), s.end(), is_space);
  s.erase(s.begin(), first);
}

// The most bytes at the end of `text` that begin `marker` (and are not all of it).
std::size_t partial_suffix(std::string_view text, std::string_view marker) {
  for (std::size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

std::optional<ReasoningFormat> reasoning_format_named(std::string_view name) {
  if (name == "deepseek_r1") return ReasoningFormat::deepseek_r1;
  // DeepSeek-V3.1 and GLM-4.5/4.6 open or close <think> in the prompt as thinking is on
  // or off: the prompt decides, as for Qwen3.
  if (name == "qwen3" || name == "deepseek_v3" || name == "glm45") return ReasoningFormat::qwen3;
  if (name == "gpt_oss") return ReasoningFormat::gpt_oss;
  return std::nullopt;
}

std::string_view reasoning_format_name(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::deepseek_r1:
      return "deepseek_r1";
    case ReasoningFormat::qwen3:
      return "qwen3";
    case ReasoningFormat::gpt_oss:
      return "gpt_oss";
  }
  return "qwen3";
}

std::string_view ReasoningParser::answer_marker() const {
  return format_ == ReasoningFormat::gpt_oss ? "<|channel|>final<|message|>" : kThinkClose;
}

ReasoningParser::ReasoningParser(ReasoningFormat format, std::string_view prompt)
    : format_(format) {
  const std::string_view end = trim_right(prompt);
  if (format == ReasoningFormat::gpt_oss) {
    // The template ends with "<|start|>assistant": the output opens with its header. A
    // prompt that ends inside a message (a continued one) goes on in that message's channel.
    if (end.ends_with(std::string(kChannel) + "analysis" + std::string(kMessage))) {
      state_ = State::reasoning;
      channel_ = Channel::reasoning;
    } else if (end.ends_with(kMessage)) {
      state_ = State::content;
    } else {
      state_ = State::header;
    }
    return;
  }
  if (end.ends_with(kThinkOpen)) {
    state_ = State::reasoning;  // the template opened the thinking for the model
  } else if (end.ends_with(kThinkClose)) {
    state_ = State::content;  // thinking turned off (enable_thinking false)
  } else {
    // DeepSeek-R1 thinks first, whether or not it writes <think> (vLLM's reading).
    state_ = format == ReasoningFormat::deepseek_r1 ? State::reasoning : State::opening;
  }
}

void ReasoningParser::emit(ReasoningSplit& out, bool to_reasoning, std::size_t count) {
  std::string part = held_.substr(0, count);
  held_.erase(0, count);
  if (at_section_start_) {
    trim_left(part);
    if (part.empty()) return;
    at_section_start_ = false;
  }
  if (!to_reasoning) {
    out.content += part;
    return;
  }
  // Whitespace before the thinking's end is dropped: held until text follows it.
  std::string text = pending_space_ + part;
  const std::string_view kept = trim_right(text);
  out.reasoning.append(kept);
  pending_space_ = text.substr(kept.size());
}

ReasoningSplit ReasoningParser::take(std::string_view text, bool last) {
  held_.append(text);
  ReasoningSplit out;
  if (format_ == ReasoningFormat::gpt_oss) {
    take_harmony(out, last);
  } else {
    take_think(out, last);
  }
  if (last) pending_space_.clear();
  return out;
}

ReasoningSplit ReasoningParser::split(std::string_view output) && {
  return take(output, /*last=*/true);
}

void ReasoningParser::take_think(ReasoningSplit& out, bool last) {
  while (true) {
    switch (state_) {
      case State::opening: {
        trim_left(held_);
        if (held_.starts_with(kThinkOpen)) {
          held_.erase(0, kThinkOpen.size());
          state_ = State::reasoning;
          at_section_start_ = true;
          continue;
        }
        if (!last && kThinkOpen.starts_with(held_)) return;  // may still open (or nothing yet)
        state_ = State::content;
        at_section_start_ = true;
        continue;
      }
      case State::reasoning: {
        if (at_section_start_) {
          // A model may write the <think> its template already opened.
          trim_left(held_);
          if (held_.starts_with(kThinkOpen)) {
            held_.erase(0, kThinkOpen.size());
            continue;
          }
          if (!last && kThinkOpen.starts_with(held_)) return;
        }
        const auto close = held_.find(kThinkClose);
        if (close == std::string::npos) {
          emit(out, true, held_.size() - (last ? 0 : partial_suffix(held_, kThinkClose)));
          return;
        }
        emit(out, true, close);
        held_.erase(0, kThinkClose.size());
        pending_space_.clear();
        state_ = State::content;
        at_section_start_ = true;
        continue;
      }
      case State::content:
      case State::header:
        emit(out, false, held_.size());
        return;
    }
  }
}

void ReasoningParser::take_harmony(ReasoningSplit& out, bool last) {
  while (true) {
    if (state_ == State::header) {
      if (const auto at = held_.find(kMessage); at != std::string::npos) {
        // "<|channel|>analysis<|message|>", "<|start|>assistant<|channel|>final ..."
        const std::string_view header = std::string_view(held_).substr(0, at);
        std::string_view name;
        if (const auto c = header.find(kChannel); c != std::string_view::npos) {
          name = header.substr(c + kChannel.size());
          name = name.substr(0, std::min(name.find(' '), name.find('<')));
        }
        channel_ = name == "analysis" ? Channel::reasoning : Channel::content;
        held_.erase(0, at + kMessage.size());
        state_ = channel_ == Channel::reasoning ? State::reasoning : State::content;
        at_section_start_ = true;
        continue;
      }
      // Text that opens with no marker (or a header that never ends) is no harmony: the
      // model answered plainly.
      std::string probe = held_;
      trim_left(probe);
      const bool plain =
          (!probe.empty() && probe[0] != '<') || (probe.size() >= 2 && probe[1] != '|');
      if ((plain && !saw_marker_) || held_.size() > kMostHeaderBytes) {
        state_ = State::content;
        channel_ = Channel::content;
        at_section_start_ = true;
        continue;
      }
      if (held_.find("|>") != std::string::npos) saw_marker_ = true;
      if (last) held_.clear();  // a header with no message: nothing to say
      return;
    }
    // Inside a message: its text up to the next marker.
    const bool to_reasoning = channel_ == Channel::reasoning;
    const auto open = held_.find("<|");
    if (open == std::string::npos) {
      emit(out, to_reasoning, held_.size() - (!last && held_.ends_with('<') ? 1 : 0));
      return;
    }
    const auto close = held_.find("|>", open + 2);
    if (close == std::string::npos || close - open > kMostMarkerBytes) {
      if (close == std::string::npos && held_.size() - open <= kMostMarkerBytes && !last) {
        emit(out, to_reasoning, open);  // what follows may be a marker: wait
        return;
      }
      emit(out, to_reasoning, open + 2);  // "<|" that is not a marker: text
      continue;
    }
    const std::string marker = held_.substr(open, close + 2 - open);
    emit(out, to_reasoning, open);
    held_.erase(0, marker.size());
    pending_space_.clear();
    if (marker == "<|end|>" || marker == "<|return|>" || marker == "<|call|>") {
      state_ = State::header;  // the next message's header follows
      saw_marker_ = true;
    }
  }
}

}  // namespace troupe::text
