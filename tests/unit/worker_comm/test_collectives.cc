// Every collective of the Gloo backend against values computed here, for 1..4 ranks, fp32/bf16/int32/int64.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/bf16.h"
#include "worker/comm/communicator.h"
#include "worker/comm/local_world.h"

using namespace railyard::worker::comm;

namespace {

// Small integers and halves: exact in bf16 and in every partial sum, so results compare bitwise.
double value(int rank, size_t i) { return static_cast<double>((rank * 7 + static_cast<int>(i) * 3) % 23) * 0.5 - 3.0; }

template <typename T>
T as(double v) {
  return static_cast<T>(v);
}

template <typename T>
std::vector<T> fill(int rank, size_t n, size_t offset = 0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = as<T>(value(rank, i + offset));
  return v;
}
std::vector<uint16_t> fill_bf16(int rank, size_t n, size_t offset = 0) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float_to_bf16(static_cast<float>(value(rank, i + offset)));
  return v;
}

// The expected reduction of element i over ranks, in double, then cast the way the backend does.
double expect(int n, size_t i, ReduceOp op, bool integer) {
  double acc = op == ReduceOp::kMax ? -1e300 : 0;
  for (int r = 0; r < n; ++r) {
    double x = integer ? static_cast<double>(static_cast<int64_t>(value(r, i))) : value(r, i);
    acc = op == ReduceOp::kMax ? std::max(acc, x) : acc + x;
  }
  if (op == ReduceOp::kAvg) {
    acc = integer ? static_cast<double>(static_cast<int64_t>(acc) / n) : acc / n;
  }
  return acc;
}

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
const char* op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : op == ReduceOp::kAvg ? "avg" : "max"; }

}  // namespace

TEST_CASE("dtype names and sizes") {
  CHECK(dtype_size(DType::kFloat32) == 4);
  CHECK(dtype_size(DType::kBFloat16) == 2);
  CHECK(dtype_size(DType::kInt32) == 4);
  CHECK(dtype_size(DType::kInt64) == 8);
  CHECK(std::string(dtype_name(DType::kBFloat16)) == "bf16");
  CHECK(bf16_to_float(float_to_bf16(1.5f)) == 1.5f);
  CHECK(float_to_bf16(1.0f + 1.0f / 256) == float_to_bf16(1.0f));  // tie rounds to even
  CHECK(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
}

TEST_CASE("all_reduce sum/avg/max for fp32, bf16, int32, int64 on 1..4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    std::atomic<int> checked{0};
    run_local_world(n, [&](Communicator& c) {
      const int r = c.rank();
      CHECK(c.size() == n);
      CHECK(c.name() == "world");
      for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{300001}}) {
        for (ReduceOp op : kOps) {
          auto f = fill<float>(r, count);
          c.all_reduce(f.data(), count, DType::kFloat32, op);
          auto b = fill_bf16(r, count);
          c.all_reduce(b.data(), count, DType::kBFloat16, op);
          auto i32 = fill<int32_t>(r, count);
          c.all_reduce(i32.data(), count, DType::kInt32, op);
          auto i64 = fill<int64_t>(r, count);
          c.all_reduce(i64.data(), count, DType::kInt64, op);
          int bad = 0;
          for (size_t i = 0; i < count; ++i) {
            float ef = static_cast<float>(expect(n, i, op, false));
            if (f[i] != ef) ++bad;
            if (b[i] != float_to_bf16(ef)) ++bad;
            if (i32[i] != static_cast<int32_t>(expect(n, i, op, true))) ++bad;
            if (i64[i] != static_cast<int64_t>(expect(n, i, op, true))) ++bad;
          }
          INFO("count " << count << " op " << op_name(op) << " rank " << r);
          CHECK(bad == 0);
          ++checked;
        }
      }
    });
    CHECK(checked.load() == n * 4 * 3);
  }
}

TEST_CASE("bf16 all_reduce and reduce_scatter accumulate in fp32") {
  // 256 + 0.5 + 0.5 + 0.5 = 257.5 rounds to 258 in bf16 (ulp 2). Accumulating in bf16 from 256 upwards would lose
  // every 0.5 (256.5 rounds back to 256); chunks start their ring at different ranks, so some would start there.
  run_local_world(4, [&](Communicator& c) {
    const size_t count = 1000;
    std::vector<uint16_t> v(count, float_to_bf16(c.rank() == 0 ? 256.0f : 0.5f));
    c.all_reduce(v.data(), count, DType::kBFloat16, ReduceOp::kSum);
    CHECK(std::count(v.begin(), v.end(), float_to_bf16(258.0f)) == static_cast<long>(count));
    std::vector<uint16_t> in(count * 4, float_to_bf16(c.rank() == 0 ? 256.0f : 0.5f)), out(count);
    c.reduce_scatter(in.data(), out.data(), count, DType::kBFloat16, ReduceOp::kSum);
    CHECK(std::count(out.begin(), out.end(), float_to_bf16(258.0f)) == static_cast<long>(count));
  });
}

