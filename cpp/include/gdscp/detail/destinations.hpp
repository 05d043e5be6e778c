// Which destinations of a job are one file: where each one's bytes land, found
// before anything is written (two items writing one file would both report
// done while only one's bytes remained, or their bytes would interleave).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace gdscp::detail {

// (earlier, later) for each of `paths` that lands where an earlier one does.
// A destination is its directory as the filesystem knows it (device and
// inode: "a/../b" and a link to a directory are found) and its last
// component. Where `follow[i]`, an existing symbolic link there counts also as
// the file it points at, which a write through it replaces; a FIFO or device
// (which is written in place), and with `in_place` any existing file, counts
// also as its own device and inode (two names of one file written in place).
std::vector<std::pair<size_t, size_t>> same_destinations(const std::vector<std::string>& paths,
                                                         const std::vector<bool>& follow, bool in_place);

}  // namespace gdscp::detail
