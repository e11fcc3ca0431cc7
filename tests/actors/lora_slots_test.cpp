// The engine's LoRA slots (actors/lora_slots): a request holds its adapter's slot; a load
// takes a free slot; an unloaded slot is free only once its last request ended.
#include <catch2/catch.hpp>

#include "actors/lora_slots.hpp"

using troupe::actors::LoraSlots;

TEST_CASE("LoRA slots: start-up adapters fill the first, loads take the free ones",
          "[actors][lora]") {
  LoraSlots slots(3, 1);
  CHECK(slots.num_slots() == 3);
  CHECK(slots.acquire(0).has_value());  // the base model
  CHECK(slots.acquire(1).has_value());
  slots.release(1);
  CHECK_FALSE(slots.acquire(2).has_value());  // empty until a load fills it
  CHECK_FALSE(slots.acquire(4).has_value());
  CHECK_FALSE(slots.acquire(-1).has_value());
  const auto a = slots.reserve();
  const auto b = slots.reserve();
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(*a == 2);
  CHECK(*b == 3);
  CHECK_FALSE(slots.acquire(2).has_value());  // reserved, not filled yet
  const auto none = slots.reserve();
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().message.find("no free LoRA adapter slot: all 3") != std::string::npos);
  slots.fill(*a);
  slots.give_back(*b);  // a load that failed
  CHECK(slots.acquire(2).has_value());
  CHECK(slots.reserve() == 3);
}

TEST_CASE("LoRA slots: an unloaded slot is free once its last request ended", "[actors][lora]") {
  LoraSlots slots(1, 1);
  REQUIRE(slots.acquire(1).has_value());
  const auto busy = slots.unload(1);
  REQUIRE(busy.has_value());
  CHECK_FALSE(*busy);                         // a request runs with it
  CHECK_FALSE(slots.acquire(1).has_value());  // no new ones
  const auto draining = slots.reserve();
  REQUIRE_FALSE(draining.has_value());
  CHECK(draining.error().message.find("free once they finish") != std::string::npos);
  CHECK_FALSE(slots.unload(1).has_value());  // unloaded already
  slots.release(1);
  CHECK(slots.reserve() == 1);
  slots.fill(1);
  const auto idle = slots.unload(1);
  REQUIRE(idle.has_value());
  CHECK(*idle);  // reserved for the caller to empty
  CHECK_FALSE(slots.reserve().has_value());
  slots.give_back(1);
  CHECK(slots.reserve() == 1);
}
