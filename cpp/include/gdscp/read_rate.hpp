// A benchmark ceiling: how fast plain threads pread hot files into buffers of
// their own, with nothing between the reads (no Python, no GPU copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gdscp {

// One read of a ceiling run: `length` bytes at `offset` of fds[file].
struct ReadPiece {
  size_t file = 0;
  int64_t offset = 0;
  size_t length = 0;
};

struct ReadRun {
  double seconds = 0;  // from the threads' release to the last read's end
  uint64_t bytes = 0;  // what the reads returned, short reads included
  int error = 0;       // the first errno of a failed pread, else 0
};

// One thread per buffer, each reading the next piece (from one counter) into
// its own buffer of at least the longest piece's length, until none is left.
// The threads are made and waiting before the clock starts.
ReadRun timed_preads(const std::vector<int>& fds, const std::vector<ReadPiece>& pieces,
                     const std::vector<char*>& buffers);

}  // namespace gdscp
