#include "cuda/kernel_cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "cuda/fnv.h"

namespace flashmla_perm {
namespace cuda {
namespace kernel_cache {
namespace {

// An entry: text lines (the magic, the key, the cubin's size, the cubin's
// checksum), then the cubin. Anything else, a key other than the one asked
// for included, is compiled again.
constexpr char kMagic[] = "flashmla_perm kernels 3";
constexpr off_t kMaxEntryBytes = off_t{1} << 28;

std::mutex mu;  // the host root and the notes
std::string host_root;
std::vector<std::string> said;

std::string absolute_or_empty(const char* path) {
  return path && path[0] == '/' ? std::string(path) : std::string();
}

// The password database's home, where it is a folder (a service user's is
// often /nonexistent).
std::string password_home() {
  struct passwd pw, *found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(geteuid(), &pw, buf.data(), buf.size(), &found) != 0 || !found) return "";
  const std::string home = absolute_or_empty(found->pw_dir);
  struct stat st;
  return !home.empty() && ::stat(home.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? home : "";
}

std::string why_errno(const std::string& what) { return what + " (" + std::strerror(errno) + ")"; }

// Whether the folder or file `fd` is this user's and no one else may write
// to it; else why not.
bool trusted(int fd, bool folder, std::string& why, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    why = why_errno(path + " cannot be examined");
    return false;
  }
  if (folder ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
    why = path + (folder ? " is not a folder" : " is not a regular file");
    return false;
  }
  if (st.st_uid != ::geteuid()) {
    why = path + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
          std::to_string(::geteuid()) + ")";
    return false;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    why = path + " may be written by other users (mode " + mode + ")";
    return false;
  }
  return true;
}

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// The folder of entries (root()/nvrtc), opened once and checked through its
// descriptor; every entry is then opened relative to it, so nothing can be
// swapped in by a path between the check and the use. Missing folders are
// created with mode 0700 (`create`: else a missing one is no cache). The
// /tmp fallback is opened without following a link: anyone may have made
// its name. -1 and why where it cannot be used.
int open_folder(std::string& folder, std::string& why, bool create = true) {
  const std::string top = root();
  if (create)
    for (size_t i = 1; i <= top.size(); ++i)
      if (i == top.size() || top[i] == '/') ::mkdir(top.substr(0, i).c_str(), 0700);
  const bool shared_tmp = top.rfind("/tmp/flashmla_perm-", 0) == 0;
  Fd dir(::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | (shared_tmp ? O_NOFOLLOW : 0)));
  if (dir.fd < 0) {
    why = why_errno(top + " cannot be opened");
    return -1;
  }
  if (!trusted(dir.fd, true, why, top)) return -1;
  folder = top + "/nvrtc";
  if (create) ::mkdirat(dir.fd, "nvrtc", 0700);
  const int sub = ::openat(dir.fd, "nvrtc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sub < 0) {
    why = why_errno(folder + " cannot be opened");
    return -1;
  }
  if (!trusted(sub, true, why, folder)) {
    ::close(sub);
    return -1;
  }
  return sub;
}

std::string entry_name(const std::string& arch, const std::string& key) {
  return "kernels-" + arch + "-" + hex(fnv1a(kFnvStart, key.data(), key.size())) + ".cubin";
}

std::string checksum(const std::string& cubin) { return hex(fnv1a(kFnvStart, cubin.data(), cubin.size())); }

// The cubin of a whole entry of this user's for `key`, read through one
// descriptor (opened without following a link, then examined); false for
// anything else.
bool read_entry(int dir, const std::string& name, const std::string& key, std::string& cubin) {
  Fd f(::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  std::string why;
  struct stat st;
  if (f.fd < 0 || !trusted(f.fd, false, why, name) || ::fstat(f.fd, &st) != 0 || st.st_size > kMaxEntryBytes)
    return false;
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  size_t at = 0;
  auto line = [&](std::string& out) {
    const size_t end = bytes.find('\n', at);
    if (end == std::string::npos) return false;
    out = bytes.substr(at, end - at);
    at = end + 1;
    return true;
  };
  std::string magic, entry_key, size, sum;
  if (!line(magic) || magic != kMagic || !line(entry_key) || entry_key != key || !line(size) || !line(sum))
    return false;
  if (size != std::to_string(bytes.size() - at)) return false;
  cubin = bytes.substr(at);
  return checksum(cubin) == sum;
}

// Writes the entry to a file of a random name and renames it into place: a
// reader sees the old entry or the whole new one, never part of one, and a
// file an earlier process left behind (its pid reused) is in no one's way.
bool write_entry(int dir, const std::string& name, const std::string& key, const std::string& cubin,
                 std::string& why) {
  const std::string bytes = std::string(kMagic) + "\n" + key + "\n" + std::to_string(cubin.size()) + "\n" +
                            checksum(cubin) + "\n" + cubin;
  std::random_device random;
  const std::string tmp =
      name + ".tmp." +
      hex((static_cast<uint64_t>(random()) << 32) ^ random() ^ static_cast<uint64_t>(::getpid()));
  Fd f(::openat(dir, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (f.fd < 0) {
    why = why_errno("cannot create a file");
    return false;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (done != bytes.size() || ::fsync(f.fd) != 0 || ::renameat(dir, tmp.c_str(), dir, name.c_str()) != 0) {
    why = why_errno("cannot write " + name);
    ::unlinkat(dir, tmp.c_str(), 0);
    return false;
  }
  return true;
}

// The entry's lock, held while the descriptor is open: a POSIX record lock
// (fcntl), which the kernel releases when its holder dies and which, unlike
// flock, a forked child does not hold on. Refused, like an entry, unless it
// is this user's regular file that no one else may write to. A holder that
// keeps it past kLockWait (a stopped process) is given up on: compiled
// without it.
constexpr auto kLockWait = std::chrono::minutes(10);

int take_lock(int dir, const std::string& name, std::string& why) {
  const std::string lock_name = name + ".lock";
  Fd fd(::openat(dir, lock_name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.fd < 0) {
    why = why_errno("cannot open the lock " + lock_name);
    return -1;
  }
  if (!trusted(fd.fd, false, why, lock_name)) return -1;
  struct flock whole = {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  const auto until = std::chrono::steady_clock::now() + kLockWait;
  while (::fcntl(fd.fd, F_SETLK, &whole) != 0) {
    if (errno != EACCES && errno != EAGAIN && errno != EINTR) {
      why = why_errno("cannot lock " + lock_name);
      return -1;
    }
    if (std::chrono::steady_clock::now() > until) {
      why = lock_name + " was held past 10 minutes";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int held = fd.fd;
  fd.fd = -1;
  return held;
}

Entry compiled_entry(const std::function<Compiled()>& compile) {
  Compiled c = compile();
  Entry e;
  e.cubin = std::move(c.cubin);
  e.log = std::move(c.log);
  e.seconds = c.seconds;
  e.compiled = true;
  return e;
}

}  // namespace

std::string root() {
  if (const char* dir = std::getenv("FLASHMLA_PERM_CACHE_DIR"); dir && *dir) {
    if (dir[0] != '/')
      throw std::invalid_argument(
          std::string("flashmla_perm: FLASHMLA_PERM_CACHE_DIR must be an absolute path, "
                      "got '") +
          dir + "'");
    return dir;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!host_root.empty()) return host_root;
  }
  if (const std::string xdg = absolute_or_empty(std::getenv("XDG_CACHE_HOME")); !xdg.empty())
    return xdg + "/flashmla_perm";
  // A home this user may write in (HOME, else the password database's): a
  // container that runs under an arbitrary uid may give it HOME=/.
  for (const std::string& home : {absolute_or_empty(std::getenv("HOME")), password_home()})
    if (!home.empty() && ::access(home.c_str(), W_OK) == 0) return home + "/.cache/flashmla_perm";
  return "/tmp/flashmla_perm-" + std::to_string(::geteuid());
}

void set_host_root(const std::string& root) {
  std::lock_guard<std::mutex> lock(mu);
  host_root = root;
}

Entry get(const std::string& arch, const std::string& key, const std::function<Compiled()>& compile) {
  std::string folder, why;
  Fd dir(open_folder(folder, why));
  if (dir.fd < 0) {
    say_once("the kernel cache is off: " + why + "; kernels are compiled in memory, every start");
    return compiled_entry(compile);
  }
  const std::string name = entry_name(arch, key);
  Entry e;
  e.path = folder + "/" + name;
  if (read_entry(dir.fd, name, key, e.cubin)) return e;
  Fd lock(take_lock(dir.fd, name, why));
  if (lock.fd < 0) say_once("the kernel cache in " + folder + " cannot be shared between processes: " + why);
  if (lock.fd >= 0 && read_entry(dir.fd, name, key, e.cubin)) return e;  // compiled while we waited
  Entry made = compiled_entry(compile);
  made.path = e.path;
  if (!write_entry(dir.fd, name, key, made.cubin, why))
    say_once("the kernel cache in " + folder + " cannot be written: " + why +
             "; kernels are compiled every start");
  return made;
}

std::string find(const std::string& arch, const std::string& key) {
  std::string folder, why, cubin;
  Fd dir(open_folder(folder, why, false));
  const std::string name = entry_name(arch, key);
  return dir.fd >= 0 && read_entry(dir.fd, name, key, cubin) ? folder + "/" + name : "";
}

void say_once(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu);
  for (const std::string& s : said)
    if (s == line) return;
  said.push_back(line);
  std::fprintf(stderr, "flashmla_perm: %s\n", line.c_str());
}

std::vector<std::string> notes() {
  std::lock_guard<std::mutex> lock(mu);
  return said;
}

}  // namespace kernel_cache
}  // namespace cuda
}  // namespace flashmla_perm
