// A stand-in for the CUDA driver library (libcuda.so.1) for tests on machines
// with no GPU: the module's host code opens it by name where its folder is on
// LD_LIBRARY_PATH, and every call it makes is checked as a real driver would
// check it and written to a log a test reads. It runs nothing on a device.
//
// Build: cc -std=c11 -shared -fPIC -o libcuda.so.1 libcuda.c -lpthread
// (tests/stub_cuda.py does this). No CUDA header is needed: the few types and
// values used are declared below, with cuda.h's names in the comments.
//
// Read from the environment at the first call (and again at each cuInit):
//   STUB_CUDA_LOG=path        append one line per call: "[pid] name key=value ... -> result"
//   STUB_CUDA_ARCH=90         the GPU's compute capability, major*10+minor or "9.0" (default 90)
//   STUB_CUDA_REFUSE=ptx|cubin|all   refuse that kind of image at cuModuleLoadData
//   STUB_CUDA_REFUSE_ERROR=N  the error a refusal returns (default 222 for PTX, 200 for a cubin)
//   STUB_CUDA_PTX_VERSION=8.7 the newest PTX ISA this "driver" takes (default: any)
//   STUB_CUDA_CAPTURING=1|invalidated|implicit   what cuStreamIsCapturing says
// The device has the figures of an H100 whatever its compute capability.
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;

enum {
  kSuccess = 0,
  kErrorInvalidValue = 1,         // CUDA_ERROR_INVALID_VALUE
  kErrorNotInitialized = 3,       // CUDA_ERROR_NOT_INITIALIZED
  kErrorInvalidDevice = 101,      // CUDA_ERROR_INVALID_DEVICE
  kErrorInvalidImage = 200,       // CUDA_ERROR_INVALID_IMAGE
  kErrorInvalidContext = 201,     // CUDA_ERROR_INVALID_CONTEXT
  kErrorNoBinaryForGpu = 209,     // CUDA_ERROR_NO_BINARY_FOR_GPU
  kErrorInvalidPtx = 218,         // CUDA_ERROR_INVALID_PTX
  kErrorUnsupportedPtx = 222,     // CUDA_ERROR_UNSUPPORTED_PTX_VERSION
  kErrorInvalidHandle = 400,      // CUDA_ERROR_INVALID_HANDLE
  kErrorNotFound = 500,           // CUDA_ERROR_NOT_FOUND
  kErrorOutOfResources = 701,     // CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
  kErrorCaptureImplicit = 906,    // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
};

// An H100's figures (cuDeviceGetAttribute's answers and the launch limits).
enum {
  kSmCount = 132,
  kSmemPerSm = 233472,          // 228 KiB
  kSmemReservedPerBlock = 1024,
  kSmemPerBlock = 49152,        // the dynamic + static limit without opt-in
  kSmemPerBlockOptin = 232448,  // 227 KiB
  kThreadsPerSm = 2048,
  kRegsPerSm = 65536,
  kBlocksPerSm = 32,
  kThreadsPerBlock = 1024,
  kPtxRegs = 32,  // what a PTX kernel is said to use: its registers are ptxas's, at load
};

// The module looks this symbol up to know the driver is this stand-in, which
// runs nothing and so may be handed launches on fake addresses.
EXPORT const char flashmla_perm_stand_in[] = "tests/stub_cuda";

// ---------------------------------------------------------------- state

struct CUctx_st {
  int device;
};

struct Param {
  size_t offset, size;
};

struct CUfunc_st {
  struct CUmod_st* module;
  char* name;
  int regs, static_smem, max_threads, stack;
  int max_dynamic;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, as set
  int carveout;     // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, -1 unset
  int nparams;
  struct Param* params;
  size_t param_bytes;  // the parameter block: max(offset + size)
  int cbank_bytes;     // what the cubin's own EIATTR says the block is (-1: not said)
};

// Modules are kept after cuModuleUnload (marked unloaded) so that a handle
// used after it is told apart from garbage instead of read from freed memory.
struct CUmod_st {
  struct CUmod_st* next;
  int id, loaded, nfuncs;
  struct CUfunc_st* funcs;
};

static struct {
  char log_path[4096];
  int arch;  // major*10 + minor
  int refuse_ptx, refuse_cubin, refuse_error;
  int ptx_max;  // newest PTX ISA taken, major*100 + minor; 0 any
  int capturing;  // a CUstreamCaptureStatus, or -1 for CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
} config = {"", 90, 0, 0, 0, 0, 0};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  // every call holds it: state and log lines
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int initialized, retains, next_module_id = 1;
static struct CUmod_st* modules;
static struct CUctx_st primary = {0};
static _Thread_local CUcontext current;
static _Thread_local int capture_mode;  // CU_STREAM_CAPTURE_MODE_GLOBAL

