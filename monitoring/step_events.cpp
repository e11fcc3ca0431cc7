#include "monitoring/step_events.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace troupe::monitoring {

namespace {

// JSON text of one event, appended piece by piece (every string in it is a fixed name).
class JsonWriter {
 public:
  explicit JsonWriter(std::string& out) : out_(out) {}

  JsonWriter& key(std::string_view name) {
    out_ += first_ ? "\"" : ",\"";
    first_ = false;
    out_ += name;
    out_ += "\":";
    return *this;
  }
  JsonWriter& integer(std::int64_t v) {
    char buffer[24];
    const auto end = std::to_chars(buffer, buffer + sizeof buffer, v).ptr;
    out_.append(buffer, end);
    return *this;
  }
  // Three decimals are enough for milliseconds; not-a-number is 0.
  JsonWriter& number(double v, int decimals = 3) {
    if (!std::isfinite(v)) v = 0.0;
    char buffer[40];
    const auto end =
        std::to_chars(buffer, buffer + sizeof buffer, v, std::chars_format::fixed, decimals).ptr;
    out_.append(buffer, end);
    return *this;
  }
  JsonWriter& text(std::string_view v) {
    out_ += '"';
    out_ += v;
    out_ += '"';
    return *this;
  }
  JsonWriter& open(char bracket) {
    out_ += bracket;
    first_ = true;
    return *this;
  }
  JsonWriter& close(char bracket) {
    out_ += bracket;
    first_ = false;
    return *this;
  }
  // Between the elements of an array.
  void next(bool& first_element) {
    if (!first_element) out_ += ',';
    first_element = false;
  }

 private:
  std::string& out_;
  bool first_ = true;
};

}  // namespace

std::string render_step_event(const StepEvent& e) {
  std::string out;
  out.reserve(256 + 24 * e.batch.size());
  JsonWriter w(out);
  w.open('{').key("type").text("step");
  w.key("replica").integer(e.replica).key("step").integer(static_cast<std::int64_t>(e.step));
  w.key("time_ms").number(e.time_ms).key("step_ms").number(e.step_ms);
  w.key("round_trip_ms").number(e.round_trip_ms);
  w.key("prefill_tokens").integer(e.num_prefill_tokens);
  w.key("decode_tokens").integer(e.num_decode_tokens);
  w.key("generated_tokens").integer(e.num_generated_tokens);
  if (e.num_drafted_tokens > 0) {
    w.key("drafted_tokens").integer(e.num_drafted_tokens);
    w.key("accepted_tokens").integer(e.num_accepted_tokens);
  }
  w.key("batch").open('[');
  bool first = true;
  for (const auto& b : e.batch) {
    w.next(first);
    w.open('{').key("id").integer(static_cast<std::int64_t>(b.id));
    w.key(b.prefill ? "prefill" : "decode").integer(b.num_tokens);
    if (b.drafted > 0) w.key("drafted").integer(b.drafted).key("accepted").integer(b.accepted);
    w.close('}');
  }
  w.close(']').key("first_tokens").open('[');
  first = true;
  for (const auto& f : e.first_tokens) {
    w.next(first);
    w.open('{').key("id").integer(static_cast<std::int64_t>(f.id));
    w.key("ttft_ms").number(f.ttft_ms).close('}');
  }
  w.close(']').key("finished").open('[');
  first = true;
  for (const auto& f : e.finished) {
    w.next(first);
    w.open('{').key("id").integer(static_cast<std::int64_t>(f.id));
    w.key("reason").text(f.reason).close('}');
  }
  w.close(']');
  w.key("running").integer(e.num_running).key("waiting").integer(e.num_waiting);
  w.key("kv_usage").number(e.kv_usage, 5).key("kv_blocks").integer(e.num_kv_blocks);
  w.key("prefix_hit_tokens").integer(e.prefix_hit_tokens);
  w.key("prefix_queried_tokens").integer(e.prefix_queried_tokens);
  w.key("preemptions").integer(e.num_preemptions);
  w.close('}');
  return out;
}

StepEvents::Viewer::Viewer(std::size_t capacity, std::function<void()> wake)
    : capacity_(std::max<std::size_t>(capacity, 1)), wake_(std::move(wake)) {}

std::vector<std::shared_ptr<const std::string>> StepEvents::Viewer::take(std::int64_t& dropped) {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<const std::string>> events(queue_.begin(), queue_.end());
  queue_.clear();
  dropped = dropped_;
  dropped_ = 0;
  return events;
}

void StepEvents::Viewer::push(const std::shared_ptr<const std::string>& event) {
  bool was_empty = false;
  {
    std::lock_guard lock(mutex_);
    if (queue_.size() == capacity_) {
      queue_.pop_front();  // the viewer is behind: its oldest event goes
      ++dropped_;
    }
    was_empty = queue_.empty();
    queue_.push_back(event);
  }
  if (was_empty && wake_) wake_();
}

void StepEvents::publish(const StepEvent& event) {
  if (!watched()) return;
  const auto rendered = std::make_shared<const std::string>(render_step_event(event));
  std::lock_guard lock(mutex_);
  for (const auto& viewer : viewers_) viewer->push(rendered);
}

std::shared_ptr<StepEvents::Viewer> StepEvents::watch(std::size_t capacity,
                                                      std::function<void()> wake) {
  auto viewer = std::make_shared<Viewer>(capacity, std::move(wake));
  std::lock_guard lock(mutex_);
  viewers_.push_back(viewer);
  num_viewers_.store(static_cast<int>(viewers_.size()), std::memory_order_relaxed);
  return viewer;
}

void StepEvents::unwatch(const std::shared_ptr<Viewer>& viewer) {
  std::lock_guard lock(mutex_);
  std::erase(viewers_, viewer);
  num_viewers_.store(static_cast<int>(viewers_.size()), std::memory_order_relaxed);
}

}  // namespace troupe::monitoring
