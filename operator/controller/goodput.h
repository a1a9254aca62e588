// The goodput ledger (status.goodput; docs/observability.md "Where a job's time went"): the job's wall time since its
// creation, split into time training kept and time lost by cause. Kept in status, so it survives an operator restart
// and needs nothing in memory: every status write (Controller::write_status) adds the time since the ledger's `since`
// to the state the previous write recorded, then records the state the new status shows. A state change always
// changes status (phase, a condition, the step), so the ledger costs no write of its own.
//
// Pure: the status JSON in, the ledger JSON out, time passed in; unit-tested in tests/unit/operator/goodput_test.cc.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "common/goodput.h"
#include "operator/api.h"

namespace railyard::op::goodput {

using TimePoint = std::chrono::system_clock::time_point;

// The causes: common/goodput.h (status.goodput.seconds keys, shared with `railyard report`).
using railyard::goodput::kCauses;

// The ledger's state once the job has ended (Succeeded or Failed): it stops. Not "": the API server (1.20) takes an
// empty string in a custom resource's status for null and refuses it.
inline constexpr const char* kEnded = "ended";

// Where the time from now on goes, read from the status about to be written: one of kCauses, or kEnded.
std::string state_of(const Json& status);

// The ledger after a status write at `now`: `previous` is the status.goodput the job had (null or not an object: a
// new ledger, started at `created` while the job is in its first generation with no restart, else at `now`), `status`
// the status being written. A restart the ledger has not seen yet (status.restarts above its count) charges the time
// from the failed generation's last reported step (status.lastRestart.lastProgressTime) to `now` to detection, taken
// from that generation's training. A finished ledger is returned as it was; a job that ended without one gets none
// (null).
Json account(const Json& previous, const Json& status, TimePoint created, TimePoint now);

// What the current generation's workers reported (RendezvousService::Progress: the most of any rank, cumulative for
// its process): kept in the ledger by the status stage (`workers`), so that the next write moves what is new of it
// out of training (checkpointStall) and rendezvousAndInit (restore). No-op before the job has a ledger.
void note_worker_times(Json& status, int64_t generation, double checkpoint_stall_s, double restore_s);

}  // namespace railyard::op::goodput