static void read_config(void) {
  const char* log = getenv("STUB_CUDA_LOG");
  snprintf(config.log_path, sizeof config.log_path, "%s", log ? log : "");
  const char* arch = getenv("STUB_CUDA_ARCH");
  int major = 0, minor = 0;
  const int parts = arch ? sscanf(arch, "%d.%d", &major, &minor) : 0;  // "100", or "10.0"
  config.arch = parts == 2 ? major * 10 + minor : parts == 1 && major > 0 ? major : 90;
  const char* refuse = getenv("STUB_CUDA_REFUSE");
  if (!refuse) refuse = "";
  config.refuse_ptx = !strcmp(refuse, "ptx") || !strcmp(refuse, "all");
  config.refuse_cubin = !strcmp(refuse, "cubin") || !strcmp(refuse, "all");
  const char* error = getenv("STUB_CUDA_REFUSE_ERROR");
  config.refuse_error = error ? atoi(error) : 0;
  const char* ptx = getenv("STUB_CUDA_PTX_VERSION");
  major = minor = 0;
  config.ptx_max = ptx && sscanf(ptx, "%d.%d", &major, &minor) >= 1 ? major * 100 + minor : 0;
  const char* capturing = getenv("STUB_CUDA_CAPTURING");
  if (!capturing) capturing = "";
  config.capturing = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  if (!strcmp(capturing, "1")) config.capturing = 1;            // _ACTIVE
  if (!strcmp(capturing, "invalidated")) config.capturing = 2;  // _INVALIDATED
  if (!strcmp(capturing, "implicit")) config.capturing = -1;
}

// Every entry point starts here: the configuration is read at the first call,
// whichever it is, so that even that one is logged.
static void begin(void) {
  pthread_once(&once, read_config);
  pthread_mutex_lock(&mu);
}

