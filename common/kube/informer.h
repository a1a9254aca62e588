// Informer: list + watch of one resource into a thread-safe cache keyed by "namespace/name", with handlers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/kube/client.h"

namespace railyard::kube {

struct InformerOptions {
  std::string ns{};  // "" for all namespaces (or a cluster-scoped resource)
  std::string label_selector{};
  std::string field_selector{};
  std::chrono::seconds resync_period{0};  // 0: no resync; else on_update(obj, obj) for every object each period
  int watch_timeout_seconds = 300;
  int64_t page_size = 500;
  // Cache objects without metadata.managedFields (as controller-runtime's TransformStripManagedFields does): a worker
  // pod is half as large, and every copy and parse of it half as dear.
  bool drop_managed_fields = true;
  std::chrono::milliseconds min_backoff{200};
  std::chrono::milliseconds max_backoff{10000};
};

// Handlers run on the informer's thread, one at a time, after the cache was updated; they get the cached object
// (const: copy what you keep) and must not block for long. Register them before start(). Objects from get()/list()
// are copies. After a relist (410 Gone,
// e.g. after an API-server restart) the informer delivers synthetic add/update/delete for the difference between
// the old cache and the new list, so handlers see every change once: no loss, no duplicates.
class Informer {
 public:
  using AddFn = std::function<void(const Json&)>;
  using UpdateFn = std::function<void(const Json& old_obj, const Json& new_obj)>;
  using DeleteFn = std::function<void(const Json&)>;

  Informer(Client& client, Resource res, InformerOptions opts = {});
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void on_add(AddFn fn);
  void on_update(UpdateFn fn);
  void on_delete(DeleteFn fn);

  void start();  // once
  void stop();   // prompt: interrupts the running watch; idempotent
  bool wait_for_sync(std::chrono::milliseconds timeout);
  bool has_synced();

  std::optional<Json> get(const std::string& key);
  std::shared_ptr<const Json> get_shared(const std::string& key);  // the cached object itself (null: none)
  std::vector<Json> list();
  // The cached objects themselves, shared and immutable: no copy (list() deep-copies every object). For readers that
  // only look, such as the operator's node inventory over every pod of the cluster.
  std::vector<std::shared_ptr<const Json>> snapshot();
  std::vector<std::string> keys();
  size_t size();
  std::string last_resource_version();
  int relists();         // completed lists (the first one included)
  int watch_restarts();  // watches started after the first

 private:
  void run();
  void resync_loop();
  void relist();
  bool apply(WatchEvent& ev);  // moves ev.object into the cache
  bool sleep_interruptible(std::chrono::milliseconds d);

  Client& client_;
  Resource res_;
  InformerOptions opts_;
  std::vector<AddFn> add_fns_;
  std::vector<UpdateFn> update_fns_;
  std::vector<DeleteFn> delete_fns_;

  std::mutex mu_;  // cache, rv, flags
  std::condition_variable cv_;
  // Immutable, shared objects: a relist's diff and the handlers hold pointers, not deep copies (10,000 pods are
  // about 280 MiB as nlohmann::json).
  using ObjPtr = std::shared_ptr<const Json>;
  std::map<std::string, ObjPtr> cache_;
  std::string rv_;
  bool synced_ = false;
  bool stopping_ = false;
  int relists_ = 0;
  int watch_restarts_ = 0;
  std::mutex handler_mu_;  // serialises handler calls between the watch and resync threads
  std::shared_ptr<StopToken> stop_token_ = std::make_shared<StopToken>();
  std::thread thread_;
  std::thread resync_thread_;
};

}  // namespace railyard::kube
