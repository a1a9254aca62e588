// The data helper's DataLoader (worker/data) as the trainer's BatchSource.
#pragma once

#include <memory>
#include <string>

#include "worker/data/data_loader.h"
#include "worker/train/trainer.h"

namespace railyard::worker {

class LoaderBatchSource : public BatchSource {
 public:
  explicit LoaderBatchSource(std::unique_ptr<DataLoader> loader) : loader_(std::move(loader)) {}
  void next_batch(int32_t* inputs, int32_t* targets) override { loader_->next_batch(inputs, targets); }
  void reset() override { loader_->reset(); }
  std::optional<LoaderState> loader_state() const override { return loader_->state(); }
  void restore_loader(const LoaderState& s) override { loader_->restore(s); }
  DataLoader& loader() { return *loader_; }

 private:
  std::unique_ptr<DataLoader> loader_;
};

}  // namespace railyard::worker