// Logs the call as one line and ends it with `r`. The file is opened for
// each line and the line written at once, O_APPEND: whole lines from several
// processes (and forks) interleave, never parts, and a test may remove it.
__attribute__((format(printf, 3, 4))) static CUresult done(CUresult r, const char* name, const char* fmt,
                                                           ...) {
  const int fd =
      *config.log_path ? open(config.log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
  if (fd >= 0) {
    char args[4096], line[8192];
    va_list list;
    va_start(list, fmt);
    vsnprintf(args, sizeof args, fmt, list);
    va_end(list);
    const int n =
        snprintf(line, sizeof line, "[%d] %s%s%s -> %d\n", (int)getpid(), name, *args ? " " : "", args, r);
    ssize_t ignored = write(fd, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
    (void)ignored;
    close(fd);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

static const char* context_name(CUcontext c) { return !c ? "none" : c == &primary ? "ctx0" : "other"; }

// The function `f` if it is one of a loaded module's, else NULL.
static struct CUfunc_st* live_function(CUfunction f) {
  for (struct CUmod_st* m = modules; m; m = m->next)
    if (m->loaded && f >= m->funcs && f < m->funcs + m->nfuncs) return f;
  return NULL;
}

static struct CUmod_st* live_module(CUmodule mod) {
  for (struct CUmod_st* m = modules; m; m = m->next)
    if (m == mod && m->loaded) return m;
  return NULL;
}

// ---------------------------------------------------------------- cubins

static uint32_t u32(const unsigned char* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static uint16_t u16(const unsigned char* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

// A cubin's .nv.info sections are sequences of EIATTR records: a format byte,
// an attribute byte, then for EIFMT_SVAL (4) a 16-bit size and that many
// bytes of payload; for the other formats (EIFMT_HVAL 3, EIFMT_BVAL 2,
// EIFMT_NVAL 1) a 16-bit value and no payload.
struct Record {
  int format, attr, value;  // value: the SVAL payload's size, or the inline value
  const unsigned char* data;
};
enum { kSval = 4 };
enum {
  kAttrParamCbank = 0x0a,      // EIATTR_PARAM_CBANK: {symbol, offset | size << 16}
  kAttrMaxThreads = 0x05,      // EIATTR_MAX_THREADS: {x, y, z} (__launch_bounds__)
  kAttrReqntid = 0x10,         // EIATTR_REQNTID: {x, y, z}
  kAttrFrameSize = 0x11,       // EIATTR_FRAME_SIZE: {symbol, bytes}
  kAttrMinStackSize = 0x12,    // EIATTR_MIN_STACK_SIZE: {symbol, bytes}
  kAttrKparamInfo = 0x17,      // EIATTR_KPARAM_INFO: {index, ordinal | offset << 16, size << 18}
  kAttrCbankParamSize = 0x19,  // EIATTR_CBANK_PARAM_SIZE: the value
  kAttrMaxStackSize = 0x23,    // EIATTR_MAX_STACK_SIZE: {symbol, bytes}
  kAttrRegcount = 0x2f,        // EIATTR_REGCOUNT: {symbol, registers}
  kCompatAccelerator = 0x09,   // .nv.compat's EICOMPAT_ATTR_CUDA_ACCELERATOR_TARGET (sm_90a)
};

static int next_record(const unsigned char* sec, size_t size, size_t* pos, struct Record* r) {
  if (*pos + 4 > size) return 0;
  const unsigned char* p = sec + *pos;
  r->format = p[0], r->attr = p[1], r->value = u16(p + 2), r->data = p + 4;
  *pos += 4 + (r->format == kSval ? (size_t)r->value : 0);
  return *pos <= size;
}

struct Cubin {
  const unsigned char* image;
  Elf64_Ehdr header;
  const char* names;  // .shstrtab
};

static Elf64_Shdr section(const struct Cubin* c, int i) {
  Elf64_Shdr s;
  memcpy(&s, c->image + c->header.e_shoff + (size_t)i * sizeof s, sizeof s);
  return s;
}

// The section called `prefix` + `name`, or -1.
static int find_section(const struct Cubin* c, const char* prefix, const char* name) {
  const size_t n = strlen(prefix);
  for (int i = 1; i < c->header.e_shnum; ++i) {
    const char* s = c->names + section(c, i).sh_name;
    if (!strncmp(s, prefix, n) && !strcmp(s + n, name)) return i;
  }
  return -1;
}

// Registers and stack from the cubin's global .nv.info, whose records name
// their function by symbol index.
static void global_info(const struct Cubin* c, int symbol, struct CUfunc_st* f) {
  const int i = find_section(c, ".nv.info", "");
  if (i < 0) return;
  const Elf64_Shdr s = section(c, i);
  struct Record r;
  for (size_t pos = 0; next_record(c->image + s.sh_offset, s.sh_size, &pos, &r);) {
    if (r.format != kSval || r.value < 8 || (int)u32(r.data) != symbol) continue;
    const int v = (int)u32(r.data + 4);
    if (r.attr == kAttrRegcount) f->regs = v;
    if ((r.attr == kAttrFrameSize || r.attr == kAttrMinStackSize || r.attr == kAttrMaxStackSize) &&
        v > f->stack)
      f->stack = v;
  }
}

// Parameters and launch bounds from the function's own .nv.info.<name>.
static void function_info(const struct Cubin* c, struct CUfunc_st* f) {
  const int i = find_section(c, ".nv.info.", f->name);
  if (i < 0) return;
  const Elf64_Shdr s = section(c, i);
  const unsigned char* sec = c->image + s.sh_offset;
  struct Record r;
  for (size_t pos = 0; next_record(sec, s.sh_size, &pos, &r);)
    if (r.attr == kAttrKparamInfo && r.format == kSval && r.value >= 12 && u16(r.data + 4) + 1 > f->nparams)
      f->nparams = u16(r.data + 4) + 1;
  f->params = calloc(f->nparams ? f->nparams : 1, sizeof *f->params);
  for (size_t pos = 0; next_record(sec, s.sh_size, &pos, &r);) {
    if (r.attr == kAttrKparamInfo && r.format == kSval && r.value >= 12) {
      struct Param* p = &f->params[u16(r.data + 4)];
      p->offset = u16(r.data + 6);
      p->size = (u32(r.data + 8) >> 18) & 0x3fff;
      if (p->offset + p->size > f->param_bytes) f->param_bytes = p->offset + p->size;
    } else if ((r.attr == kAttrMaxThreads || r.attr == kAttrReqntid) && r.format == kSval && r.value >= 12) {
      const int threads = (int)(u32(r.data) * u32(r.data + 4) * u32(r.data + 8));
      if (threads > 0 && threads < f->max_threads) f->max_threads = threads;
    } else if (r.attr == kAttrCbankParamSize && r.format != kSval) {
      f->cbank_bytes = r.value;
    } else if (r.attr == kAttrParamCbank && r.format == kSval && r.value >= 8 && f->cbank_bytes < 0) {
      f->cbank_bytes = (int)(u32(r.data + 4) >> 16);
    }
  }
}

// The SM a cubin is for: e_flags holds it in bits 0..7 for ELF ABI version 7
// (CUDA 12's ptxas below sm_100), with 'a' (sm_90a) as 0x800, and in bits
// 8..15 for ABI version 8 (CUDA 12's sm_100 and later, everything of CUDA
// 13's), with 'a' as 0x8 (CUDA 12) or only in .nv.compat (CUDA 13).
static int cubin_arch(const struct Cubin* c, int* accelerated) {
  const uint32_t flags = c->header.e_flags;
  const int v8 = c->header.e_ident[EI_ABIVERSION] >= 8;
  *accelerated = v8 ? (flags & 0x8) != 0 : (flags & 0x800) != 0;
  const int i = find_section(c, ".nv.compat", "");
  if (i >= 0) {
    const Elf64_Shdr s = section(c, i);
    struct Record r;
    for (size_t pos = 0; next_record(c->image + s.sh_offset, s.sh_size, &pos, &r);)
      if (r.attr == kCompatAccelerator && r.format != kSval && r.value) *accelerated = 1;
  }
  return v8 ? (int)(flags >> 8) & 0xff : (int)flags & 0xff;
}

// A cubin runs on a GPU of its major version and a minor at least its own;
// an arch-specific one ('a') only on exactly its SM.
static int runs_here(int sm, int accelerated) {
  if (accelerated) return sm == config.arch;
  return sm / 10 == config.arch / 10 && sm % 10 <= config.arch % 10;
}

static CUresult load_cubin(const unsigned char* image, struct CUmod_st* m, char* what, size_t what_size) {
  struct Cubin c = {.image = image};
  memcpy(&c.header, image, sizeof c.header);
  const Elf64_Ehdr* e = &c.header;
  if (e->e_ident[EI_CLASS] != ELFCLASS64 || e->e_ident[EI_DATA] != ELFDATA2LSB || e->e_machine != 190 ||
      e->e_type != ET_EXEC || e->e_shentsize != sizeof(Elf64_Shdr) || e->e_shstrndx >= e->e_shnum) {
    snprintf(what, what_size, "kind=elf machine=%d type=%d", e->e_machine, e->e_type);
    return kErrorInvalidImage;
  }
  c.names = (const char*)image + section(&c, e->e_shstrndx).sh_offset;
  int accelerated;
  const int sm = cubin_arch(&c, &accelerated);
  snprintf(what, what_size, "kind=cubin arch=sm_%d%s abi=%d gpu=sm_%d", sm, accelerated ? "a" : "",
           e->e_ident[EI_ABIVERSION], config.arch);
  if (!runs_here(sm, accelerated)) return kErrorNoBinaryForGpu;
  if (config.refuse_cubin) return config.refuse_error ? config.refuse_error : kErrorInvalidImage;

  // The kernels: functions whose symbol has a section .text.<its name> (the
  // helpers ptxas adds live inside a kernel's section, at an offset).
  int symtab = -1;
  for (int i = 1; i < e->e_shnum; ++i)
    if (section(&c, i).sh_type == SHT_SYMTAB) symtab = i;
  if (symtab < 0) return kErrorInvalidImage;
  const Elf64_Shdr st = section(&c, symtab);
  const char* strings = (const char*)image + section(&c, (int)st.sh_link).sh_offset;
  const int nsyms = (int)(st.sh_size / sizeof(Elf64_Sym));
  m->funcs = calloc(nsyms ? nsyms : 1, sizeof *m->funcs);
  for (int k = 0; k < nsyms; ++k) {
    Elf64_Sym sym;
    memcpy(&sym, image + st.sh_offset + (size_t)k * sizeof sym, sizeof sym);
    if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == 0 || sym.st_shndx >= e->e_shnum) continue;
    const char* name = strings + sym.st_name;
    const char* text = c.names + section(&c, sym.st_shndx).sh_name;
    if (strncmp(text, ".text.", 6) || strcmp(text + 6, name)) continue;
    struct CUfunc_st* f = &m->funcs[m->nfuncs++];
    *f = (struct CUfunc_st){m, strdup(name), 0, 0, kThreadsPerBlock, 0, 0, -1, 0, NULL, 0, -1};
    f->regs = (int)(section(&c, sym.st_shndx).sh_info >> 24);  // where CUDA 12's sm_80 ptxas puts it
    global_info(&c, k, f);
    const int shared = find_section(&c, ".nv.shared.", name);
    if (shared >= 0) f->static_smem = (int)section(&c, shared).sh_size;
    function_info(&c, f);
    f->max_dynamic = kSmemPerBlock - f->static_smem;
  }
  snprintf(what + strlen(what), what_size - strlen(what), " kernels=%d", m->nfuncs);
  return kSuccess;
}

// ---------------------------------------------------------------- PTX

static const char* skip_space(const char* p) {
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') ++p;
    if (p[0] == '/' && p[1] == '/') {
      while (*p && *p != '\n') ++p;
    } else if (p[0] == '/' && p[1] == '*') {
      const char* end = strstr(p + 2, "*/");
      p = end ? end + 2 : p + strlen(p);
    } else {
      return p;
    }
  }
}

static int is_name_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
         ch == '$' || ch == '%';
}

// The bytes of a .param's type (.b8, .u32, .f64, ...), 0 for a word that is not one.
static size_t type_size(const char* word) {
  if (word[0] != '.' || !strchr("busf", word[1])) return 0;
  const int bits = atoi(word + 2);
  return bits == 8 || bits == 16 || bits == 32 || bits == 64 ? (size_t)bits / 8 : 0;
}

// One kernel's parameters, from `(` on: ".param [.align A] .TYPE [.ptr .SPACE .align P] NAME[[N]]", comma
// separated; an .align after the type is the pointee's, not the parameter's.
static const char* ptx_params(const char* p, struct CUfunc_st* f) {
  f->params = calloc(64, sizeof *f->params);
  int cap = 64;
  while (*(p = skip_space(p)) && *p != ')') {
    size_t align = 0, size = 0, count = 1;
    while (*(p = skip_space(p)) && *p != ',' && *p != ')') {
      char word[256];
      int n = 0;
      while (*p && *p != ',' && *p != ')' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '[' && n < 255)
        word[n++] = *p++;
      word[n] = 0;
      if (!strcmp(word, ".align")) {
        const size_t a = (size_t)strtoul(skip_space(p), (char**)&p, 10);
        if (!size) align = a;
      }
      if (type_size(word)) size = type_size(word);
      if (*p == '[')
        count = (size_t)strtoul(p + 1, (char**)&p, 10), p = strchr(p, ']') ? strchr(p, ']') + 1 : p;
      if (!n && *p != '[') ++p;  // a character no word starts with: pass it
    }
    if (*p == ',') ++p;
    if (!size) continue;
    if (!align) align = size;
    if (f->nparams == cap) f->params = realloc(f->params, (cap *= 2) * sizeof *f->params);
    struct Param* q = &f->params[f->nparams++];
    q->offset = (f->param_bytes + align - 1) / align * align;
    q->size = size * count;
    f->param_bytes = q->offset + q->size;
  }
  return *p ? p + 1 : p;
}

// ".target sm_XY[a|f]": the SM as a number, and its suffix.
static int ptx_target(const char* t, char* suffix) {
  *suffix = 0;
  if (strncmp(t, "sm_", 3)) return 0;
  char* end;
  const int sm = (int)strtol(t + 3, &end, 10);
  if (*end == 'a' || *end == 'f') *suffix = *end;
  return sm;
}

static int ptx_runs_here(int sm, char suffix) {
  if (suffix == 'a') return sm == config.arch;
  if (suffix == 'f') return sm / 10 == config.arch / 10 && sm % 10 <= config.arch % 10;
  return sm <= config.arch;  // PTX is compiled for the GPU at load: any later one runs it
}

static CUresult load_ptx(const char* text, struct CUmod_st* m, char* what, size_t what_size) {
  int major = 0, minor = 0;
  sscanf(skip_space(text) + strlen(".version"), "%d.%d", &major, &minor);
  const char* target = strstr(text, ".target");
  char suffix;
  const int sm = target ? ptx_target(skip_space(target + strlen(".target")), &suffix) : 0;
  snprintf(what, what_size, "kind=ptx target=sm_%d%s version=%d.%d gpu=sm_%d", sm,
           sm && suffix ? (suffix == 'a' ? "a" : "f") : "", major, minor, config.arch);
  if (!sm) return kErrorInvalidPtx;
  if (!ptx_runs_here(sm, suffix)) return kErrorInvalidPtx;
  if (config.ptx_max && major * 100 + minor > config.ptx_max) return kErrorUnsupportedPtx;
  if (config.refuse_ptx) return config.refuse_error ? config.refuse_error : kErrorUnsupportedPtx;

  int cap = 8;
  m->funcs = calloc(cap, sizeof *m->funcs);
  for (const char* p = text; (p = strstr(p, ".entry")) != NULL;) {
    p += strlen(".entry");
    if (p[-7] != ' ' && p[-7] != '\t' && p[-7] != '\n') continue;  // the word alone, not a part of one
    p = skip_space(p);
    const char* name = p;
    while (is_name_char(*p)) ++p;
    if (p == name) continue;
    if (m->nfuncs == cap) m->funcs = realloc(m->funcs, (cap *= 2) * sizeof *m->funcs);
    struct CUfunc_st* f = &m->funcs[m->nfuncs++];
    *f = (struct CUfunc_st){m, strndup(name, p - name), kPtxRegs, 0, kThreadsPerBlock, 0, 0, -1, 0, NULL, 0,
                            -1};
    p = skip_space(p);
    f->max_dynamic = kSmemPerBlock;
    if (*p == '(') p = ptx_params(p + 1, f);
    // Performance directives before the body: __launch_bounds__ is .maxntid.
    const char* body = strchr(p, '{');
    for (const char* d = p; body && (d = strstr(d, "ntid")) != NULL && d < body; d += 4) {
      unsigned x = 1, y = 1, z = 1;
      if (d[-4] == '.' && sscanf(d + 4, " %u , %u , %u", &x, &y, &z) >= 1 &&
          (int)(x * y * z) < f->max_threads)
        f->max_threads = (int)(x * y * z);
    }
  }
  snprintf(what + strlen(what), what_size - strlen(what), " kernels=%d", m->nfuncs);
  return kSuccess;
}

// PTX: text that starts, after comments, with .version.
static int is_ptx(const char* image) { return !strncmp(skip_space(image), ".version", 8); }

// ---------------------------------------------------------------- device and context

EXPORT CUresult cuInit(unsigned flags) {
  begin();
  read_config();
  if (flags != 0) return done(kErrorInvalidValue, "cuInit", "flags=%u", flags);
  initialized = 1;
  return done(kSuccess, "cuInit", "flags=0 arch=%d", config.arch);
}

EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  begin();
  CUresult r = !initialized   ? kErrorNotInitialized
               : !device      ? kErrorInvalidValue
               : ordinal != 0 ? kErrorInvalidDevice
                              : kSuccess;
  if (r == kSuccess) *device = 0;
  return done(r, "cuDeviceGet", "ordinal=%d", ordinal);
}

// cuDeviceGetAttribute's answers, by CUdevice_attribute (75 and 76, the
// compute capability, are the configuration's).
static const int kDeviceAttributes[][2] = {
    {1, kThreadsPerBlock},         // MAX_THREADS_PER_BLOCK
    {2, 1024},                     // MAX_BLOCK_DIM_X
    {3, 1024},                     // MAX_BLOCK_DIM_Y
    {4, 64},                       // MAX_BLOCK_DIM_Z
    {5, 0x7fffffff},               // MAX_GRID_DIM_X
    {6, 65535},                    // MAX_GRID_DIM_Y
    {7, 65535},                    // MAX_GRID_DIM_Z
    {8, kSmemPerBlock},            // MAX_SHARED_MEMORY_PER_BLOCK
    {10, 32},                      // WARP_SIZE
    {12, kRegsPerSm},              // MAX_REGISTERS_PER_BLOCK
    {16, kSmCount},                // MULTIPROCESSOR_COUNT
    {39, kThreadsPerSm},           // MAX_THREADS_PER_MULTIPROCESSOR
    {81, kSmemPerSm},              // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    {82, kRegsPerSm},              // MAX_REGISTERS_PER_MULTIPROCESSOR
    {97, kSmemPerBlockOptin},      // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    {106, kBlocksPerSm},           // MAX_BLOCKS_PER_MULTIPROCESSOR
    {111, kSmemReservedPerBlock},  // RESERVED_SHARED_MEMORY_PER_BLOCK
};

static int device_attribute(int attr, int* value) {
  if (attr == 75 || attr == 76) {  // COMPUTE_CAPABILITY_MAJOR, _MINOR
    *value = attr == 75 ? config.arch / 10 : config.arch % 10;
    return 1;
  }
  for (size_t i = 0; i < sizeof kDeviceAttributes / sizeof *kDeviceAttributes; ++i)
    if (kDeviceAttributes[i][0] == attr) return *value = kDeviceAttributes[i][1], 1;
  return 0;
}

EXPORT CUresult cuDeviceGetAttribute(int* value, int attr, CUdevice device) {
  begin();
  int v = 0;
  CUresult r = !initialized                  ? kErrorNotInitialized
               : !value                      ? kErrorInvalidValue
               : device != 0                 ? kErrorInvalidDevice
               : !device_attribute(attr, &v) ? kErrorInvalidValue
                                             : kSuccess;
  if (r == kSuccess) *value = v;
  return done(r, "cuDeviceGetAttribute", "attr=%d dev=%d value=%d", attr, device, v);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  begin();
  CUresult r = !initialized  ? kErrorNotInitialized
               : !context    ? kErrorInvalidValue
               : device != 0 ? kErrorInvalidDevice
                             : kSuccess;
  if (r == kSuccess) *context = &primary, ++retains;
  return done(r, "cuDevicePrimaryCtxRetain", "dev=%d ctx=ctx0 refs=%d", device, retains);
}

EXPORT CUresult cuCtxGetCurrent(CUcontext* context) {
  begin();
  CUresult r = !initialized ? kErrorNotInitialized : !context ? kErrorInvalidValue : kSuccess;
  if (r == kSuccess) *context = current;
  return done(r, "cuCtxGetCurrent", "ctx=%s", context_name(current));
}

// Only the primary context exists (or none: NULL unbinds the thread's).
EXPORT CUresult cuCtxSetCurrent(CUcontext context) {
  begin();
  const CUcontext was = current;
  CUresult r = !initialized                     ? kErrorNotInitialized
               : context && context != &primary ? kErrorInvalidContext
                                                : kSuccess;
  if (r == kSuccess) current = context;
  return done(r, "cuCtxSetCurrent", "ctx=%s was=%s", context_name(context), context_name(was));
}

// ---------------------------------------------------------------- modules and functions

EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  begin();
  char what[512] = "";
  if (!initialized) return done(kErrorNotInitialized, "cuModuleLoadData", "%s", what);
  if (!current) return done(kErrorInvalidContext, "cuModuleLoadData", "%s", what);
  if (!module || !image) return done(kErrorInvalidValue, "cuModuleLoadData", "%s", what);
  const unsigned char* bytes = image;
  struct CUmod_st* m = calloc(1, sizeof *m);
  CUresult r;
  if (bytes[0] == 0x7f && bytes[1] == 'E' && bytes[2] == 'L' && bytes[3] == 'F')
    r = load_cubin(bytes, m, what, sizeof what);
  else if (is_ptx(image))
    r = load_ptx(image, m, what, sizeof what);
  else
    r = kErrorInvalidImage, snprintf(what, sizeof what, "kind=unknown");
  if (r != kSuccess) {
    for (int i = 0; i < m->nfuncs; ++i) free(m->funcs[i].name), free(m->funcs[i].params);
    free(m->funcs);
    free(m);
    return done(r, "cuModuleLoadData", "%s", what);
  }
  m->id = next_module_id++;
  m->loaded = 1;
  m->next = modules;
  modules = m;
  *module = m;
  return done(kSuccess, "cuModuleLoadData", "%s mod=%d", what, m->id);
}

EXPORT CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  begin();
  const char* shown = name ? name : "(null)";
  if (!initialized) return done(kErrorNotInitialized, "cuModuleGetFunction", "name=%s", shown);
  if (!current) return done(kErrorInvalidContext, "cuModuleGetFunction", "name=%s", shown);
  struct CUmod_st* m = live_module(module);
  if (!m) return done(kErrorInvalidHandle, "cuModuleGetFunction", "name=%s", shown);
  if (!function || !name)
    return done(kErrorInvalidValue, "cuModuleGetFunction", "name=%s mod=%d", shown, m->id);
  for (int i = 0; i < m->nfuncs; ++i) {
    struct CUfunc_st* f = &m->funcs[i];
    if (strcmp(f->name, name)) continue;
    *function = f;
    return done(kSuccess, "cuModuleGetFunction",
                "name=%s mod=%d regs=%d smem=%d threads=%d stack=%d params=%d size=%zu cbank=%d", name, m->id,
                f->regs, f->static_smem, f->max_threads, f->stack, f->nparams, f->param_bytes,
                f->cbank_bytes);
  }
  return done(kErrorNotFound, "cuModuleGetFunction", "name=%s mod=%d", name, m->id);
}

