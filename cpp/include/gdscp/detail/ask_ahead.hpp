// Asking the disk for a file range before it is read (POSIX_FADV_WILLNEED),
// the whole of it. Linux serves one such call only up to the larger of its
// device's largest request and its readahead window (queue/max_sectors_kb,
// read_ahead_kb) and drops the rest of a longer range without a word, so a
// longer range is asked in steps of that size.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace gdscp::detail {

// The most one WILLNEED call on a file of device `dev` (a stat's st_dev)
// reads ahead, in bytes: from sysfs, once per device; 128 KiB (the kernel's
// default readahead window, never above what it serves) where sysfs does
// not say, as for files whose device is not a block device of its own.
size_t readahead_step(dev_t dev);

// Asks the disk for [off, off + len) of `fd`, up to the file's end, in
// readahead_step() steps; the calls return once the reads are queued. Best
// effort: errors are ignored (the read that follows gets the data either way).
void ask_disk(int fd, int64_t off, size_t len);

}  // namespace gdscp::detail
