// The recompute modes' one spelling (common/recompute.h), which the operator, the planner and the worker all use.
#include "common/recompute.h"

#include <doctest/doctest.h>

#include <string>

using railyard::Recompute;

TEST_CASE("recompute modes round-trip through their spellings, and nothing else parses") {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    CHECK(railyard::recompute_from_string(railyard::to_string(r)) == r);
  CHECK(std::string(railyard::to_string(Recompute::kSelective)) == "selective");
  for (const char* bad : {"", "Full", "selective ", "all", "off"})
    CHECK_FALSE(railyard::recompute_from_string(bad).has_value());
  static_assert(railyard::recompute_from_string("full") == Recompute::kFull);  // usable at compile time
}
