// What the pod's peer holds of one rank's in-memory snapshots (docs/checkpointing.md "The peer copy"): a small
// shared-memory segment beside the rank's two slots, `<base>-held`, that the agent's peer sender
// (worker/agent/peer_copy.h) rewrites whenever the set of steps its peer acknowledged changes, and that the worker
// reads before a put. With it the worker never overwrites the only own snapshot that the peer also holds (Gemini's
// rule): after a node loss, the survivors' own slots and the lost ranks' peer copies then share a step, so the job
// restores from memory instead of the disk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace railyard::ckpt {

// "<base>-held" for a rank whose slots are base + "-a" and base + "-b" (ShmStore names: "/..."). Under the agent's
// prefix, so ShmStore::remove_prefix removes it with the slots.
std::string peer_held_name(const std::string& base);

// Records `steps` (at most two; -1 entries are dropped). Creates the segment when missing. A reader that races the
// write sees either the old or the new set, or nothing (the record carries a check word). Throws Error when the
// segment cannot be written.
void write_peer_held(const std::string& name, const std::vector<int64_t>& steps);

// The steps recorded, newest first; empty when the segment is missing, empty, or being written at that instant.
std::vector<int64_t> read_peer_held(const std::string& name);

}  // namespace railyard::ckpt
