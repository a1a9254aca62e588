#include "operator/rendezvous/silence.h"

#include <algorithm>

namespace railyard::op::silence {

namespace {

bool current(const Heard& h) { return !h.uid.empty() && h.uid == h.holder_uid; }

Clock::duration threshold(const Heard& h, std::chrono::milliseconds after) {
  return std::max<Clock::duration>(after, std::chrono::milliseconds(3 * h.heartbeat_ms));
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::vector<Silent> find_silent(const std::vector<Heard>& pods, Clock::time_point now,
                                Clock::time_point service_resumed, std::chrono::milliseconds after) {
  std::vector<Silent> out;
  if (after.count() <= 0) return out;
  for (const Heard& h : pods) {
    if (!current(h) || h.heartbeat_ms <= 0 || h.in_flight > 0 || h.exited) continue;
    const Clock::duration limit = threshold(h, after);
    const Clock::duration quiet = now - std::max(h.last, service_resumed);
    if (quiet < limit) continue;
    // A peer heard recently: the service runs and hears the job's pods, only this one is missing.
    const Heard* peer = nullptr;
    for (const Heard& q : pods) {
      if (&q == &h || q.pod == h.pod || !current(q)) continue;
      if (q.in_flight > 0 || now - q.last <= limit / 2) {
        if (!peer || q.last > peer->last) peer = &q;
      }
    }
    if (!peer) continue;
    out.push_back({h.pod, h.uid, seconds(now - h.last), peer->pod,
                   peer->in_flight > 0 ? 0.0 : seconds(now - peer->last), h.last});
  }
  return out;
}

}  // namespace railyard::op::silence