TEST_CASE("reduce_scatter sum/avg/max for fp32, bf16, int32, int64 on 1..4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    run_local_world(n, [&](Communicator& c) {
      const int r = c.rank();
      for (size_t count : {size_t{1}, size_t{5}, size_t{70000}}) {
        for (ReduceOp op : kOps) {
          const size_t total = count * static_cast<size_t>(n);
          auto f_in = fill<float>(r, total);
          std::vector<float> f(count);
          c.reduce_scatter(f_in.data(), f.data(), count, DType::kFloat32, op);
          auto b_in = fill_bf16(r, total);
          std::vector<uint16_t> b(count);
          c.reduce_scatter(b_in.data(), b.data(), count, DType::kBFloat16, op);
          auto i_in = fill<int32_t>(r, total);
          std::vector<int32_t> i32(count);
          c.reduce_scatter(i_in.data(), i32.data(), count, DType::kInt32, op);
          auto l_in = fill<int64_t>(r, total);
          std::vector<int64_t> i64(count);
          c.reduce_scatter(l_in.data(), i64.data(), count, DType::kInt64, op);
          int bad = 0;
          for (size_t i = 0; i < count; ++i) {
            size_t g = static_cast<size_t>(r) * count + i;
            float ef = static_cast<float>(expect(n, g, op, false));
            if (f[i] != ef) ++bad;
            if (b[i] != float_to_bf16(ef)) ++bad;
            if (i32[i] != static_cast<int32_t>(expect(n, g, op, true))) ++bad;
            if (i64[i] != static_cast<int64_t>(expect(n, g, op, true))) ++bad;
          }
          INFO("count " << count << " op " << op_name(op) << " rank " << r);
          CHECK(bad == 0);
        }
      }
    });
  }
}

TEST_CASE("reduce_scatter in place: out is chunk rank() of in") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    run_local_world(n, [&](Communicator& c) {
      const size_t count = 3001;
      auto buf = fill<float>(c.rank(), count * static_cast<size_t>(n));
      float* mine = buf.data() + static_cast<size_t>(c.rank()) * count;
      c.reduce_scatter(buf.data(), mine, count, DType::kFloat32, ReduceOp::kSum);
      int bad = 0;
      for (size_t i = 0; i < count; ++i) {
        size_t g = static_cast<size_t>(c.rank()) * count + i;
        if (mine[i] != static_cast<float>(expect(n, g, ReduceOp::kSum, false))) ++bad;
      }
      CHECK(bad == 0);
    });
  }
}

TEST_CASE("all_gather, in place and not, fp32 and bf16, on 1..4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    run_local_world(n, [&](Communicator& c) {
      const int r = c.rank();
      const size_t count = 1001;
      auto mine = fill<float>(r, count);
      std::vector<float> out(count * static_cast<size_t>(n), -99.0f);
      c.all_gather(mine.data(), out.data(), count, DType::kFloat32);
      std::vector<uint16_t> bout(count * static_cast<size_t>(n));
      auto bmine = fill_bf16(r, count);
      std::copy(bmine.begin(), bmine.end(), bout.begin() + static_cast<long>(static_cast<size_t>(r) * count));
      c.all_gather(bout.data() + static_cast<size_t>(r) * count, bout.data(), count, DType::kBFloat16);  // aliased
      int bad = 0;
      for (int j = 0; j < n; ++j) {
        auto want = fill<float>(j, count);
        auto bwant = fill_bf16(j, count);
        for (size_t i = 0; i < count; ++i) {
          if (out[static_cast<size_t>(j) * count + i] != want[i]) ++bad;
          if (bout[static_cast<size_t>(j) * count + i] != bwant[i]) ++bad;
        }
      }
      CHECK(bad == 0);
    });
  }
}

TEST_CASE("broadcast from every root, all_to_all, barrier on 1..4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    run_local_world(n, [&](Communicator& c) {
      const int r = c.rank();
      for (int root = 0; root < n; ++root) {
        auto v = fill<int64_t>(r, 333);
        c.broadcast(v.data(), v.size(), DType::kInt64, root);
        CHECK(v == fill<int64_t>(root, 333));
        auto b = fill_bf16(r, 17);
        c.broadcast(b.data(), b.size(), DType::kBFloat16, root);
        CHECK(b == fill_bf16(root, 17));
      }
      const size_t count = 5;
      // chunk j of rank r's input holds value(r, j*count + i); rank r's output chunk j must be rank j's chunk r.
      auto in = fill<float>(r, count * static_cast<size_t>(n));
      std::vector<float> out(in.size(), -1.0f);
      c.all_to_all(in.data(), out.data(), count, DType::kFloat32);
      int bad = 0;
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < count; ++i) {
          float want = static_cast<float>(value(j, static_cast<size_t>(r) * count + i));
          if (out[static_cast<size_t>(j) * count + i] != want) ++bad;
        }
      }
      CHECK(bad == 0);
      auto inplace = fill_bf16(r, count * static_cast<size_t>(n));
      c.all_to_all(inplace.data(), inplace.data(), count, DType::kBFloat16);
      for (int j = 0; j < n; ++j) {
        auto src = fill_bf16(j, count * static_cast<size_t>(n));
        for (size_t i = 0; i < count; ++i) {
          CHECK(inplace[static_cast<size_t>(j) * count + i] == src[static_cast<size_t>(r) * count + i]);
        }
      }
      c.barrier();
    });
  }
}

