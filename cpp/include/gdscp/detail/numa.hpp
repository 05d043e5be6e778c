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

// `size` bytes of anonymous memory whose pages are on `node` (preferred with
// mbind, then touched so they exist before a driver pins them); nullptr if
// the memory could not be mapped. Free with unmap_on_node.
void* map_on_node(size_t size, int node);
void unmap_on_node(void* p, size_t size) noexcept;

}  // namespace gdscp::detail
