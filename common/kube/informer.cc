#include "common/kube/informer.h"

#include <algorithm>
#include <random>

#include "common/log.h"

namespace railyard::kube {

Informer::Informer(Client& client, Resource res, InformerOptions opts)
    : client_(client), res_(std::move(res)), opts_(std::move(opts)) {}

Informer::~Informer() { stop(); }

void Informer::on_add(AddFn fn) { add_fns_.push_back(std::move(fn)); }
void Informer::on_update(UpdateFn fn) { update_fns_.push_back(std::move(fn)); }
void Informer::on_delete(DeleteFn fn) { delete_fns_.push_back(std::move(fn)); }

void Informer::start() {
  if (thread_.joinable()) throw Error("informer for " + res_.plural + ": start() called twice");
  thread_ = std::thread([this] { run(); });
  if (opts_.resync_period.count() > 0) resync_thread_ = std::thread([this] { resync_loop(); });
}

void Informer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  stop_token_->stop();
  if (thread_.joinable()) thread_.join();
  if (resync_thread_.joinable()) resync_thread_.join();
}

bool Informer::wait_for_sync(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return synced_ || stopping_; }) && synced_;
}

bool Informer::has_synced() {
  std::lock_guard<std::mutex> lock(mu_);
  return synced_;
}

std::optional<Json> Informer::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) return std::nullopt;
  return *it->second;
}

std::shared_ptr<const Json> Informer::get_shared(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  return it == cache_.end() ? nullptr : it->second;
}

std::vector<Json> Informer::list() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Json> out;
  out.reserve(cache_.size());
  for (const auto& [k, v] : cache_) out.push_back(*v);
  return out;
}

std::vector<std::shared_ptr<const Json>> Informer::snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const Json>> out;
  out.reserve(cache_.size());
  for (const auto& [k, v] : cache_) out.push_back(v);
  return out;
}

std::vector<std::string> Informer::keys() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(cache_.size());
  for (const auto& [k, v] : cache_) out.push_back(k);
  return out;
}

size_t Informer::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.size();
}

std::string Informer::last_resource_version() {
  std::lock_guard<std::mutex> lock(mu_);
  return rv_;
}

int Informer::relists() {
  std::lock_guard<std::mutex> lock(mu_);
  return relists_;
}

int Informer::watch_restarts() {
  std::lock_guard<std::mutex> lock(mu_);
  return watch_restarts_;
}

bool Informer::sleep_interruptible(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [this] { return stopping_; });
}

namespace {
template <typename F>
void call_safely(const std::string& what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    log::error("kube.informer", "handler threw; continuing", {{"handler", what}, {"error", e.what()}});
  }
}
}  // namespace

void Informer::relist() {
  ListOptions lo;
  lo.label_selector = opts_.label_selector;
  lo.field_selector = opts_.field_selector;
  lo.limit = opts_.page_size;
  std::string rv;
  std::vector<Json> items = client_.list_all(res_, opts_.ns, lo, &rv);

  std::map<std::string, ObjPtr> fresh;
  for (auto& it : items) {
    // List items carry no apiVersion/kind; fill them so handlers see the same shape as from a watch.
    if (!it.contains("apiVersion")) it["apiVersion"] = res_.api_version();
    if (!it.contains("kind")) it["kind"] = res_.kind;
    if (opts_.drop_managed_fields && it.contains("metadata") && it["metadata"].is_object())
      it["metadata"].erase("managedFields");
    std::string k = key_of(it);
    fresh.emplace(std::move(k), std::make_shared<const Json>(std::move(it)));
  }
  items.clear();
  items.shrink_to_fit();
  std::vector<ObjPtr> added, deleted;
  std::vector<std::pair<ObjPtr, ObjPtr>> updated;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [k, obj] : fresh) {
      auto old = cache_.find(k);
      if (old == cache_.end()) {
        added.push_back(obj);
      } else if (resource_version_of(*old->second) != resource_version_of(*obj)) {
        updated.emplace_back(old->second, obj);
      } else {
        // Unchanged: keep the object already cached (the same content) and drop the fresh copy.
        obj = old->second;
      }
    }
    for (const auto& [k, obj] : cache_) {
      if (!fresh.count(k)) deleted.push_back(obj);
    }
    cache_ = std::move(fresh);
    rv_ = rv;
    ++relists_;
  }
  {
    std::lock_guard<std::mutex> hl(handler_mu_);
    for (const auto& o : deleted)
      for (auto& fn : delete_fns_) call_safely("delete", [&] { fn(*o); });
    for (const auto& o : added)
      for (auto& fn : add_fns_) call_safely("add", [&] { fn(*o); });
    // Not a structured binding: clang before 16 cannot capture those in a lambda (the RAILYARD_FUZZ build is clang).
    for (const auto& change : updated)
      for (auto& fn : update_fns_) call_safely("update", [&] { fn(*change.first, *change.second); });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    synced_ = true;
  }
  cv_.notify_all();
}

