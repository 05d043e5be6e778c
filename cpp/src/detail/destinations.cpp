#include "gdscp/detail/destinations.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace gdscp::detail {
namespace {

// From this many names in one directory, its entries are read once (a few
// system calls for dozens of names) instead of each name looked up: a
// name that is no entry, or a regular file's, needs nothing more.
constexpr size_t kListFrom = 8;
// A directory read stops (its names looked up one by one after all) past
// this many entries for each name of it: a huge directory that a job writes
// a few files into is not read whole.
constexpr size_t kEntriesPerName = 8;

// Where a file's bytes land: a name in a directory (kind 0: the directory by
// device and inode; kind 1: by its text, where it cannot be looked up), or
// a file itself (kind 2: device and inode).
struct Place {
  int kind = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string name;
  bool operator<(const Place& o) const {
    return std::tie(kind, dev, ino, name) < std::tie(o.kind, o.dev, o.ino, o.name);
  }
};

struct Folder {
  std::string text;  // as the paths spell it, "." or "/" first
  size_t names = 0;  // how many of the paths are in it
  bool looked_up = false;
  Place place;       // its own identity (name empty, or its text for kind 1)
  // Read: `odd` holds the entries that may be more than a name (a link,
  // a FIFO, a device, a directory, or of a type the listing does not say).
  bool listed = false;
  std::unordered_set<std::string> odd;
};

// The components of `path`: "." and empty ones dropped, ".." left for a
// directory's lookup to resolve.
std::vector<std::string_view> components(std::string_view path) {
  std::vector<std::string_view> parts;
  for (size_t at = 0; at <= path.size();) {
    size_t end = path.find('/', at);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(at, end - at);
    if (!part.empty() && part != ".") parts.push_back(part);
    at = end + 1;
  }
  return parts;
}

// `path` cut into its directory, as text ("." or "/" first), and its last component.
std::pair<std::string, std::string> split(const std::string& path) {
  const std::vector<std::string_view> parts = components(path);
  std::string folder = path.compare(0, 1, "/") == 0 ? "/" : ".";
  for (size_t k = 0; k + 1 < parts.size(); ++k) {
    if (folder.back() != '/') folder += '/';
    folder += parts[k];
  }
  return {std::move(folder), parts.empty() ? std::string() : std::string(parts.back())};
}

std::string current_dir() {
  std::string out;
  if (char* here = ::getcwd(nullptr, 0)) {
    out = here;
    std::free(here);
  }
  return out;
}

void look_up(Folder& f, bool list) {
  f.looked_up = true;
  struct stat st {};
  if (::stat(f.text.c_str(), &st) != 0) {  // not there (the item fails on its own), or not reachable
    // Known by its text, however spelled: from the root, one "/" after each component.
    f.place = {1, 0, 0, "/"};
    const std::string full = f.text[0] == '/' ? f.text : current_dir() + "/" + f.text;
    for (const std::string_view part : components(full)) {
      f.place.name += part;
      f.place.name += '/';
    }
    return;
  }
  f.place = {0, st.st_dev, st.st_ino, {}};
  if (!list) return;
  DIR* d = ::opendir(f.text.c_str());
  if (!d) return;
  const size_t most = f.names * kEntriesPerName;
  size_t seen = 0;
  f.listed = true;
  while (const struct dirent* e = ::readdir(d)) {
    if (++seen > most) {
      f.listed = false;
      f.odd.clear();
      break;
    }
    if (e->d_type != DT_REG) f.odd.emplace(e->d_name);
  }
  ::closedir(d);
}

Place named(const Folder& f, const std::string& name) {
  Place p = f.place;
  p.name += name;
  return p;
}

Place of_file(const struct stat& st) { return {2, st.st_dev, st.st_ino, {}}; }

}  // namespace

std::vector<std::pair<size_t, size_t>> same_destinations(const std::vector<std::string>& paths,
                                                         const std::vector<bool>& follow, bool in_place) {
  std::unordered_map<std::string, Folder> folders;
  std::vector<std::pair<Folder*, std::string>> where(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    auto [text, name] = split(paths[i]);
    Folder& f = folders[text];
    if (f.text.empty()) f.text = std::move(text);
    ++f.names;
    where[i] = {&f, std::move(name)};
  }
  std::map<Place, size_t> first;
  std::vector<std::pair<size_t, size_t>> out;
  std::vector<Place> mine;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    Folder& f = *where[i].first;
    const std::string& name = where[i].second;
    if (!f.looked_up) look_up(f, !in_place && f.names >= kListFrom);
    mine.clear();
    mine.push_back(named(f, name));
    struct stat st {};
    if ((!f.listed || f.odd.count(name)) && ::lstat(path.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode) && (i >= follow.size() || follow[i])) {
        // As the job's open goes through it: a regular file or directory is
        // replaced at the name the link resolves to, anything else written
        // through the link, in place. A dangling link fails on its own.
        if (::stat(path.c_str(), &st) == 0) {
          if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) {
            if (char* real = ::realpath(path.c_str(), nullptr)) {
              auto [text, base] = split(real);
              std::free(real);
              Folder& target = folders[text];
              if (target.text.empty()) target.text = std::move(text);
              if (!target.looked_up) look_up(target, false);
              mine.push_back(named(target, base));
            }
          }
          if (in_place || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) mine.push_back(of_file(st));
        }
      } else if (!S_ISLNK(st.st_mode) && !S_ISDIR(st.st_mode) && (in_place || !S_ISREG(st.st_mode))) {
        mine.push_back(of_file(st));
      }
    }
    size_t clash = i;
    for (const Place& p : mine) {
      const auto [it, added] = first.emplace(p, i);
      if (!added && it->second != i && (clash == i || it->second < clash)) clash = it->second;
    }
    if (clash != i) out.emplace_back(clash, i);
  }
  return out;
}

}  // namespace gdscp::detail
