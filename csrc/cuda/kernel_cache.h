// The disk cache of kernels compiled at first use (docs/design.md, "The
// kernel cache"). Entries are read only from a folder this user owns and no
// one else may write to, only if they are this user's regular files, whole,
// and of the key asked for; a compile runs under a lock beside its entry, so
// processes that ask at once compile once. Plain C++.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace flashmla_perm {
namespace cuda {
namespace kernel_cache {

// The cache's folder: FLASHMLA_PERM_CACHE_DIR (an absolute path, else
// std::invalid_argument naming it); else the folder the program hosting this
// module set (set_host_root: the vLLM plugin's $VLLM_CACHE_ROOT/flashmla_perm);
// else $XDG_CACHE_HOME/flashmla_perm (absolute; a relative one is ignored,
// as the XDG spec says), ~/.cache/flashmla_perm (HOME, else the password
// database's home), /tmp/flashmla_perm-<uid>. Entries go in its nvrtc/.
std::string root();
void set_host_root(const std::string& root);  // "" unsets

struct Entry {
  std::string cubin;
  std::string path;      // the entry's file ("" where the cache is off)
  bool compiled = false;  // false: read from the cache
  double seconds = 0;     // the compile's
  std::string log;        // the compiler's
};
struct Compiled {
  std::string cubin, log;
  double seconds = 0;
};

// The entry for (arch, key), `key` naming everything the cubin depends on:
// read where it is there; else, holding the entry's lock, read again (another
// process may just have written it) or compiled by `compile` and written.
// Where the folder cannot be used, or the entry not written, it says so once
// (say_once) and returns what it compiled.
Entry get(const std::string& arch, const std::string& key, const std::function<Compiled()>& compile);
// The path of a readable entry for (arch, key), or "".
std::string find(const std::string& arch, const std::string& key);

// Writes "flashmla_perm: <line>" to stderr the first time it is said, and
// keeps it for notes().
void say_once(const std::string& line);
std::vector<std::string> notes();

}  // namespace kernel_cache
}  // namespace cuda
}  // namespace flashmla_perm
