// Host-side launch plans of the CUDA kernels (worker/kernels/cuda/launch.h): pure functions, no GPU needed.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "worker/kernels/cuda/launch.h"

using namespace railyard::worker::cuda;

TEST_CASE("elementwise launches cover every element once and cap the grid") {
  CHECK(elementwise_launch(0).grid == 0);
  for (size_t n : {size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{1000000}}) {
    const Launch l = elementwise_launch(n);
    CHECK(l.block == 256);
    CHECK(static_cast<size_t>(l.grid) * l.block >= n);
    CHECK(static_cast<size_t>(l.grid - 1) * l.block < n);
  }
  // 124M parameters (AdamW over GPT-2 small): capped, the kernels grid-stride over the rest.
  const Launch big = elementwise_launch(size_t{124} * 1000 * 1000);
  CHECK(big.grid == kMaxElementwiseGrid);
}

TEST_CASE("row launches put one warp on each row") {
  const Launch l = rows_launch(8 * 1024 + 3);
  CHECK(l.block == kRowsPerBlock * kWarpSize);
  CHECK(l.grid == 1024 + 1);
  CHECK(rows_launch(0).grid == 0);
  CHECK(crossentropy_launch(4096).grid == 4096);
  CHECK_THROWS_AS(crossentropy_launch(size_t{1} << 32), std::invalid_argument);
  CHECK(columns_launch(768).grid == 3);
  CHECK(columns_launch(769).grid == 4);
  // Column sums: 32 columns a block, so a block's warps each read 32 consecutive floats of a row.
  CHECK(column_sums_launch(2304).grid == 72);
  CHECK(column_sums_launch(2305).grid == 73);
  CHECK(column_sums_launch(2304).block == 32u * kColumnSumRowLanes);
  CHECK(column_sums_launch(0).grid == 0);
}

TEST_CASE("layernorm backward plan: chunks and scratch") {
  const LayernormBackwardPlan p = layernorm_backward_plan(8 * 1024, 768);
  CHECK(p.chunks == 128);
  CHECK(p.partials_grid_y == 128);
  CHECK(p.partials.grid == 3);
  CHECK(p.scratch_floats == 2u * 128u * 768u);
  CHECK(layernorm_backward_plan(65, 4).chunks == 2);
  CHECK_THROWS_WITH_AS(layernorm_backward_plan(size_t{65536} * kLayernormRowsPerChunk, 8),
                       doctest::Contains("grid.y limit"), std::invalid_argument);
  CHECK_THROWS_AS(layernorm_backward_plan(10, 0), std::invalid_argument);
}

