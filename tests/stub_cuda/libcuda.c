// A stand-in for the CUDA driver library (libcuda.so.1) for tests on machines
// with no GPU: the module's host code opens it by name where its folder is on
// LD_LIBRARY_PATH. Each call is checked much as a real driver checks it and
// logged as one line, "[pid] name key=value ... -> result"; nothing runs on a
// device, whose figures are an H100's. Built by tests/stub_cuda.py (plain
// C11, no CUDA header). Read from the environment at each call:
//   STUB_CUDA_LOG=path              the file the lines are appended to (unset: no log)
//   STUB_CUDA_ARCH=90               the GPU's compute capability, major*10+minor or "9.0" (default 90)
//   STUB_CUDA_REFUSE=cubin|ptx|all  refuse that kind of image at cuModuleLoadData
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <stdarg.h>
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

// cuda.h's CUDA_SUCCESS and CUDA_ERROR_* values.
enum { kSuccess = 0, kInvalidValue = 1, kNotInitialized = 3, kInvalidDevice = 101, kInvalidImage = 200 };
enum { kInvalidContext = 201, kNoBinaryForGpu = 209, kInvalidPtx = 218, kUnsupportedPtx = 222 };
enum { kInvalidHandle = 400, kNotFound = 500, kOutOfResources = 701 };

// An H100's figures; kSmemPerBlock is static and dynamic together without opt-in.
enum { kSmCount = 132, kSmemPerSm = 233472, kSmemReservedPerBlock = 1024, kSmemPerBlock = 49152 };
enum { kSmemPerBlockOptin = 232448, kThreadsPerSm = 2048, kRegsPerSm = 65536, kBlocksPerSm = 32 };
enum { kThreadsPerBlock = 1024, kPtxRegs = 32 /* what a PTX kernel is said to use */ };
enum { kMaxFuncs = 64, kMaxParams = 64 };

// The module looks this symbol up to know the driver is this stand-in, which
// runs nothing and so may be handed launches on fake addresses.
EXPORT const char flashmla_perm_stand_in[] = "tests/stub_cuda";

struct CUfunc_st {
  char name[256];
  int regs, static_smem, max_dynamic, nparams;
  size_t param_offset[kMaxParams], param_size[kMaxParams];
  size_t param_bytes;  // the parameter block: the end of its last parameter
};

struct CUmod_st {
  int nfuncs;
  struct CUfunc_st funcs[kMaxFuncs];
};

static _Thread_local struct {
  const char* log;
  int arch, refuse_cubin, refuse_ptx;
} config;  // the environment as this thread's latest call read it
static int initialized;
static struct CUctx_st {
  int device;
} primary;
static _Thread_local CUcontext current;
static _Thread_local int capture_mode;

// Every call starts here (so that even the first is logged): the environment
// read, and an error before cuInit or where a context is needed and none is current.
static CUresult begin(int needs_context) {
  config.log = getenv("STUB_CUDA_LOG");
  const char* arch = getenv("STUB_CUDA_ARCH");
  int major = 0, minor = 0;
  const int parts = arch ? sscanf(arch, "%d.%d", &major, &minor) : 0;
  config.arch = parts == 2 ? major * 10 + minor : parts == 1 && major > 0 ? major : 90;
  const char* refuse = getenv("STUB_CUDA_REFUSE") ? getenv("STUB_CUDA_REFUSE") : "";
  config.refuse_cubin = !strcmp(refuse, "cubin") || !strcmp(refuse, "all");
  config.refuse_ptx = !strcmp(refuse, "ptx") || !strcmp(refuse, "all");
  return !initialized ? kNotInitialized : needs_context && !current ? kInvalidContext : kSuccess;
}

