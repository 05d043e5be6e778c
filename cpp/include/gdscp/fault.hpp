// Test hook: make the Nth pread or pwrite of the process fail with a chosen
// errno, so tests can prove that mid-transfer failures surface cleanly; or make
// the next mapped read map its range 4 MiB too far (map_past_eof), so that at
// the end of a file its SIGBUS guard must catch the fault.
#pragma once

namespace gdscp::fault {

enum class Op { pread = 0, pwrite = 1, map_past_eof = 2 };

// After `skip` more successful calls of `op`, the next `count` calls fail with `err`.
void arm(Op op, long skip, long count, int err) noexcept;
void disarm() noexcept;
// Called by the POSIX backend before each system call; returns the errno to
// fail with, or 0.
int check(Op op) noexcept;

}  // namespace gdscp::fault