TEST_CASE("attention plan: GPT-2 small and its limits") {
  const AttentionPlan p = attention_plan(4, 1024, 768, 12);
  CHECK(p.head_size == 64);
  CHECK(p.per_lane == 2);
  CHECK(p.row_blocks == 128);
  CHECK(p.forward.grid == 4u * 12u * 128u);
  CHECK(p.forward.block == 256);
  CHECK(p.forward.smem_bytes == 2u * 32u * 64u * sizeof(float));
  CHECK(p.backward_dkv.smem_bytes == (2u * 32u * 64u + 64u) * sizeof(float));
  CHECK(p.lse_floats == 4u * 12u * 1024u);
  CHECK(p.backward_d.grid == 4u * 12u * 1024u / 8u);
  // Odd T and head size: partial tiles and partial lanes.
  const AttentionPlan q = attention_plan(1, 13, 3 * 33, 3);
  CHECK(q.head_size == 33);
  CHECK(q.per_lane == 2);
  CHECK(q.row_blocks == 2);
  // The largest head size held in registers, and shared memory under the 48 KiB static limit.
  const AttentionPlan r = attention_plan(1, 64, 128, 1);
  CHECK(r.per_lane == 4);
  CHECK(r.backward_dkv.smem_bytes <= 48u * 1024u);
  CHECK_THROWS_WITH_AS(attention_plan(1, 64, 258, 1), doctest::Contains("exceeds 128"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(attention_plan(1, 64, 770, 12), doctest::Contains("not a multiple of NH=12"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(attention_plan(0, 64, 768, 12), doctest::Contains("B must be positive"), std::invalid_argument);
}

TEST_CASE("cuBLASLt workspace by architecture") {
  CHECK(gemm_workspace_bytes(8) == 4u << 20);
  CHECK(gemm_workspace_bytes(9) == 32u << 20);
  CHECK(gemm_workspace_bytes(10) == 32u << 20);
}

TEST_CASE("AdamW constants follow the CPU optimizer's bias corrections") {
  const AdamWConstants c1 = adamw_constants(1e-3f, 0.9f, 0.95f, 0.1f, 1);
  CHECK(c1.step_size == doctest::Approx(1e-3 / 0.1).epsilon(1e-5));
  CHECK(c1.bc2_sqrt == doctest::Approx(std::sqrt(0.05)).epsilon(1e-5));
  CHECK(c1.decay == doctest::Approx(1.0 - 1e-4).epsilon(1e-7));
  const AdamWConstants c100 = adamw_constants(1e-3f, 0.9f, 0.95f, 0.0f, 100);
  CHECK(c100.step_size == doctest::Approx(1e-3 / (1.0 - std::pow(0.9, 100))).epsilon(1e-5));
  CHECK(c100.decay == 1.0f);
  CHECK_THROWS_WITH_AS(adamw_constants(1e-3f, 0.9f, 0.95f, 0.1f, 0), doctest::Contains("t must be >= 1"),
                       std::invalid_argument);
}

TEST_CASE("persistent bf16 weights: which GEMM weights read the copy") {
  const uintptr_t base = 0x10000;  // 256-byte aligned like cudaMalloc
  const size_t n = 1000;
  CHECK(weight_copy_offset(base, n, base, n) == 0);
  CHECK(weight_copy_offset(base, n, base + 8 * sizeof(float), 992) == 8);
  CHECK(weight_copy_offset(base, n, base + 4 * sizeof(float), 8) == -1);    // 8-byte offset in bf16
  CHECK(weight_copy_offset(base, n, base + 8 * sizeof(float), 993) == -1);  // runs past the end
  CHECK(weight_copy_offset(base, n, base - 8 * sizeof(float), 8) == -1);    // before the start
  CHECK(weight_copy_offset(base, n, base + 2, 8) == -1);                    // not on a float
  CHECK(weight_copy_offset(0, 0, base, 8) == -1);                           // no weights registered
  CHECK(weight_copy_offset(base, n, base + n * sizeof(float), 0) == -1);    // at the end: nothing to read
}

TEST_CASE("GELU_AUX_BIAS epilogue: bias and OC % 8, else the unfused fallback") {
  CHECK(gelu_aux_epilogue_ok(3072, true));
  CHECK_FALSE(gelu_aux_epilogue_ok(3072, false));
  CHECK_FALSE(gelu_aux_epilogue_ok(100, true));
  CHECK_FALSE(gelu_aux_epilogue_ok(0, true));
}

TEST_CASE("encoder backward: rows grouped by token in row order, and its launch") {
  // Replaying the grouping as the kernel does (each distinct token adds its rows in order into dwte) must give the CPU
  // loop's sums bit for bit: the same additions in the same order per element.
  const std::vector<int32_t> ids = {7, 3, 7, 0, 3, 3, 9, 7, 0, 12, 3};
  TokenRows tr;
  token_rows(ids.data(), ids.size(), tr);
  CHECK(tr.tokens == std::vector<int32_t>{0, 3, 7, 9, 12});
  CHECK(tr.starts == std::vector<int32_t>{0, 2, 6, 9, 10, 11});
  CHECK(tr.rows == std::vector<int32_t>{3, 8, 1, 4, 5, 10, 0, 2, 7, 6, 9});
  const int C = 3;
  std::vector<float> dout(ids.size() * C), cpu(13 * C, 0.5f), grouped = cpu;
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = std::sin(static_cast<float>(i) * 1.7f) * 1e3f + 1e-3f * i;
  for (size_t r = 0; r < ids.size(); ++r)
    for (int c = 0; c < C; ++c) cpu[ids[r] * C + c] += dout[r * C + c];
  for (size_t u = 0; u < tr.tokens.size(); ++u)
    for (int c = 0; c < C; ++c) {
      float acc = grouped[tr.tokens[u] * C + c];
      for (int32_t i = tr.starts[u]; i < tr.starts[u + 1]; ++i) acc += dout[tr.rows[i] * C + c];
      grouped[tr.tokens[u] * C + c] = acc;
    }
  CHECK(grouped == cpu);

  token_rows(ids.data(), 0, tr);  // no rows: nothing to launch, and the buffers are reused
  CHECK(tr.tokens.empty());
  CHECK(tr.starts == std::vector<int32_t>{0});
  const int32_t bad[] = {1, -2};
  CHECK_THROWS_AS(token_rows(bad, 2, tr), std::invalid_argument);

  const EncoderBackwardLaunch l = encoder_backward_launch(5, 768);
  CHECK(l.grid_x == 5);
  CHECK(l.grid_y * l.block >= 768);
  CHECK((l.grid_y - 1) * l.block < 768);
  CHECK(encoder_backward_launch(0, 768).grid_x == 0);
}

TEST_CASE("encoder backward grouping for a vocabulary-parallel rank: only ids in [lo, hi), relative to lo") {
  const std::vector<int32_t> ids = {5, 12, 6, 5, 20, 11, 6, 9};
  TokenRows tr;
  token_rows(ids.data(), ids.size(), tr, 5, 12);  // this rank holds vocabulary rows 5..11
  CHECK(tr.tokens == std::vector<int32_t>{0, 1, 4, 6});
  CHECK(tr.starts == std::vector<int32_t>{0, 2, 4, 5, 6});
  CHECK(tr.rows == std::vector<int32_t>{0, 3, 2, 6, 7, 5});
  token_rows(ids.data(), ids.size(), tr, 30, 40);  // none held
  CHECK(tr.tokens.empty());
  CHECK(tr.rows.empty());
  CHECK_THROWS_AS(token_rows(ids.data(), ids.size(), tr, 4, 4), std::invalid_argument);
}