// Logs the call and returns `r`. Each line is one write to the file, opened
// O_APPEND for it: lines of several processes (and forks) never mix.
__attribute__((format(printf, 3, 4))) static CUresult done(CUresult r, const char* name, const char* fmt,
                                                           ...) {
  const char* log = config.log ? config.log : "";
  const int fd = *log ? open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
  if (fd < 0) return r;
  char args[4096], line[8192];
  va_list list;
  va_start(list, fmt);
  vsnprintf(args, sizeof args, fmt, list);
  va_end(list);
  const int n = snprintf(line, sizeof line, "[%d] %s %s -> %d\n", (int)getpid(), name, args, r);
  const ssize_t ignored = write(fd, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
  (void)ignored;
  close(fd);
  return r;
}

static const char* context_name(CUcontext c) { return !c ? "none" : c == &primary ? "ctx0" : "other"; }

// The next kernel of module m (the loaders stop at kMaxFuncs).
static struct CUfunc_st* new_function(struct CUmod_st* m, const char* name, int regs, int smem) {
  struct CUfunc_st* f = &m->funcs[m->nfuncs++];
  snprintf(f->name, sizeof f->name, "%s", name);
  f->regs = regs, f->static_smem = smem, f->max_dynamic = kSmemPerBlock - smem;
  return f;
}

static void add_param(struct CUfunc_st* f, int index, size_t offset, size_t size) {
  if (index < 0 || index >= kMaxParams) return;
  f->param_offset[index] = offset, f->param_size[index] = size;
  if (index >= f->nparams) f->nparams = index + 1;
  if (offset + size > f->param_bytes) f->param_bytes = offset + size;
}

// ---------------------------------------------------------------- cubins

static uint32_t u32(const unsigned char* p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static int u16(const unsigned char* p) { return p[0] | p[1] << 8; }

static Elf64_Ehdr header(const unsigned char* image) {
  Elf64_Ehdr e;
  memcpy(&e, image, sizeof e);
  return e;
}

// Section i's header (zeros where i < 0) and name.
static Elf64_Shdr section(const unsigned char* image, int i) {
  Elf64_Shdr s = {0};
  if (i >= 0) memcpy(&s, image + header(image).e_shoff + (size_t)i * sizeof s, sizeof s);
  return s;
}

static const char* section_name(const unsigned char* image, int i) {
  return (const char*)image + section(image, header(image).e_shstrndx).sh_offset + section(image, i).sh_name;
}

// The section called prefix + name, or -1.
static int find_section(const unsigned char* image, const char* prefix, const char* name) {
  for (int i = 1; i < header(image).e_shnum; ++i) {
    const char* s = section_name(image, i);
    if (!strncmp(s, prefix, strlen(prefix)) && !strcmp(s + strlen(prefix), name)) return i;
  }
  return -1;
}

// A cubin's .nv.info sections hold records: u8 format, u8 attribute, u16;
// format 4 (EIFMT_SVAL) has that many bytes of payload after it, the others
// hold their value in the u16.
struct Record {
  int attr, sval, value;  // value: an SVAL's payload bytes, else the value itself
  const unsigned char* data;
};
enum {
  kKparamInfo = 0x17,  // EIATTR_KPARAM_INFO {index, ordinal | offset << 16, size << 18}
  kRegcount = 0x2f,    // EIATTR_REGCOUNT {symbol, registers}, in the global .nv.info
  kAccelerator = 0x09  // .nv.compat's EICOMPAT_ATTR_CUDA_ACCELERATOR_TARGET (CUDA 13's sm_XYa)
};

// The record at *at in section i (none where i < 0), and *at moved past it.
static int next_record(const unsigned char* image, int i, size_t* at, struct Record* r) {
  const Elf64_Shdr s = section(image, i);
  const unsigned char* p = image + s.sh_offset + *at;
  if (*at + 4 > s.sh_size) return 0;
  *r = (struct Record){p[1], p[0] == 4, u16(p + 2), p + 4};
  *at += 4 + (r->sval ? (size_t)r->value : 0);
  return *at <= s.sh_size;
}

// A cubin runs on a GPU of its major and a minor at least its own; an
// arch-specific one (sm_XYa) only on exactly its SM. e_flags holds the SM in
// bits 0-7 for ELF ABI version 7 ('a': 0x800), in bits 8-15 for version 8
// ('a': 0x8 in CUDA 12, a .nv.compat record in CUDA 13).
static CUresult load_cubin(const unsigned char* image, struct CUmod_st* m, char* what, size_t what_size) {
  const Elf64_Ehdr e = header(image);
  if (e.e_ident[EI_CLASS] != ELFCLASS64 || e.e_machine != 190 || e.e_shstrndx >= e.e_shnum)
    return kInvalidImage;
  const int abi = e.e_ident[EI_ABIVERSION], sm = (int)(abi >= 8 ? e.e_flags >> 8 : e.e_flags) & 0xff;
  int accelerated = (e.e_flags & (abi >= 8 ? 0x8 : 0x800)) != 0;
  struct Record r;
  for (size_t at = 0; next_record(image, find_section(image, ".nv.compat", ""), &at, &r);)
    if (r.attr == kAccelerator && !r.sval && r.value) accelerated = 1;
  snprintf(what, what_size, "kind=cubin arch=sm_%d%s abi=%d", sm, accelerated ? "a" : "", abi);
  if (accelerated ? sm != config.arch : sm / 10 != config.arch / 10 || sm % 10 > config.arch % 10)
    return kNoBinaryForGpu;
  if (config.refuse_cubin) return kInvalidImage;
  // The kernels: each has a section .nv.info.<name>; .text.<name>'s sh_info
  // is its symbol index (by which the global .nv.info names it) and, in old
  // toolkits' cubins, its registers in the top byte.
  for (int i = 1; i < e.e_shnum && m->nfuncs < kMaxFuncs; ++i) {
    const char* name = section_name(image, i) + strlen(".nv.info.");
    if (strncmp(section_name(image, i), ".nv.info.", strlen(".nv.info."))) continue;
    const uint32_t symbol = section(image, find_section(image, ".text.", name)).sh_info;
    const int smem = (int)section(image, find_section(image, ".nv.shared.", name)).sh_size;
    struct CUfunc_st* f = new_function(m, name, (int)(symbol >> 24), smem);
    for (size_t at = 0; next_record(image, find_section(image, ".nv.info", ""), &at, &r);)
      if (r.attr == kRegcount && r.sval && r.value >= 8 && u32(r.data) == (symbol & 0xffffff))
        f->regs = (int)u32(r.data + 4);
    for (size_t at = 0; next_record(image, i, &at, &r);)
      if (r.attr == kKparamInfo && r.sval && r.value >= 12)
        add_param(f, u16(r.data + 4), (size_t)u16(r.data + 6), (u32(r.data + 8) >> 18) & 0x3fff);
  }
  return kSuccess;
}

// ---------------------------------------------------------------- PTX

// The bytes of a .param type (.b8, .u32, .f64, ...); 0 for another word.
static size_t type_size(const char* w) {
  const int bits = w[0] == '.' && w[1] && strchr("busf", w[1]) ? atoi(w + 2) : 0;
  return bits == 8 || bits == 16 || bits == 32 || bits == 64 ? (size_t)bits / 8 : 0;
}

// A kernel's parameters, between its "(" and ")": comma-separated
// ".param [.align A] .TYPE [.ptr .SPACE .align P] NAME[[N]]", each at its
// alignment (an .align after the type is the pointee's).
static void ptx_params(const char* p, const char* end, struct CUfunc_st* f) {
  for (const char* stop; p < end; p = stop + 1) {
    stop = memchr(p, ',', (size_t)(end - p));
    stop = stop ? stop : end;
    char decl[1024], *save = NULL;
    snprintf(decl, sizeof decl, "%.*s", (int)(stop - p), p);
    size_t align = 0, size = 0, count = 1;
    for (char* w = strtok_r(decl, " \t\r\n", &save); w; w = strtok_r(NULL, " \t\r\n", &save)) {
      if (!strcmp(w, ".align") && (w = strtok_r(NULL, " \t\r\n", &save)) && !size) align = (size_t)atoi(w);
      if (w && !size) size = type_size(w);
      if (w && strchr(w, '[')) count = (size_t)atoi(strchr(w, '[') + 1);
    }
    if (!size) continue;
    align = align ? align : size;
    add_param(f, f->nparams, (f->param_bytes + align - 1) / align * align, size * count);
  }
}

// PTX is compiled at load: it runs on its .target's SM and any later one
// (sm_XYa only on XY).
static CUresult load_ptx(const char* text, struct CUmod_st* m, char* what, size_t what_size) {
  const char* target = strstr(text, ".target");
  int sm = 0;
  char suffix = 0, name[256];
  if (target) sscanf(target, ".target sm_%d%c", &sm, &suffix);
  snprintf(what, what_size, "kind=ptx target=sm_%d%s", sm, suffix == 'a' ? "a" : "");
  if (!sm || (suffix == 'a' ? sm != config.arch : sm > config.arch)) return kInvalidPtx;
  if (config.refuse_ptx) return kUnsupportedPtx;
  for (const char* p = text; (p = strstr(p, ".entry")) != NULL && m->nfuncs < kMaxFuncs; ++p) {
    if (sscanf(p, ".entry %255[A-Za-z0-9_$]", name) != 1) continue;
    const char *open = strchr(p, '('), *close = open ? strchr(open, ')') : NULL, *body = strchr(p, '{');
    if (!close || (body && body < open)) return kInvalidPtx;
    ptx_params(open + 1, close, new_function(m, name, kPtxRegs, 0));
  }
  return kSuccess;
}

// ---------------------------------------------------------------- device and context

EXPORT CUresult cuInit(unsigned flags) {
  begin(0);
  initialized = initialized || flags == 0;
  return done(flags ? kInvalidValue : kSuccess, "cuInit", "flags=%u arch=%d", flags, config.arch);
}

EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  CUresult r = begin(0);
  if (!r) r = !device ? kInvalidValue : ordinal ? kInvalidDevice : kSuccess;
  if (!r) *device = 0;
  return done(r, "cuDeviceGet", "ordinal=%d", ordinal);
}

EXPORT CUresult cuDeviceGetAttribute(int* value, int attr, CUdevice device) {
  CUresult r = begin(0);
  // (CU_DEVICE_ATTRIBUTE_*, its value) for those the module reads; 75 and 76 are the compute capability.
  static const int kAttributes[] = {16, kSmCount,   39,  kThreadsPerSm, 81,  kSmemPerSm,
                                    82, kRegsPerSm, 106, kBlocksPerSm,  111, kSmemReservedPerBlock};
  int v = attr == 75 ? config.arch / 10 : attr == 76 ? config.arch % 10 : -1;
  for (size_t i = 0; i < sizeof kAttributes / sizeof *kAttributes; i += 2)
    if (kAttributes[i] == attr) v = kAttributes[i + 1];
  if (!r) r = !value || v < 0 ? kInvalidValue : device ? kInvalidDevice : kSuccess;
  if (!r) *value = v;
  return done(r, "cuDeviceGetAttribute", "attr=%d dev=%d value=%d", attr, device, v);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  CUresult r = begin(0);
  if (!r) r = !context ? kInvalidValue : device ? kInvalidDevice : kSuccess;
  if (!r) *context = &primary;
  return done(r, "cuDevicePrimaryCtxRetain", "dev=%d ctx=ctx0", device);
}

EXPORT CUresult cuCtxGetCurrent(CUcontext* context) {
  CUresult r = begin(0);
  if (!r && !context) r = kInvalidValue;
  if (!r) *context = current;
  return done(r, "cuCtxGetCurrent", "ctx=%s", context_name(current));
}

// Only the primary context exists (NULL unbinds the thread's).
EXPORT CUresult cuCtxSetCurrent(CUcontext context) {
  CUresult r = begin(0);
  const CUcontext was = current;
  if (!r && context && context != &primary) r = kInvalidContext;
  if (!r) current = context;
  return done(r, "cuCtxSetCurrent", "ctx=%s was=%s", context_name(context), context_name(was));
}

// ---------------------------------------------------------------- modules and functions

EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  CUresult r = begin(1);
  char what[512] = "kind=unknown";
  if (!r && (!module || !image)) r = kInvalidValue;
  struct CUmod_st* m = r ? NULL : calloc(1, sizeof *m);
  if (m)
    r = !memcmp(image, ELFMAG, SELFMAG) ? load_cubin(image, m, what, sizeof what)
        : strstr(image, ".version")     ? load_ptx(image, m, what, sizeof what)
                                        : kInvalidImage;
  if (!r) *module = m;
  done(r, "cuModuleLoadData", "%s gpu=sm_%d kernels=%d", what, config.arch, m ? m->nfuncs : 0);
  if (r) free(m);
  return r;
}