EXPORT CUresult cuModuleUnload(CUmodule module) {
  begin();
  if (!initialized) return done(kErrorNotInitialized, "cuModuleUnload", "%s", "");
  if (!current) return done(kErrorInvalidContext, "cuModuleUnload", "%s", "");
  struct CUmod_st* m = live_module(module);
  if (!m) return done(kErrorInvalidHandle, "cuModuleUnload", "%s", "");
  m->loaded = 0;
  return done(kSuccess, "cuModuleUnload", "mod=%d", m->id);
}

// The most threads a block of `f` may have: its launch bounds, and what its
// registers allow in one SM's register file (allocated per warp in units of
// 256, to the 4 sub-partitions alike).
static int max_threads(const struct CUfunc_st* f) {
  const int per_warp = (f->regs * 32 + 255) / 256 * 256;
  const int warps = per_warp ? kRegsPerSm / per_warp / 4 * 4 : kThreadsPerBlock / 32;
  const int by_regs = warps * 32 < kThreadsPerBlock ? warps * 32 : kThreadsPerBlock;
  return f->max_threads < by_regs ? f->max_threads : by_regs;
}

EXPORT CUresult cuFuncGetAttribute(int* value, int attr, CUfunction function) {
  begin();
  const struct CUfunc_st* f = initialized ? live_function(function) : NULL;
  const char* name = f ? f->name : "?";
  int v = 0;
  CUresult r = !initialized ? kErrorNotInitialized
               : !f         ? kErrorInvalidHandle
               : !value     ? kErrorInvalidValue
                            : kSuccess;
  if (r == kSuccess) {
    switch (attr) {
      case 0: v = max_threads(f); break;  // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
      case 1: v = f->static_smem; break;  // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
      case 3: v = f->stack; break;        // CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
      case 4: v = f->regs; break;         // CU_FUNC_ATTRIBUTE_NUM_REGS
      case 8: v = f->max_dynamic; break;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
      case 9: v = f->carveout; break;     // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
      default: r = kErrorInvalidValue;
    }
  }
  if (r == kSuccess) *value = v;
  return done(r, "cuFuncGetAttribute", "fn=%s attr=%d value=%d", name, attr, v);
}

