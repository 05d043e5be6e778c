#include "gdscp/detail/numa.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "gdscp/detail/host_destination.hpp"
#include "gdscp/detail/sysfs.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp::detail {
namespace {

// MPOL_PREFERRED of linux/mempolicy.h: the node's pages while it has free
// memory, others after (MPOL_BIND would fail the fault instead).
constexpr int kMpolPreferred = 1;
constexpr int kMaxNodes = 1024;
constexpr size_t kPageSize = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

// Calls range(lo, hi) for each part of a sysfs list ("0-15,32-47", "3").
template <class Range>
void for_each_range(const std::string& text, Range range) {
  for (size_t i = 0; i < text.size();) {
    const size_t comma = text.find(',', i);
    const std::string part = text.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
    const size_t dash = part.find('-');
    const int lo = std::atoi(part.c_str());
    range(lo, dash == std::string::npos ? lo : std::atoi(part.c_str() + dash + 1));
    if (comma == std::string::npos) break;
    i = comma + 1;
  }
}

// How many NUMA nodes are online ("0-1", "0,2-3"); 1 if sysfs does not say.
int online_nodes() {
  int count = 0;
  for_each_range(first_word(sysfs_root() + "/devices/system/node/online"),
                 [&](int lo, int hi) { count += hi >= lo ? hi - lo + 1 : 0; });
  return count > 0 ? count : 1;
}

int read_node(int ordinal) {
  const CudaDriver* drv = CudaDriver::get();
  if (!drv || online_nodes() < 2) return -1;
  CUdevice dev{};
  char bus[32] = {};
  if (drv->cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS || drv->cuDeviceGetPCIBusId(bus, sizeof bus, dev) != CUDA_SUCCESS)
    return -1;
  std::string id(bus);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string text = first_word(sysfs_root() + "/bus/pci/devices/" + id + "/numa_node");
  char* end = nullptr;
  const long node = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || node < 0 || node >= kMaxNodes) return -1;
  return static_cast<int>(node);
}

}  // namespace

int gpu_numa_node(int ordinal) {
  if (ordinal < 0) return -1;
  static std::mutex mutex;
  static std::vector<int> nodes;  // -2: not read yet
  std::lock_guard<std::mutex> lock(mutex);
  if (nodes.size() <= static_cast<size_t>(ordinal)) nodes.resize(ordinal + 1, -2);
  if (nodes[ordinal] == -2) nodes[ordinal] = read_node(ordinal);
  return nodes[ordinal];
}

void* map_on_node(size_t size, int node) {
  // Buffers of 2 MiB and more start on a 2 MiB boundary, so that the kernel
  // can back them with huge pages: fewer faults to populate, fewer pages for
  // the driver to pin.
  const size_t align = size >= kHugePage ? kHugePage : 0;
  const size_t len = size + align;
  void* raw = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* p = static_cast<char*>(raw);
  if (align) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(raw);
    p = reinterpret_cast<char*>((a + align - 1) & ~(uintptr_t{align} - 1));
    const size_t head = static_cast<size_t>(p - static_cast<char*>(raw));
    const size_t end = (size + kPageSize - 1) & ~(kPageSize - 1);
    if (head) ::munmap(raw, head);
    if (len - head > end) ::munmap(p + end, len - head - end);
    ::madvise(p, size, MADV_HUGEPAGE);  // best effort
  }
  if (node >= 0) {
    unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {};
    mask[node / (8 * sizeof(unsigned long))] = 1ul << (node % (8 * sizeof(unsigned long)));
    // Best effort: where the kernel refuses (no such node), the pages go
    // where the touching thread runs.
    ::syscall(SYS_mbind, p, size, kMpolPreferred, mask, static_cast<unsigned long>(kMaxNodes), 0u);
  }
  // The pages exist, on the node, before they are pinned: populated by this
  // (the calling worker's) thread, not inside the driver, where pinning is
  // serialised across threads.
  if (!populate_for_write(p, size)) std::memset(p, 0, size);
  return p;
}

void unmap_on_node(void* p, size_t size) noexcept {
  if (p) ::munmap(p, size);
}

namespace {

// The CPUs of `node` ("0-15,32-47"), within `allowed`; false if none.
bool node_cpus(int node, const cpu_set_t& allowed, cpu_set_t& out) {
  const std::string text = first_word(sysfs_root() + "/devices/system/node/node" + std::to_string(node) + "/cpulist");
  CPU_ZERO(&out);
  bool any = false;
  for_each_range(text, [&](int lo, int hi) {
    for (int c = std::max(lo, 0); c <= hi && c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) {
        CPU_SET(c, &out);
        any = true;
      }
  });
  return any;
}

}  // namespace

NodeAffinity::NodeAffinity(int node) {
  static_assert(sizeof(saved_) >= sizeof(cpu_set_t), "room for a cpu_set_t");
  if (node < 0) return;
  cpu_set_t before, want;
  if (::sched_getaffinity(0, sizeof before, &before) != 0) return;
  if (!node_cpus(node, before, want)) return;
  if (::sched_setaffinity(0, sizeof want, &want) != 0) return;
  std::memcpy(saved_, &before, sizeof before);
  bound_ = true;
}

NodeAffinity::~NodeAffinity() {
  if (!bound_) return;
  cpu_set_t before;
  std::memcpy(&before, saved_, sizeof before);
  ::sched_setaffinity(0, sizeof before, &before);
}

}  // namespace gdscp::detail
