// Where a GPU sits among the machine's NUMA nodes, and host memory placed on
// one node: pinned staging near its GPU, so that the page-cache copies into it
// and the GPU's DMA out of it do not cross the socket link. Read from sysfs and
// placed with mbind(2) through syscall(): no libnuma.
#pragma once

#include <cstddef>

namespace gdscp::detail {

// The NUMA node nearest GPU `ordinal` (its PCI device's numa_node in sysfs);
// -1 where the machine has one node, or sysfs does not say. Cached per GPU.
// GDSCP_SYSFS_ROOT (default /sys) lets tests give a machine of several nodes.
int gpu_numa_node(int ordinal);

// `size` bytes of anonymous memory, populated by the calling thread so that
// the pages exist before a driver pins them, on `node` where `node` >= 0
// (preferred with mbind); huge pages asked for from 2 MiB up. nullptr if the
// memory could not be mapped. Free with unmap_on_node.
void* map_on_node(size_t size, int node);
void unmap_on_node(void* p, size_t size) noexcept;

// Runs the calling thread on `node`'s CPUs (sysfs cpulist, within the
// process's own affinity) for the life of the object, then restores its
// affinity: a bulk job's worker for a GPU copies the page cache into that
// GPU's staging from the GPU's own socket. Nothing for node -1.
class NodeAffinity {
 public:
  explicit NodeAffinity(int node);
  ~NodeAffinity();
  NodeAffinity(const NodeAffinity&) = delete;
  NodeAffinity& operator=(const NodeAffinity&) = delete;
  bool bound() const noexcept { return bound_; }

 private:
  bool bound_ = false;
  unsigned char saved_[128] = {};  // the thread's cpu_set_t before (1024 CPUs)
};

}  // namespace gdscp::detail