EXPORT CUresult cuFuncSetAttribute(CUfunction function, int attr, int value) {
  begin();
  struct CUfunc_st* f = initialized ? live_function(function) : NULL;
  const char* name = f ? f->name : "?";
  CUresult r = !initialized ? kErrorNotInitialized : !f ? kErrorInvalidHandle : kSuccess;
  if (r == kSuccess && attr == 8) {
    // The opt-in limit holds static and dynamic shared memory together.
    if (value < 0 || value + f->static_smem > kSmemPerBlockOptin)
      r = kErrorInvalidValue;
    else
      f->max_dynamic = value;
  } else if (r == kSuccess && attr == 9) {
    if (value < -1 || value > 100)
      r = kErrorInvalidValue;  // percent, or CU_SHAREDMEM_CARVEOUT_DEFAULT
    else
      f->carveout = value;
  } else if (r == kSuccess) {
    r = kErrorInvalidValue;
  }
  return done(r, "cuFuncSetAttribute", "fn=%s attr=%d value=%d", name, attr, value);
}

EXPORT CUresult cuFuncGetParamInfo(CUfunction function, size_t index, size_t* offset, size_t* size) {
  begin();
  const struct CUfunc_st* f = initialized ? live_function(function) : NULL;
  const char* name = f ? f->name : "?";
  CUresult r = !initialized                  ? kErrorNotInitialized
               : !f                          ? kErrorInvalidHandle
               : index >= (size_t)f->nparams ? kErrorInvalidValue
                                             : kSuccess;
  size_t o = 0, s = 0;
  if (r == kSuccess) o = f->params[index].offset, s = f->params[index].size;
  if (r == kSuccess && offset) *offset = o;
  if (r == kSuccess && size) *size = s;
  return done(r, "cuFuncGetParamInfo", "fn=%s index=%zu offset=%zu size=%zu", name, index, o, s);
}

