// One transformer layer's saved activations, llm.c's way: the sizes first (LayerActShape), then pointers into one
// buffer in a fixed order (take_layer_acts). The single table for Gpt (every layer in one process) and GptStage (a
// pipeline stage's layers, with tensor-parallel widths and sequence-parallel layernorm rows), so the element count
// an allocation reserves and the pointers carved out of it cannot drift apart.
#pragma once

#include <cstddef>

namespace railyard::worker {

struct LayerActShape {
  size_t ln_rows = 0;   // rows of the layernorm and residual regions: N = B*T, or N/tp with sequence parallelism
  size_t rows = 0;      // N: rows of qkv and of the attention output
  size_t C = 0;         // model width (layernorm, residual)
  size_t Cl = 0;        // width of attention and MLP on this rank: C, or C/tp with tensor parallelism
  size_t mlp_rows = 0;  // rows of fch/fch_gelu: N dense, E x capacity with experts (Gpt); 0 when kept elsewhere
  size_t experts = 0;   // E > 0: the router's probabilities (rows, E) and the experts' outputs (mlp_rows, C) too

  // ln1 (ln_rows,C), ln1 mean/rstd (ln_rows), qkv (rows,3Cl), atty (rows,Cl), res2 (ln_rows,C), ln2 (ln_rows,C),
  // ln2 mean/rstd (ln_rows), fch and fch_gelu (mlp_rows,4Cl) [, probs (rows,E), moe_y (mlp_rows,C)]. Dense, one
  // process: 15NC + 4N. Not counted: the layer's output (res3) and attention's saved state (`att`), which their
  // owners place themselves.
  size_t elements() const {
    return ln_rows * C + 2 * ln_rows + rows * 3 * Cl + rows * Cl + ln_rows * C + ln_rows * C + 2 * ln_rows +
           2 * mlp_rows * 4 * Cl + (experts > 0 ? rows * experts + mlp_rows * C : 0);
  }
};

template <typename T>
struct LayerActs {
  T *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
  T* probs = nullptr;  // experts only
  T* moe_y = nullptr;  // experts only
  T* att = nullptr;    // attention's saved state: placed by the owner (kept, or the shared working set)
};

// Points `la` into the buffer `take(n)` hands out, n elements at a time, in the order elements() counts them.
template <typename T, typename Take>
void take_layer_acts(LayerActs<T>& la, const LayerActShape& s, Take&& take) {
  la.ln1 = take(s.ln_rows * s.C);
  la.ln1_mean = take(s.ln_rows);
  la.ln1_rstd = take(s.ln_rows);
  la.qkv = take(s.rows * 3 * s.Cl);
  la.atty = take(s.rows * s.Cl);
  la.res2 = take(s.ln_rows * s.C);
  la.ln2 = take(s.ln_rows * s.C);
  la.ln2_mean = take(s.ln_rows);
  la.ln2_rstd = take(s.ln_rows);
  la.fch = take(s.mlp_rows * 4 * s.Cl);
  la.fch_gelu = take(s.mlp_rows * 4 * s.Cl);
  la.probs = s.experts > 0 ? take(s.rows * s.experts) : nullptr;
  la.moe_y = s.experts > 0 ? take(s.mlp_rows * s.C) : nullptr;
}

}  // namespace railyard::worker