EXPORT CUresult cuModuleGetFunction(CUfunction* function, CUmodule m, const char* name) {
  CUresult r = begin(1);
  if (!r) r = !m ? kInvalidHandle : !function || !name ? kInvalidValue : kNotFound;
  const struct CUfunc_st* f = NULL;
  for (int i = 0; r == kNotFound && i < m->nfuncs; ++i)
    if (!strcmp(m->funcs[i].name, name)) f = *function = &m->funcs[i], r = kSuccess;
  return done(r, "cuModuleGetFunction", "name=%s regs=%d smem=%d params=%d size=%zu", name ? name : "(null)",
              f ? f->regs : 0, f ? f->static_smem : 0, f ? f->nparams : 0, f ? f->param_bytes : 0);
}

EXPORT CUresult cuModuleUnload(CUmodule m) {
  CUresult r = begin(1);
  if (!r && !m) r = kInvalidHandle;
  if (!r) free(m);
  return done(r, "cuModuleUnload", "%s", "");
}

// CU_FUNC_ATTRIBUTE_NUM_REGS (4) and _MAX_DYNAMIC_SHARED_SIZE_BYTES (8).
EXPORT CUresult cuFuncGetAttribute(int* value, int attr, CUfunction f) {
  CUresult r = begin(0);
  const int v = !f ? 0 : attr == 4 ? f->regs : attr == 8 ? f->max_dynamic : -1;
  if (!r) r = !f ? kInvalidHandle : !value || v < 0 ? kInvalidValue : kSuccess;
  if (!r) *value = v;
  return done(r, "cuFuncGetAttribute", "fn=%s attr=%d value=%d", f ? f->name : "?", attr, v);
}

