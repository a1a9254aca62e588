// Launch configuration of the CUDA kernels, as pure host functions: grid and block sizes, tile counts, shared memory
// and scratch sizes. Kept apart from the kernels so they are unit-tested on machines without a GPU (CI), and so the
// kernels and their callers size buffers from one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace railyard::worker::cuda {

constexpr int kWarpSize = 32;
// Elementwise kernels: 256 threads, grid-stride loops, grid capped so huge tensors do not need 2^31 blocks.
constexpr int kElementwiseBlock = 256;
constexpr unsigned kMaxElementwiseGrid = 65536;
// Row kernels (layernorm, attention): one warp per row, this many warps per block.
constexpr int kRowsPerBlock = 8;
// Attention: keys (forward, dq) or queries (dk/dv) staged in shared memory per tile; one warp owns one row and each
// lane holds ceil(hs / 32) <= kMaxPerLane elements of it in registers.
constexpr int kAttentionTile = 32;
constexpr int kMaxPerLane = 4;  // head size <= 128
// Layernorm backward: dw/db are summed per chunk of rows into scratch, then the chunks in order (deterministic).
constexpr int kLayernormRowsPerChunk = 64;
// Global norm: one block of this many threads per chunk of the gradient (a power of two: tree reduction).
constexpr int kSumSquaresBlock = 256;
// Cross entropy: one block of this many threads per row.
constexpr int kCrossEntropyBlock = 256;

struct Launch {
  unsigned grid = 0;  // 0: nothing to do, the launcher returns without launching
  unsigned block = 0;
  size_t smem_bytes = 0;
};

constexpr size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// n elements, one thread each, grid-stride beyond kMaxElementwiseGrid blocks.
Launch elementwise_launch(size_t n);
// One warp per row.
Launch rows_launch(size_t rows);
// One block per row; throws std::invalid_argument when rows exceed the grid limit (2^31 - 1).
Launch crossentropy_launch(size_t rows);
// Column kernels (encoder/bias backward, layernorm dw/db reduction): one thread per column.
Launch columns_launch(size_t columns);

// encoder_backward's dwte without atomics and without one thread walking all N rows per channel: the rows grouped by
// token (a stable counting sort on the host, which has the token ids), then one thread per (distinct token, channel)
// adds that token's rows in row order, the CPU twin's order per element, so the same bits. rows: the N row indices
// grouped by token, ascending within a token; tokens: the distinct tokens, ascending; starts: tokens.size() + 1
// offsets into rows. `counts` is the sort's scratch (kept so repeated calls do not allocate).
struct TokenRows {
  std::vector<int32_t> rows, tokens, starts, counts;
};
// Only the rows whose id is in [lo, hi) (a vocabulary-parallel rank's rows), their tokens given as id - lo. Throws
// std::invalid_argument for a negative id or an empty range.
void token_rows(const int32_t* ids, size_t N, TokenRows& out, int32_t lo = 0,
                int32_t hi = std::numeric_limits<int32_t>::max());
// grid (distinct tokens, ceil(C / block)), kElementwiseBlock threads over the channels.
struct EncoderBackwardLaunch {
  unsigned grid_x = 0, grid_y = 0, block = 0;  // grid_x 0: nothing to do
};
EncoderBackwardLaunch encoder_backward_launch(size_t distinct_tokens, int C);

// Column sums (bias_backward): blocks of 32 columns x kColumnSumRowLanes row lanes; lane y sums rows y, y + lanes, ...
// and the lanes' partials are added in lane order (deterministic). grid = ceil(columns / 32), block = 32 * lanes.
constexpr int kColumnSumRowLanes = 16;
Launch column_sums_launch(size_t columns);

struct LayernormBackwardPlan {
  unsigned chunks = 0;  // row chunks of kLayernormRowsPerChunk
  Launch partials;      // grid.x over columns, chunks in grid.y (see partials_grid_y)
  unsigned partials_grid_y = 0;
  size_t scratch_floats = 0;  // 2 * chunks * C: dw partials, then db partials
};
LayernormBackwardPlan layernorm_backward_plan(size_t N, int C);

struct AttentionPlan {
  int head_size = 0;          // hs = C / NH
  int per_lane = 0;           // ceil(hs / 32)
  unsigned row_blocks = 0;    // ceil(T / kRowsPerBlock) per (b, h)
  Launch forward;             // grid B * NH * row_blocks, kRowsPerBlock warps, smem: K and V tiles
  Launch backward_dq;         // as forward
  Launch backward_dkv;        // grid as forward; smem: Q and dO tiles + lse and D of the tile's rows
  Launch backward_d;          // D = rowsum(dout * out), one warp per (b, h, t)
  size_t lse_floats = 0;      // B * NH * T, written by forward, read by backward
  size_t scratch_floats = 0;  // B * NH * T for D
};
// Throws std::invalid_argument naming the field when C is not a multiple of NH, the head size exceeds 128, or a
// dimension is not positive.
AttentionPlan attention_plan(int B, int Tn, int C, int NH);

// cuBLASLt workspace: 32 MiB on Hopper (sm_90+), 4 MiB before (NVIDIA's guidance for cuBLAS workspaces).
size_t gemm_workspace_bytes(int sm_major);

// Persistent bf16 weights (CudaKernels::set_weights): the element offset of a GEMM weight operand w[0, w_elems) in the
// fp32 parameter buffer base[0, base_elems), or -1 when w is not wholly inside it or its bf16 copy would start off
// cuBLASLt's 16-byte alignment (offset not a multiple of 8 elements; the copy itself is 256-byte aligned): then the
// weight is converted per GEMM as before. Addresses as integers so the rule is tested without a GPU.
int64_t weight_copy_offset(uintptr_t base, size_t base_elems, uintptr_t w, size_t w_elems);
// The GELU_AUX_BIAS epilogue (the pre-activation kept for backward) needs a bias and OC divisible by 8 (cuBLASLt's
// aux leading dimension); otherwise matmul_gelu_forward runs the GEMM and gelu_forward separately.
bool gelu_aux_epilogue_ok(int OC, bool has_bias);

// AdamW's per-step constants, the same arithmetic as worker/optim/adamw.cc (float, bias corrections via double pow).
struct AdamWConstants {
  float step_size = 0;  // lr / (1 - beta1^t)
  float bc2_sqrt = 0;   // sqrt(1 - beta2^t)
  float decay = 1;      // 1 - lr * weight_decay
};
AdamWConstants adamw_constants(float lr, float beta1, float beta2, float weight_decay, int64_t t);

}  // namespace railyard::worker::cuda
