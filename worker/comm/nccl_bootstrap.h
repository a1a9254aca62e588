// The NCCL unique id's exchange through the generation's bootstrap store (docs/parallel.md "Bootstrap: the TCP
// store"). Free of NCCL headers: the id is opaque bytes here, so the protocol is tested on machines without a GPU.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "worker/comm/tcp_store.h"

namespace railyard::worker::comm {

// Rank 0 makes the id (make_id) and publishes it under `key` of the store, i.e. "<prefix>/<key>" with the
// generation's prefix "g<RAILYARD_GENERATION>", so the ranks of a restarted generation never read an old id. Every
// other rank waits for the key (at most the store's timeout: CommTimeout naming the key) and gets rank 0's bytes.
// Throws CommError when the value is not id_bytes long (a stray writer, or another NCCL version on rank 0), and
// std::invalid_argument when make_id returns another length.
std::vector<char> exchange_nccl_id(TcpStore& store, int rank, size_t id_bytes,
                                   const std::function<std::vector<char>()>& make_id,
                                   const std::string& key = "nccl_id");

}  // namespace railyard::worker::comm
