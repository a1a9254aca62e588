#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "worker/comm/local_world.h"
#include "worker/comm/process_groups.h"

using namespace railyard::worker::comm;

TEST_CASE("rank grid: tensor fastest, then data, then pipeline") {
  Layout l{2, 2, 2};  // dp, tp, pp
  CHECK(rank_of(l, Coord{0, 0, 0}) == 0);
  CHECK(rank_of(l, Coord{0, 1, 0}) == 1);  // tp neighbour
  CHECK(rank_of(l, Coord{1, 0, 0}) == 2);  // dp neighbour
  CHECK(rank_of(l, Coord{0, 0, 1}) == 4);  // next stage
  for (int r = 0; r < 8; ++r) CHECK(rank_of(l, coord_of(l, r)) == r);
  CHECK(tp_group(l, 5) == std::vector<int>{4, 5});
  CHECK(dp_group(l, 5) == std::vector<int>{5, 7});
  CHECK(pp_group(l, 5) == std::vector<int>{1, 5});
  CHECK(embedding_group(l, 5) == std::vector<int>{1, 5});
  Layout deep{1, 1, 4};
  CHECK(embedding_group(deep, 0) == std::vector<int>{0, 3});
  CHECK(embedding_group(deep, 1).empty());
  CHECK(embedding_group(Layout{2, 1, 1}, 1) == std::vector<int>{1});
  Layout odd{3, 2, 1};
  CHECK(coord_of(odd, 5) == Coord{2, 1, 0});
  CHECK(dp_group(odd, 3) == std::vector<int>{1, 3, 5});
}

TEST_CASE("layout validation names the field") {
  CHECK_THROWS_WITH_AS(validate_layout(Layout{2, 3, 1}, 8),
                       "layout dp*tp*pp = 6 but WORLD_SIZE = 8: make the parallel "
                       "degrees multiply to the number of ranks",
                       railyard::ConfigError);
  CHECK_THROWS_WITH_AS(validate_layout(Layout{1, 0, 1}, 0), doctest::Contains("layout.tp = 0"), railyard::ConfigError);
  CHECK_NOTHROW(validate_layout(Layout{2, 2, 2}, 8));
}

namespace {

// Checks every group against the grid: a sum of world ranks over each group equals the sum of the ranks the grid
// says are in it.
void check_layout(const Layout& l) {
  std::atomic<int> done{0};
  run_local_world(l.world(), [&](Communicator& world) {
    ProcessGroups g(world, l);
    const int r = world.rank();
    CHECK(g.coord() == coord_of(l, r));
    CHECK(g.tp().size() == l.tp);
    CHECK(g.dp().size() == l.dp);
    CHECK(g.pp().size() == l.pp);
    CHECK(g.tp().rank() == g.coord().tp);
    CHECK(g.dp().rank() == g.coord().dp);
    CHECK(g.pp().rank() == g.coord().pp);
    auto sum_of = [](const std::vector<int>& v) {
      int64_t s = 0;
      for (int x : v) s += x;
      return s;
    };
    int64_t x = r;
    g.tp().all_reduce(&x, 1, DType::kInt64, ReduceOp::kSum);
    CHECK(x == sum_of(tp_group(l, r)));
    x = r;
    g.dp().all_reduce(&x, 1, DType::kInt64, ReduceOp::kSum);
    CHECK(x == sum_of(dp_group(l, r)));
    x = r;
    g.pp().all_reduce(&x, 1, DType::kInt64, ReduceOp::kSum);
    CHECK(x == sum_of(pp_group(l, r)));
    bool edge = g.first_stage() || g.last_stage();
    CHECK((g.embedding() != nullptr) == edge);
    if (g.embedding()) {
      x = r;
      g.embedding()->all_reduce(&x, 1, DType::kInt64, ReduceOp::kSum);
      CHECK(x == sum_of(embedding_group(l, r)));
      CHECK(g.embedding()->name() == "embedding");
    }
    CHECK(g.tp().name() == "tp");
    CHECK(g.dp().name() == "dp");
    CHECK(g.pp().name() == "pp");
    ++done;
  });
  CHECK(done.load() == l.world());
}

}  // namespace

TEST_CASE("process groups over real sockets for every layout in {1,2}^3, tp=4 and pp=4") {
  for (int dp : {1, 2}) {
    for (int tp : {1, 2}) {
      for (int pp : {1, 2}) {
        CAPTURE(dp);
        CAPTURE(tp);
        CAPTURE(pp);
        check_layout(Layout{dp, tp, pp});
      }
    }
  }
  check_layout(Layout{1, 4, 1});
  check_layout(Layout{1, 1, 4});
}

TEST_CASE("describe() is one line with coordinates and group members") {
  std::vector<std::string> lines(8);
  run_local_world(8, [&](Communicator& world) {
    ProcessGroups g(world, Layout{2, 2, 2});
    lines[static_cast<size_t>(world.rank())] = g.describe();
  });
  CHECK(lines[5] == "rank 5/8 dp=0/2 tp=1/2 pp=1/2 tp-group [4,5] dp-group [5,7] pp-group [1,5]");
  CHECK(lines[2] == "rank 2/8 dp=1/2 tp=0/2 pp=0/2 tp-group [2,3] dp-group [0,2] pp-group [2,6]");
}

TEST_CASE("a layout that does not match the world is refused on every rank") {
  CHECK_THROWS_WITH_AS(run_local_world(4,
                                       [&](Communicator& world) {
                                         ProcessGroups g(world, Layout{2, 1, 1});
                                       }),
                       doctest::Contains("WORLD_SIZE = 4"), railyard::ConfigError);
}