TEST_CASE("send/recv: ring exchange with tags, out-of-order waits, and bad peers rejected") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    run_local_world(n, [&](Communicator& c) {
      const int r = c.rank();
      const int right = (r + 1) % n, left = (r - 1 + n) % n;
      auto a = fill<float>(r, 4096);
      auto b = fill<float>(r + 10, 10);
      std::vector<float> ra(4096), rb(10);
      // Receive tag 2 before tag 1 is waited on: tags are separate streams.
      auto recv_b = c.irecv(rb.data(), rb.size(), DType::kFloat32, left, 2);
      auto recv_a = c.irecv(ra.data(), ra.size(), DType::kFloat32, left, 1);
      auto send_a = c.isend(a.data(), a.size(), DType::kFloat32, right, 1);
      c.send(b.data(), b.size(), DType::kFloat32, right, 2);
      recv_b->wait();
      recv_a->wait();
      send_a->wait();
      CHECK(ra == fill<float>(left, 4096));
      CHECK(rb == fill<float>(left + 10, 10));
      CHECK_THROWS_WITH_AS(c.isend(a.data(), 1, DType::kFloat32, r, 0), doctest::Contains("peer"),
                           std::invalid_argument);
      CHECK_THROWS_AS(c.irecv(a.data(), 1, DType::kFloat32, n, 0), std::invalid_argument);
      c.barrier();
    });
  }
}

TEST_CASE("split into disjoint groups and dup; groups are independent and name themselves") {
  run_local_world(4, [&](Communicator& c) {
    const int r = c.rank();
    std::vector<int> mine = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto pair = c.split(mine, "dp");
    CHECK(pair->size() == 2);
    CHECK(pair->rank() == r / 2);
    CHECK(pair->name() == "dp");
    float x = static_cast<float>(r);
    pair->all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
    CHECK(x == (r % 2 == 0 ? 2.0f : 4.0f));

    auto solo = c.split({r}, "solo");
    CHECK(solo->size() == 1);
    float y = 5;
    solo->all_reduce(&y, 1, DType::kFloat32, ReduceOp::kAvg);
    CHECK(y == 5.0f);

    auto copy = c.dup("bucket");
    CHECK(copy->size() == 4);
    CHECK(copy->rank() == r);
    int64_t z = r;
    copy->all_reduce(&z, 1, DType::kInt64, ReduceOp::kMax);
    CHECK(z == 3);
    auto nested = pair->dup("dp2");
    int32_t w = 1;
    nested->all_reduce(&w, 1, DType::kInt32, ReduceOp::kSum);
    CHECK(w == 2);

    CHECK_THROWS_WITH_AS(c.split({0, 0}, "bad"), doctest::Contains("ascending"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(c.split({(r + 1) % 4}, "bad"), doctest::Contains("do not contain"), std::invalid_argument);
  });
}

TEST_CASE("run_local_world rethrows the first failure and the other ranks fail fast") {
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(run_local_world(3,
                                    [&](Communicator& c) {
                                      if (c.rank() == 1) throw std::runtime_error("rank 1 gave up");
                                      float x = 1;
                                      c.all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
                                    }),
                    "rank 1 gave up");
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took < 10.0);  // the default deadline is 20 s: the others were released by the abort, not the timeout
}

TEST_CASE("a dup() used from a second thread runs concurrently with the original (bucket reducer pattern)") {
  run_local_world(3, [&](Communicator& c) {
    auto side = c.dup("bucket");
    const int n = c.size();
    int bad_main = 0, bad_side = 0;
    std::thread t([&] {
      for (int i = 0; i < 40; ++i) {
        std::vector<float> v(5000, static_cast<float>(c.rank() + i));
        side->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
        if (v[4999] != static_cast<float>(n * (n - 1) / 2 + n * i)) ++bad_side;
      }
    });
    for (int i = 0; i < 40; ++i) {
      int64_t x = c.rank() * 1000 + i;
      c.all_reduce(&x, 1, DType::kInt64, ReduceOp::kMax);
      if (x != (n - 1) * 1000 + i) ++bad_main;
    }
    t.join();
    CHECK(bad_main == 0);
    CHECK(bad_side == 0);
  });
}

TEST_CASE("a pending isend/irecv does not mix with a collective on the same communicator") {
  run_local_world(2, [&](Communicator& c) {
    const int peer = 1 - c.rank();
    std::vector<int32_t> out(100, c.rank() + 10), in(100, -1);
    auto r = c.irecv(in.data(), in.size(), DType::kInt32, peer, 9);
    auto s = c.isend(out.data(), out.size(), DType::kInt32, peer, 9);
    float x = 1;
    c.all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
    CHECK(x == 2.0f);
    r->wait();
    s->wait();
    CHECK(in == std::vector<int32_t>(100, peer + 10));
  });
}
