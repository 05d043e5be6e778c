#include "gdscp/future.hpp"

#include <unistd.h>

#include <string>

#include "gdscp/detail/backend.hpp"
#include "gdscp/detail/request.hpp"
#include "gdscp/error.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp {

Future::Future(std::shared_ptr<detail::Request> req) : req_(std::move(req)), owner_(::getpid()) {}

std::unique_ptr<Future> Future::ready(size_t bytes) {
  auto req = std::make_shared<detail::Request>(1);
  req->task_done(bytes);
  auto future = std::make_unique<Future>(std::move(req));
  future->owner_ = 0;  // nothing runs: its lock is never held, in any process
  return future;
}

Future::~Future() {
  // In a forked child nothing will ever finish the tasks: waiting would hang.
  if (req_ && !forked()) req_->wait_for(-1);
}

bool Future::forked() const noexcept { return owner_ != 0 && owner_ != ::getpid(); }

void Future::require_owner() const {
  if (forked())
    throw_state("this transfer was started by process " + std::to_string(owner_) +
                " before it forked; its workers run there, not in this process (" + std::to_string(::getpid()) +
                "): wait for it in the process that started it, or start a new one here");
}

size_t Future::get() {
  require_owner();
  return req_->get();
}
bool Future::done() const {
  require_owner();
  return req_->done();
}
bool Future::wait_for(double seconds) const {
  require_owner();
  return req_->wait_for(seconds);
}
void Future::cancel() {
  if (forked()) return;  // the transfer is the parent's to cancel
  cancel_called_.store(true, std::memory_order_relaxed);
  req_->cancel();
}
bool Future::cancelled() const {
  require_owner();
  return cancel_called_.load(std::memory_order_relaxed) && req_->skipped();
}
size_t Future::progress() const { return req_->progress(); }

StreamFuture::StreamFuture(std::shared_ptr<const void> keep, const detail::Backend* backend, CUstream_st* stream,
                           CUctx_st* ctx, size_t ready_bytes, std::unique_ptr<detail::AsyncOp> op, CUevent_st* done)
    : keep_(std::move(keep)), backend_(backend), stream_(stream), ctx_(ctx), ready_bytes_(ready_bytes),
      op_(std::move(op)), done_(done) {}

StreamFuture::~StreamFuture() {
  const CudaDriver* drv = op_ || done_ ? CudaDriver::get() : nullptr;
  // The stream may still read or write *op_: it must run before op_ goes.
  if (op_ && !synced_ && drv) {
    try {
      ScopedContext scope(*drv, ctx_);
      synced_ = synchronize();
    } catch (...) {
    }
  }
  // Never asked: the outcome still settles (an append's range given back),
  // where the stream could be waited for.
  if (settle_ && !settled_ && (!op_ || synced_)) {
    try {
      settled_outcome();
    } catch (...) {
    }
  }
  if (done_ && drv) {
    try {
      ScopedContext scope(*drv, ctx_);
      drv->cuEventDestroy(done_);
    } catch (...) {
    }
  }
}

// Waits for the transfer, by its event where it has one, else by its stream
// (the destructor's wait: the stream's later work is not its business).
// Under the caller's ScopedContext.
bool StreamFuture::synchronize() const {
  const CudaDriver& drv = CudaDriver::require();
  return (done_ ? drv.cuEventSynchronize(done_) : drv.cuStreamSynchronize(stream_)) == CUDA_SUCCESS;
}

size_t StreamFuture::outcome() {
  if (!op_) return ready_bytes_;
  if (!synced_) {
    const CudaDriver& drv = CudaDriver::require();
    ScopedContext scope(drv, ctx_);
    if (done_) drv.check(drv.cuEventSynchronize(done_), "cuEventSynchronize");
    drv.check(drv.cuStreamSynchronize(stream_), "cuStreamSynchronize");
    synced_ = true;
  }
  return backend_->async_result(*op_);
}

size_t StreamFuture::check_bytes_done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return settled_outcome();
}

size_t StreamFuture::settled_outcome() {
  if (!settle_) return outcome();
  if (!settled_) {
    size_t moved = 0;
    try {
      moved = outcome();
    } catch (...) {
      if (!synced_) throw;  // the stream could not be waited for: nothing is known yet
      settled_error_ = std::current_exception();
    }
    settled_bytes_ = settle_(moved, settled_error_ != nullptr);
    settled_ = true;
  }
  if (settled_error_) std::rethrow_exception(settled_error_);
  return settled_bytes_;
}

}  // namespace gdscp
