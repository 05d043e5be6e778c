// Small reads of sysfs, shared by what the engine learns of the machine from
// it (NUMA nodes, a disk's request and readahead sizes).
#pragma once

#include <string>

namespace gdscp::detail {

// Where sysfs is: /sys, or GDSCP_SYSFS_ROOT where set (tests give a machine
// of their own making there).
std::string sysfs_root();

// The first word of a small sysfs file ("0-1", "3"); empty if it cannot be
// read.
std::string first_word(const std::string& path);

}  // namespace gdscp::detail
