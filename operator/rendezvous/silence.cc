#include "operator/rendezvous/silence.h"

#include <algorithm>

namespace railyard::op::silence {

namespace {

bool current(const Heard& h) { return !h.uid.empty() && h.uid == h.holder_uid; }

bool corroborated(const Heard& h, Clock::time_point peer_lost) {
  return peer_lost != Clock::time_point{} && peer_lost > h.last;
}

Clock::duration threshold(const Heard& h, std::chrono::milliseconds after, bool corroborated) {
  return std::max<Clock::duration>(corroborated ? after / 2 : after, std::chrono::milliseconds(3 * h.heartbeat_ms));
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::vector<Silent> find_silent(const std::vector<Heard>& pods, Clock::time_point now,
                                Clock::time_point service_resumed, std::chrono::milliseconds after,
                                Clock::time_point peer_lost) {
  std::vector<Silent> out;
  if (after.count() <= 0) return out;
  // The two most recently heard pods that hold their names (a request in flight counts as heard now): every pod's
  // freshest peer is one of them. One pass: a job of thousands of pods costs linear time per look, never quadratic.
  const auto heard_at = [&](const Heard& q) { return q.in_flight > 0 ? now : q.last; };
  const Heard* first = nullptr;
  const Heard* second = nullptr;
  for (const Heard& q : pods) {
    if (!current(q)) continue;
    if (!first || heard_at(q) > heard_at(*first)) {
      second = first;
      first = &q;
    } else if (!second || heard_at(q) > heard_at(*second)) {
      second = &q;
    }
  }
  for (const Heard& h : pods) {
    if (!current(h) || h.heartbeat_ms <= 0 || h.in_flight > 0 || h.exited) continue;
    const bool agree = corroborated(h, peer_lost);
    const Clock::duration limit = threshold(h, after, agree);
    const Clock::duration quiet = now - std::max(h.last, service_resumed);
    if (quiet < limit) continue;
    // A peer heard recently: the service runs and hears the job's pods, only this one is missing.
    const Heard* peer = first == &h ? second : first;
    if (!peer || peer->pod == h.pod || now - heard_at(*peer) > limit / 2) continue;
    out.push_back({h.pod, h.uid, seconds(now - h.last), peer->pod, seconds(now - heard_at(*peer)), h.last, agree});
  }
  return out;
}

}  // namespace railyard::op::silence
