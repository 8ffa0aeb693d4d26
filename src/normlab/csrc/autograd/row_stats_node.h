// The saved state that the backward nodes of LayerNorm, LayerNorm2d and GroupNorm share: the
// input x, the weight and the per-row statistics mean and rstd, released together once the
// backward has run (or the graph is freed).
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <mutex>

namespace normlab {

struct RowStatsNode : public torch::autograd::Node {
  torch::autograd::SavedVariable x_, w_, mean_, rstd_;

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    x_.reset_data();
    w_.reset_data();
    mean_.reset_data();
    rstd_.reset_data();
  }
};

}  // namespace normlab
