// What the caller holds while bytes move: a Future for a parallel pread or
// pwrite, a StreamFuture for a transfer ordered on a CUDA stream.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

// CUstream and CUcontext without cuda.h: the same incomplete types it names.
struct CUstream_st;
struct CUctx_st;
struct CUevent_st;

namespace gdscp {

namespace detail {
class Backend;
class Request;
struct AsyncOp;
}  // namespace detail

// Destroying it waits for the request's tasks, which may still be writing into
// the caller's memory.
//
// A future belongs to the process that started its transfer. In a child
// forked meanwhile the workers running it do not exist (and the request's lock
// may have been copied held): there get(), done(), wait_for() and cancelled()
// throw an Error that says so, cancel() does nothing, and destruction does not
// wait. The parent's transfer runs on, untouched.
class Future {
 public:
  explicit Future(std::shared_ptr<detail::Request> req);
  // The future of a transfer that is already over (nothing to move, say).
  static std::unique_ptr<Future> ready(size_t bytes);
  ~Future();
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  // Waits for every task, then returns the bytes moved or throws the first failure.
  size_t get();
  bool done() const;
  // Waits up to `seconds` (negative: forever); true once every task has finished.
  bool wait_for(double seconds) const;
  // Tasks not yet started skip their I/O.
  void cancel();
  // Whether cancel() made the transfer skip part of its range: get() then
  // counts the bytes before the first piece skipped. False where it came
  // after every piece had started (the transfer is whole) or was not called.
  bool cancelled() const;
  // Bytes moved so far.
  size_t progress() const;

 private:
  // Throws unless this process started the transfer (see above).
  void require_owner() const;
  bool forked() const noexcept;

  std::shared_ptr<detail::Request> req_;
  pid_t owner_;  // 0: a transfer already over, which any process may ask about
  std::atomic<bool> cancel_called_{false};
};

// A raw_read_async/raw_write_async: either queued on the stream (`op`), or
// already run on the calling thread in stream order (`ready_bytes`). Any
// thread may ask it, several at once: the outcome is settled once.
class StreamFuture {
 public:
  // `keep` holds the open file (and `backend`) until the stream has run `op`.
  // `done` (owned from here; may be null) is an event recorded on the stream
  // just after `op` was queued, waited for before the stream itself: the
  // per-thread default stream names the calling thread's own stream, so only
  // an event finds the transfer from another thread.
  StreamFuture(std::shared_ptr<const void> keep, const detail::Backend* backend, CUstream_st* stream, CUctx_st* ctx,
               size_t ready_bytes, std::unique_ptr<detail::AsyncOp> op, CUevent_st* done = nullptr);
  ~StreamFuture();
  StreamFuture(const StreamFuture&) = delete;
  StreamFuture& operator=(const StreamFuture&) = delete;
  // Synchronises the stream (after the transfer's event, where it has one),
  // then returns the bytes moved or throws.
  size_t check_bytes_done();
  // Runs once the transfer's outcome is known (the first check_bytes_done(),
  // or destruction): given the bytes moved and whether it failed, it returns
  // the count to report (an append gives its range back here).
  void settle_with(std::function<size_t(size_t moved, bool failed)> settle) { settle_ = std::move(settle); }

 private:
  size_t outcome();
  size_t settled_outcome();
  bool synchronize() const;

  std::mutex mutex_;  // check_bytes_done() from several threads: one waits, then settles
  std::shared_ptr<const void> keep_;
  const detail::Backend* backend_;
  CUstream_st* stream_;
  CUctx_st* ctx_;
  size_t ready_bytes_;
  std::unique_ptr<detail::AsyncOp> op_;  // null: the transfer already ran
  CUevent_st* done_;
  bool synced_ = false;
  std::function<size_t(size_t, bool)> settle_;
  bool settled_ = false;
  size_t settled_bytes_ = 0;
  std::exception_ptr settled_error_;
};

}  // namespace gdscp
