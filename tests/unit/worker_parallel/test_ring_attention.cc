// Context parallelism's ring attention (worker/parallel/ring_attention.h) over real Gloo sockets against the
// single-process CPU attention kernel on the whole sequence: cp = 1, 2, 4 ranks, each holding T/cp positions of every
// sequence; the outputs and d(qkv) of every position agree within 1e-5 relative (max-norm; the online softmax and the
// ring order of the d(keys)/d(values) sums round differently from the kernel's full-row softmax).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "worker/comm/local_world.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/parallel/ring_attention.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
namespace comm = railyard::worker::comm;

namespace {

constexpr int kB = 2, kT = 16, kC = 32, kNH = 4;

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return d / m;
}

}  // namespace

TEST_CASE("ring attention over cp = 1, 2, 4 ranks equals full causal attention, forward and backward") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);  // wide enough that the softmax is far from uniform
  std::vector<float> qkv(static_cast<size_t>(kB) * kT * 3 * kC), dout(static_cast<size_t>(kB) * kT * kC);
  for (float& x : qkv) x = u(rng);
  for (float& x : dout) x = u(rng);
  // reference: the kernel the model uses, on the whole sequence
  ThreadPool pool(1);
  std::vector<float> ref_out(dout.size()), att(static_cast<size_t>(kB) * kNH * kT * kT), scratch(kT * kT),
      ref_dqkv(qkv.size(), 0.0f);
  cpu::attention_forward(pool, ref_out.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
  cpu::attention_backward(pool, ref_dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), kB, kT, kC, kNH);

  for (int cp : {1, 2, 4}) {
    CAPTURE(cp);
    const int Tc = kT / cp;
    std::vector<float> out(ref_out.size()), dqkv(qkv.size());
    std::vector<size_t> sent(cp);
    std::mutex mu;
    comm::run_local_world(cp, [&](comm::Communicator& world) {
      const int r = world.rank();
      ThreadPool p(1);
      // this rank's positions [r Tc, (r+1) Tc) of every sequence
      auto slice = [&](const std::vector<float>& full, int width) {
        std::vector<float> local(static_cast<size_t>(kB) * Tc * width);
        for (int b = 0; b < kB; ++b) {
          std::memcpy(local.data() + static_cast<size_t>(b) * Tc * width,
                      full.data() + (static_cast<size_t>(b) * kT + r * Tc) * width, Tc * width * sizeof(float));
        }
        return local;
      };
      const std::vector<float> lq = slice(qkv, 3 * kC), ld = slice(dout, kC);
      std::vector<float> lo(static_cast<size_t>(kB) * Tc * kC), lse(static_cast<size_t>(kB) * kNH * Tc), ldq(lq.size());
      RingAttention ring(cp == 1 ? nullptr : &world, kB, Tc, kC, kNH, p);
      ring.forward(lq.data(), lo.data(), lse.data());
      ring.backward(ld.data(), lq.data(), lo.data(), lse.data(), ldq.data());
      std::lock_guard<std::mutex> lock(mu);
      sent[r] = ring.forward_bytes_sent();
      for (int b = 0; b < kB; ++b) {
        std::memcpy(out.data() + (static_cast<size_t>(b) * kT + r * Tc) * kC,
                    lo.data() + static_cast<size_t>(b) * Tc * kC, Tc * kC * sizeof(float));
        std::memcpy(dqkv.data() + (static_cast<size_t>(b) * kT + r * Tc) * 3 * kC,
                    ldq.data() + static_cast<size_t>(b) * Tc * 3 * kC, Tc * 3 * kC * sizeof(float));
      }
    });
    CHECK(rel_err(out, ref_out) <= 1e-5);
    CHECK(rel_err(dqkv, ref_dqkv) <= 1e-5);
    // the ring moves every other block's keys and values once: (cp - 1) hops of B Tc 2C floats
    for (size_t s : sent) CHECK(s == static_cast<size_t>(cp - 1) * kB * Tc * 2 * kC * sizeof(float));
  }
}

TEST_CASE("ring attention: a wrong causal mask would be caught (the check can fail)") {
  // Attending to the future changes the output: the same comparison against a non-causal result fails.
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> qkv(static_cast<size_t>(kB) * kT * 3 * kC);
  for (float& x : qkv) x = u(rng);
  ThreadPool pool(1);
  std::vector<float> out(static_cast<size_t>(kB) * kT * kC), lse(static_cast<size_t>(kB) * kNH * kT);
  RingAttention ring(nullptr, kB, kT, kC, kNH, pool);
  ring.forward(qkv.data(), out.data(), lse.data());
  // row 0 attends only to itself: its output is exactly its own value vector
  for (int h = 0; h < kNH; ++h) {
    for (int c = 0; c < kC / kNH; ++c) CHECK(out[h * (kC / kNH) + c] == qkv[2 * kC + h * (kC / kNH) + c]);
  }
}