bool Informer::apply(WatchEvent& ev) {
  std::string rv = resource_version_of(ev.object);
  if (ev.type == WatchEvent::Type::Bookmark) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!rv.empty()) rv_ = rv;
    return true;
  }
  std::string k = key_of(ev.object);
  ObjPtr old;
  ObjPtr now;
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!rv.empty()) rv_ = rv;
    auto it = cache_.find(k);
    if (it != cache_.end()) old = it->second;
    if (ev.type == WatchEvent::Type::Deleted) {
      if (old) {
        cache_.erase(it);
        changed = true;
      }
    } else {
      // An event for a version we already hold (seen through a relist) is not delivered twice.
      changed = !old || resource_version_of(*old) != rv;
      if (changed) {
        now = std::make_shared<const Json>(std::move(ev.object));
        cache_[k] = now;
      }
    }
  }
  if (!changed) return true;
  std::lock_guard<std::mutex> hl(handler_mu_);
  if (ev.type == WatchEvent::Type::Deleted) {
    for (auto& fn : delete_fns_) call_safely("delete", [&] { fn(ev.object); });
  } else if (old) {
    for (auto& fn : update_fns_) call_safely("update", [&] { fn(*old, *now); });
  } else {
    for (auto& fn : add_fns_) call_safely("add", [&] { fn(*now); });
  }
  return true;
}

void Informer::run() {
  std::mt19937 rng(std::random_device{}());
  RetryPolicy bp;
  bp.initial_backoff = opts_.min_backoff;
  bp.max_backoff = opts_.max_backoff;
  int failures = 0;
  bool need_list = true;
  bool first_watch = true;
  const std::string what = res_.plural + (opts_.ns.empty() ? "" : " in " + opts_.ns);
  auto backoff = [&] {
    auto d = backoff_delay(bp, failures++, std::uniform_real_distribution<double>(0, 1)(rng));
    return sleep_interruptible(d);
  };
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    try {
      if (need_list) {
        relist();
        need_list = false;
        log::debug("kube.informer", "listed", {{"resource", what}, {"rv", last_resource_version()}});
      }
      WatchOptions wo;
      wo.resource_version = last_resource_version();
      wo.label_selector = opts_.label_selector;
      wo.field_selector = opts_.field_selector;
      wo.allow_bookmarks = true;
      wo.timeout_seconds = opts_.watch_timeout_seconds;
      wo.drop_managed_fields = opts_.drop_managed_fields;
      wo.stop = stop_token_;
      if (!first_watch) {
        std::lock_guard<std::mutex> lock(mu_);
        ++watch_restarts_;
      }
      first_watch = false;
      bool got_event = false;
      WatchEnd end = client_.watch(res_, opts_.ns, wo, [&](WatchEvent& ev) {
        got_event = true;
        return apply(ev);
      });
      if (end == WatchEnd::Stopped) return;
      if (got_event) failures = 0;
      // A stream that ends at once without events (server shutting down) should not spin.
      if (!got_event && !backoff()) return;
    } catch (const Gone& e) {
      log::info("kube.informer", "resource version expired, relisting", {{"resource", what}, {"error", e.what()}});
      need_list = true;
    } catch (const std::exception& e) {
      if (stop_token_->stopped()) return;
      log::warn("kube.informer", "list/watch failed, retrying", {{"resource", what}, {"error", e.what()}});
      if (!backoff()) return;
    }
  }
}

void Informer::resync_loop() {
  while (sleep_interruptible(std::chrono::duration_cast<std::chrono::milliseconds>(opts_.resync_period))) {
    std::vector<ObjPtr> objs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      objs.reserve(cache_.size());
      for (const auto& [k, v] : cache_) objs.push_back(v);
    }
    std::lock_guard<std::mutex> hl(handler_mu_);
    for (const auto& o : objs)
      for (auto& fn : update_fns_) call_safely("resync", [&] { fn(*o, *o); });
  }
}

}  // namespace railyard::kube
