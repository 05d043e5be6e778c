// Host memory that a large read is about to fill, made ready before the copy.
// A destination never touched before (a fresh numpy.empty) is not mapped yet:
// every page the copy reaches faults, and the kernel zeroes it first. Mapped
// ahead of the copy, each task a stripe of it, the pages fault in parallel and
// the copies then run without faults: on a 2-core machine a hot 1 GiB file
// read into a fresh numpy.empty (2 MiB pages, which numpy asks for) at 2.4 GB/s
// against 1.1, into fresh 4 KiB pages at 1.75 against 1.24 (docs/performance.md,
// fresh host buffers). That holds for requests of a few tasks only: with 16
// or 32 tasks on an H200 host the pages faulted inside the copies (each zeroed
// page still in the CPU's cache when the copy fills it) made a fresh 4 GiB
// read 1.15-1.3x faster than mapping it ahead, so larger requests leave the
// faults to the copies. gdscp does not ask for huge pages itself: the allocator's
// choice stands, and on a machine short of free huge pages the kernel's
// compaction for them cost more than the faults they save.
#pragma once

#include <cstddef>

namespace gdscp::detail {

// Whether some of the `size` bytes at `dst` are not mapped yet (mincore on the
// first, middle and last whole page): false for memory already touched, and
// for a range too small to hold a whole page.
bool destination_unmapped(const char* dst, size_t size) noexcept;

// Maps the pages under [dst, dst + n) for writing (MADV_POPULATE_WRITE, Linux
// 5.14 and later). Mapping a page the copy is about to write changes nothing
// the caller can see; errors are ignored (the copy then faults as it would
// have), and so is a kernel without MADV_POPULATE_WRITE. Whether the pages
// were mapped.
bool populate_for_write(char* dst, size_t n) noexcept;

}  // namespace gdscp::detail