// Shared memory per SM for a carveout preference: the percentage of the
// most, rounded up to a size the SM can be split at.
static int carveout_smem(int carveout, int per_block) {
  static const int kSizes[] = {0, 8, 16, 32, 64, 100, 132, 164, 196, 228};
  const int want = carveout < 0 ? kSmemPerSm : (kSmemPerSm / 1024 * carveout + 99) / 100 * 1024;
  const int need = want > per_block ? want : per_block;  // one block always fits where it can at all
  for (size_t i = 0; i < sizeof kSizes / sizeof *kSizes; ++i)
    if (kSizes[i] * 1024 >= need) return kSizes[i] * 1024;
  return kSmemPerSm;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction function, int threads,
                                                            size_t dynamic_smem) {
  begin();
  const struct CUfunc_st* f = initialized ? live_function(function) : NULL;
  const char* name = f ? f->name : "?";
  CUresult r = !initialized              ? kErrorNotInitialized
               : !f                      ? kErrorInvalidHandle
               : !blocks || threads <= 0 ? kErrorInvalidValue
                                         : kSuccess;
  int n = 0;
  if (r == kSuccess && threads <= max_threads(f) && dynamic_smem <= (size_t)f->max_dynamic) {
    const int warps = (threads + 31) / 32;
    const int per_warp = (f->regs * 32 + 255) / 256 * 256;  // registers: 8 a thread at a time
    const int by_regs = per_warp ? kRegsPerSm / 4 / per_warp * 4 / warps : kBlocksPerSm;
    const int per_block = (f->static_smem + (int)dynamic_smem + kSmemReservedPerBlock + 127) / 128 * 128;
    const int by_smem = carveout_smem(f->carveout, per_block) / per_block;
    n = kThreadsPerSm / 32 / warps;
    if (kBlocksPerSm < n) n = kBlocksPerSm;
    if (by_regs < n) n = by_regs;
    if (by_smem < n) n = by_smem;
  }
  if (r == kSuccess) *blocks = n;
  return done(r, "cuOccupancyMaxActiveBlocksPerMultiprocessor", "fn=%s threads=%d smem=%zu blocks=%d", name,
              threads, dynamic_smem, n);
}

