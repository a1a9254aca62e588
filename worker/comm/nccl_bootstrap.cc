#include "worker/comm/nccl_bootstrap.h"

#include <stdexcept>

#include "worker/comm/communicator.h"

namespace railyard::worker::comm {

std::vector<char> exchange_nccl_id(TcpStore& store, int rank, size_t id_bytes,
                                   const std::function<std::vector<char>()>& make_id, const std::string& key) {
  if (rank == 0) {
    std::vector<char> id = make_id();
    if (id.size() != id_bytes) {
      throw std::invalid_argument("exchange_nccl_id: the id is " + std::to_string(id.size()) + " bytes, expected " +
                                  std::to_string(id_bytes));
    }
    store.set(key, id);
  }
  std::vector<char> got = store.get(key);  // rank 0 too: every rank uses what the store holds
  if (got.size() != id_bytes) {
    throw CommError("NCCL bootstrap: the store's " + store.prefix() + "/" + key + " holds " +
                    std::to_string(got.size()) + " bytes, an ncclUniqueId has " + std::to_string(id_bytes) +
                    " (another writer, or rank 0 runs another NCCL version)");
  }
  return got;
}

}  // namespace railyard::worker::comm
