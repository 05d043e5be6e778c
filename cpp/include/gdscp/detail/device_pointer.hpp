// What a buffer address is: host memory, or device memory with the context
// that I/O into it must run under.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace gdscp::detail {

struct MemoryTarget {
  bool device = false;      // false: plain or pinned host memory, the CPU may touch it
  CUcontext ctx = nullptr;  // for device memory
  int ordinal = -1;         // the GPU the memory lives on
  bool managed = false;
  // Host memory not yet mapped (host_destination.hpp): a read's tasks map the
  // pages of each chunk before copying into it, up to this many bytes from the
  // start of the buffer (what the file holds; never more than the request).
  size_t populate_bytes = 0;
};

// For an address the caller says is device memory: its GPU and context. The
// pointer's own context if it has one, else the current context if it is on
// the same GPU, else that GPU's primary context. Pinned host memory resolves to
// host. Throws a clear error for an address CUDA does not know.
MemoryTarget resolve_device_pointer(uintptr_t ptr);

// The GPU's primary context, retained once for the life of the process.
CUcontext primary_context(int ordinal);

// Lets `from`'s context reach `to`'s memory directly (cuCtxEnablePeerAccess,
// once per pair of contexts for the process); false where the two GPUs
// cannot (no NVLink or PCIe peer to peer between them) or are the same.
bool enable_peer_access(const MemoryTarget& from, const MemoryTarget& to);

}  // namespace gdscp::detail
