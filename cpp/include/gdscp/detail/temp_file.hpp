// Temporary files beside a destination: `.NAME.XXXXXXXX.gdscp-tmp`, created
// with O_EXCL and held under an exclusive flock for as long as their writer
// has them open. A later run that can take the lock of such a file knows its
// writer is dead (killed, or the machine went down), so the file is garbage,
// never data: it is removed (clean_temporaries).
//
// Where the filesystem makes unnamed files (O_TMPFILE) and the process may
// link them, a new destination's temporary file has no name at all until it
// is linked into place: nothing to lock, nothing left behind by a killed run,
// and a name less to make and to rename per file.
//
// A temporary file is made, renamed, linked and removed through a descriptor
// of its directory, held from the moment the file is made: a directory moved
// (or removed) while the file is written takes the file along, and the file
// is still removed there; it is never put in place in a directory that its
// destination's path no longer leads to.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gdscp::detail {

inline constexpr std::string_view kTempSuffix = ".gdscp-tmp";

// The directory of `path` as a temporary file beside it lands in: "." for a
// bare name, "/" for a file at the root.
std::string dir_of(const std::string& path);

// The last component of `path` (all of it for a bare name).
std::string_view base_of(std::string_view path);

// Whether `name` (a file name, no directory) is one of ours.
bool is_temporary_name(std::string_view name);

// A new temporary name beside `dst` (not made): ".NAME." + 8 random
// characters + the suffix, NAME cut short (to nothing if need be) so that
// the name stays within NAME_MAX and the path within PATH_MAX.
std::string temporary_name(const std::string& dst);

// Throws EACCES ("cannot overwrite") when `dst` exists and this process may
// not write to it. cp writes into an existing file, which a file without
// write permission refuses (to all but root); a temporary file renamed over
// it would replace it all the same.
void check_replaceable(const std::string& dst);

// A descriptor (O_PATH) of a directory temporary files are made in, and what
// the directory was as it was opened; shared by the files made there at once.
struct HeldDirectory;

class TempFile {
 public:
  TempFile() = default;
  // A new, empty, locked temporary file beside `dst`, created with `mode`
  // (less the umask); throws.
  explicit TempFile(const std::string& dst, unsigned mode = 0600);
  // An unnamed temporary file in `dst`'s directory where the filesystem and
  // the kernel allow it, else a named one as above; throws.
  static TempFile unnamed(const std::string& dst, unsigned mode);
  ~TempFile() { discard(); }
  TempFile(TempFile&& o) noexcept { *this = std::move(o); }
  TempFile& operator=(TempFile&& o) noexcept;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const noexcept { return fd_; }
  // Empty while unnamed. Where no temporary path beside the destination fits
  // within PATH_MAX, one through its directory's descriptor
  // (/proc/self/fd/N/NAME), which is good while this object holds the file.
  // A path beside the destination leads to the file only while the directory
  // stays where it was.
  const std::string& path() const noexcept { return path_; }
  bool through_directory() const noexcept { return through_dir_; }
  dev_t device() const noexcept { return dev_; }  // the filesystem it is on
  explicit operator bool() const noexcept { return fd_ >= 0; }

  // Renames it over `dst` (an unnamed one: links it there, or where `dst`
  // exists, names it beside `dst` and renames it over); it is no longer
  // temporary (the descriptor stays open, and locked, until close()).
  // Refused, the file left as it is, where `dst`'s directory is no longer
  // the one the file was made in (directory_moved).
  void rename_to(const std::string& dst);
  // Links it at `dst` only if nothing is there, then removes the temporary
  // name; false (nothing changed) when `dst` exists. Where the filesystem has
  // no hard links: checks, then renames (a small window). Refused as
  // rename_to is.
  bool link_to(const std::string& dst);
  // Whether the path of `dst`'s directory no longer leads to the directory
  // this file was made in: it was moved or removed meanwhile (or something
  // on the way to it was).
  bool directory_moved(const std::string& dst) const noexcept;
  // A new descriptor, open for reading (to fsync it), of the directory this
  // file was made in, wherever that directory is now; -1 with errno.
  int open_directory() const noexcept;
  // A new descriptor (O_PATH) of that directory, which the caller owns; -1
  // with errno.
  int dup_directory() const noexcept;
  // Closes the descriptor (and so drops the lock); the name is left as it is.
  void close() noexcept;
  // Removes the temporary name, if it is still there, from the directory the
  // file was made in (wherever that directory is now), and closes.
  void discard() noexcept;
  // The descriptor, which the caller now owns (with the lock); the name stays
  // (a path through_directory() no longer reaches it).
  int release() noexcept;

 private:
  int fd_ = -1;
  std::shared_ptr<const HeldDirectory> dir_;  // the directory it was made in
  dev_t dev_ = 0;
  std::string name_;  // its name in dir_, while named
  std::string path_;
  bool through_dir_ = false;  // path_ goes through the directory's descriptor
  bool named_ = false;        // `name_` still names the file
  bool unnamed_ = false;      // an O_TMPFILE file not linked anywhere yet

  // Links the unnamed file at `name` in its directory: 0, or -1 with errno
  // (EEXIST where something is there).
  int link_at(const std::string& name) const noexcept;
  // Names the file `full` (a path beside its destination, temporary_name's):
  // its name in the directory, and a path that reaches it (full, or where
  // that does not fit within PATH_MAX, one through the directory's descriptor).
  void take_name(const std::string& full);
  // Throws where `dst`'s directory is not the one the file was made in.
  void check_directory(const std::string& dst) const;
  void create(const std::string& dst, unsigned mode);  // the constructor's work
};

// The error of a file not put in place because its destination directory was
// moved or removed `during` ("the copy", "the write") the transfer (errno
// ENOENT, naming `dst`).
[[noreturn]] void throw_directory_moved(const std::string& dst, std::string_view during);

// A file as the filesystem knows it, however its path is spelled: the device
// and inode of its directory entry (lstat's, a symbolic link's own).
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
};

// The FileId of `path`; false where it cannot be looked up.
bool file_id(const std::string& path, FileId& id);

// Removes the dead writers' temporary files in `dir`, but for the files in
// `keep` (files a job reads); returns how many.
size_t clean_temporaries(const std::string& dir, const std::vector<FileId>& keep = {});

}  // namespace gdscp::detail