// _MAX_DYNAMIC_SHARED_SIZE_BYTES (8), within the opt-in limit of static and
// dynamic together, and _PREFERRED_SHARED_MEMORY_CARVEOUT (9), a percentage or -1.
EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attr, int value) {
  CUresult r = begin(0);
  const int valid = f && attr == 8 ? value >= 0 && value + f->static_smem <= kSmemPerBlockOptin
                                   : attr == 9 && value >= -1 && value <= 100;
  if (!r) r = !f ? kInvalidHandle : !valid ? kInvalidValue : kSuccess;
  if (!r && attr == 8) f->max_dynamic = value;
  return done(r, "cuFuncSetAttribute", "fn=%s attr=%d value=%d", f ? f->name : "?", attr, value);
}

EXPORT CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t* offset, size_t* size) {
  CUresult r = begin(0);
  if (!r) r = !f ? kInvalidHandle : index >= (size_t)f->nparams ? kInvalidValue : kSuccess;
  const size_t o = r ? 0 : f->param_offset[index], s = r ? 0 : f->param_size[index];
  if (!r && offset) *offset = o;
  if (!r && size) *size = s;
  return done(r, "cuFuncGetParamInfo", "fn=%s index=%zu offset=%zu size=%zu", f ? f->name : "?", index, o, s);
}