// ---------------------------------------------------------------- launches and streams

static uint64_t fnv1a(const unsigned char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// The parameter block a launch passes: kernelParams[i] points at parameter
// i, of the size the kernel declares; `extra` passes a whole block
// (CU_LAUNCH_PARAM_BUFFER_POINTER 1, CU_LAUNCH_PARAM_BUFFER_SIZE 2, then
// CU_LAUNCH_PARAM_END 0). Copied, as a driver does at the call.
static CUresult param_block(const struct CUfunc_st* f, void** params, void** extra, unsigned char** block,
                            size_t* size) {
  if (params && extra) return kErrorInvalidValue;
  if (extra) {
    const void* buffer = NULL;
    const size_t* buffer_size = NULL;
    for (; *extra; extra += 2) {
      if (*extra == (void*)1)
        buffer = extra[1];
      else if (*extra == (void*)2)
        buffer_size = extra[1];
      else
        return kErrorInvalidValue;
    }
    if (!buffer || !buffer_size || *buffer_size != f->param_bytes) return kErrorInvalidValue;
    *size = *buffer_size;
    *block = malloc(*size ? *size : 1);
    memcpy(*block, buffer, *size);
    return kSuccess;
  }
  if (!params && f->nparams) return kErrorInvalidValue;
  *size = f->param_bytes;
  *block = calloc(*size ? *size : 1, 1);
  for (int i = 0; i < f->nparams; ++i) {
    if (!params[i]) return kErrorInvalidValue;
    memcpy(*block + f->params[i].offset, params[i], f->params[i].size);
  }
  return kSuccess;
}

EXPORT CUresult cuLaunchKernel(CUfunction function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned smem, CUstream stream, void** params,
                               void** extra) {
  begin();
  const struct CUfunc_st* f = initialized ? live_function(function) : NULL;
  char grid[64], block[64];
  snprintf(grid, sizeof grid, gy == 1 && gz == 1 ? "%u" : "%ux%ux%u", gx, gy, gz);
  snprintf(block, sizeof block, by == 1 && bz == 1 ? "%u" : "%ux%ux%u", bx, by, bz);
  const unsigned long long threads = (unsigned long long)bx * by * bz;
  CUresult r = !initialized                                                      ? kErrorNotInitialized
               : !current                                                        ? kErrorInvalidContext
               : !f                                                              ? kErrorInvalidHandle
               : !gx || !gy || !gz || !bx || !by || !bz                          ? kErrorInvalidValue
               : gx > 0x7fffffffu || gy > 65535 || gz > 65535                    ? kErrorInvalidValue
               : bx > 1024 || by > 1024 || bz > 64 || threads > kThreadsPerBlock ? kErrorInvalidValue
               : threads > (unsigned)max_threads(f)                              ? kErrorOutOfResources
               : smem > (unsigned)f->max_dynamic                                 ? kErrorInvalidValue
                                                                                 : kSuccess;
  unsigned char* bytes = NULL;
  size_t size = 0;
  if (r == kSuccess) r = param_block(f, params, extra, &bytes, &size);
  const uint64_t hash = bytes ? fnv1a(bytes, size) : 0;
  free(bytes);
  return done(r, "cuLaunchKernel",
              "fn=%s grid=%s block=%s smem=%u stream=0x%llx ctx=%s params=%d size=%zu hash=%016llx via=%s",
              f ? f->name : "?", grid, block, smem, (unsigned long long)(uintptr_t)stream,
              context_name(current), f ? f->nparams : 0, size, (unsigned long long)hash,
              extra ? "extra" : "params");
}

EXPORT CUresult cuStreamIsCapturing(CUstream stream, int* status) {
  begin();
  // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: the legacy stream (NULL, CU_STREAM_LEGACY) asked while another
  // captures.
  const int legacy = stream == NULL || stream == (CUstream)0x1;
  const int s = config.capturing < 0 ? 0 : config.capturing;
  CUresult r = !initialized                     ? kErrorNotInitialized
               : !status                        ? kErrorInvalidValue
               : config.capturing < 0 && legacy ? kErrorCaptureImplicit
                                                : kSuccess;
  if (r == kSuccess) *status = s;
  return done(r, "cuStreamIsCapturing", "stream=0x%llx status=%d", (unsigned long long)(uintptr_t)stream, s);
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  begin();
  const int was = capture_mode;
  CUresult r = !initialized                      ? kErrorNotInitialized
               : !mode || *mode < 0 || *mode > 2 ? kErrorInvalidValue
                                                 : kSuccess;
  const int want = mode ? *mode : -1;
  if (r == kSuccess) capture_mode = *mode, *mode = was;
  return done(r, "cuThreadExchangeStreamCaptureMode", "mode=%d was=%d", want, was);
}

// The driver's own words for the errors above, with cuda.h's names (which
// tests look for).
EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
  begin();
  static const struct {
    CUresult code;
    const char* text;
  } kTexts[] = {
      {kSuccess, "no error (CUDA_SUCCESS)"},
      {kErrorInvalidValue, "invalid argument (CUDA_ERROR_INVALID_VALUE)"},
      {kErrorNotInitialized, "initialization error (CUDA_ERROR_NOT_INITIALIZED)"},
      {kErrorInvalidDevice, "invalid device ordinal (CUDA_ERROR_INVALID_DEVICE)"},
      {kErrorInvalidImage, "device kernel image is invalid (CUDA_ERROR_INVALID_IMAGE)"},
      {kErrorInvalidContext, "invalid device context (CUDA_ERROR_INVALID_CONTEXT)"},
      {kErrorNoBinaryForGpu,
       "no kernel image is available for execution on the device (CUDA_ERROR_NO_BINARY_FOR_GPU)"},
      {kErrorInvalidPtx, "a PTX JIT compilation failed (CUDA_ERROR_INVALID_PTX)"},
      {kErrorUnsupportedPtx,
       "the provided PTX was compiled with an unsupported toolchain (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)"},
      {kErrorInvalidHandle, "invalid resource handle (CUDA_ERROR_INVALID_HANDLE)"},
      {kErrorNotFound, "named symbol not found (CUDA_ERROR_NOT_FOUND)"},
      {kErrorOutOfResources, "too many resources requested for launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)"},
      {kErrorCaptureImplicit,
       "operation would make the legacy stream depend on a capturing blocking stream "
       "(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)"},
  };
  const char* found = NULL;
  for (size_t i = 0; i < sizeof kTexts / sizeof *kTexts; ++i)
    if (kTexts[i].code == error) found = kTexts[i].text;
  if (text) *text = found;
  return done(found && text ? kSuccess : kErrorInvalidValue, "cuGetErrorString", "error=%d", error);
}