static int min(int a, int b) { return a < b ? a : b; }

// The fewest blocks per SM that its threads, registers, shared memory and
// block limit allow (not the real calculator's granularities or carveouts).
EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction f, int threads,
                                                            size_t smem) {
  CUresult r = begin(0);
  if (!r) r = !f ? kInvalidHandle : !blocks || threads <= 0 || threads > kThreadsPerBlock ? kInvalidValue : 0;
  const int warp_threads = (threads + 31) / 32 * 32, regs = f && f->regs ? f->regs : 1;
  const int n = r ? 0
                  : min(min(kBlocksPerSm, kThreadsPerSm / warp_threads),
                        min(kRegsPerSm / (regs * warp_threads),
                            kSmemPerSm / (f->static_smem + (int)smem + kSmemReservedPerBlock)));
  if (!r) *blocks = n;
  return done(r, "cuOccupancyMaxActiveBlocksPerMultiprocessor", "fn=%s threads=%d smem=%zu blocks=%d",
              f ? f->name : "?", threads, smem, n);
}

// ---------------------------------------------------------------- launches and streams

// The size of the parameter block a launch passes, or -1 where it is not the
// kernel's: kernelParams[i] points at parameter i, or `extra` passes the block
// (CU_LAUNCH_PARAM_BUFFER_POINTER 1, _BUFFER_SIZE 2, then _END 0).
static long param_block(const struct CUfunc_st* f, void** params, void** extra) {
  const void *buffer = NULL, *size = NULL;
  for (int i = 0; !extra && i < f->nparams; ++i)
    if (!params || !params[i]) return -1;
  for (; extra && (*extra == (void*)1 || *extra == (void*)2); extra += 2)
    *(*extra == (void*)1 ? &buffer : &size) = extra[1];
  if (!extra) return (long)f->param_bytes;
  const int whole = !params && !*extra && buffer && size && *(const size_t*)size == f->param_bytes;
  return whole ? (long)f->param_bytes : -1;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned smem, CUstream stream, void** params, void** extra) {
  CUresult r = begin(1);
  const unsigned long long threads = (unsigned long long)bx * by * bz;
  const long size = f ? param_block(f, params, extra) : -1;
  const int grid_ok = gx && gy && gz && gx <= 0x7fffffffu && gy <= 65535 && gz <= 65535;
  const int block_ok = threads && bx <= 1024 && by <= 1024 && bz <= 64 && threads <= kThreadsPerBlock;
  if (!r && !f) r = kInvalidHandle;
  if (!r && (!grid_ok || !block_ok || size < 0 || smem > (unsigned)f->max_dynamic)) r = kInvalidValue;
  if (!r && threads * f->regs > kRegsPerSm) r = kOutOfResources;  // more registers than an SM has
  return done(r, "cuLaunchKernel",
              "fn=%s grid=%ux%ux%u block=%ux%ux%u smem=%u stream=%p ctx=%s size=%ld via=%s",
              f ? f->name : "?", gx, gy, gz, bx, by, bz, smem, (void*)stream, context_name(current), size,
              extra ? "extra" : "params");
}

// No stream ever captures here.
EXPORT CUresult cuStreamIsCapturing(CUstream stream, int* status) {
  CUresult r = begin(0);
  if (!r && !status) r = kInvalidValue;
  if (!r) *status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  return done(r, "cuStreamIsCapturing", "stream=%p status=0", (void*)stream);
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  CUresult r = begin(0);
  const int was = capture_mode, want = mode ? *mode : -1;
  if (!r && (want < 0 || want > 2)) r = kInvalidValue;
  if (!r) capture_mode = want, *mode = was;
  return done(r, "cuThreadExchangeStreamCaptureMode", "mode=%d was=%d", want, was);
}

// The names of a few errors: those that refuse an image, and the commonest.
static const char* error_name(CUresult error) {
  switch (error) {
    case kSuccess: return "CUDA_SUCCESS";
    case kInvalidValue: return "CUDA_ERROR_INVALID_VALUE";
    case kInvalidImage: return "CUDA_ERROR_INVALID_IMAGE";
    case kNoBinaryForGpu: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case kInvalidPtx: return "CUDA_ERROR_INVALID_PTX";
    case kUnsupportedPtx: return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    default: return NULL;
  }
}

EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
  begin(0);
  if (text) *text = error_name(error);
  return done(text && *text ? kSuccess : kInvalidValue, "cuGetErrorString", "error=%d", error);
}
