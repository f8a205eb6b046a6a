// Loaded into a process that may crash (LD_PRELOAD, or ctypes and
// crash_handler_install): on SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT it
// writes, with async-signal-safe calls only, the signal, si_code, si_addr,
// the instruction and stack pointers and /proc/self/maps, and only then
// tries a backtrace (a context that cannot be unwound may die inside it, so
// the record comes first); then the handler it replaced, if any (Python's
// faulthandler: the Python stack), and the signal's default action, so the
// exit status stays the signal's. Installed after faulthandler, it sees the
// fault itself, not faulthandler's re-raise. Writes to the stderr the
// process started with (pytest's capture replaces fd 2 later), or to
// $CRASH_HANDLER_OUT.
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static int out_fd = 2;
static struct sigaction previous[65];
static volatile sig_atomic_t entered = 0;

static void say(const char* s) { (void)!write(out_fd, s, strlen(s)); }

static void say_hex(uintptr_t v) {
  char buf[2 + 2 * sizeof v + 1];
  int i = sizeof buf - 1;
  buf[i] = 0;
  do {
    buf[--i] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v && i > 2);
  buf[--i] = 'x';
  buf[--i] = '0';
  say(buf + i);
}

static void say_int(long v) {
  char buf[24];
  int i = sizeof buf - 1, neg = v < 0;
  unsigned long u = neg ? -(unsigned long)v : (unsigned long)v;
  buf[i] = 0;
  do {
    buf[--i] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (neg) buf[--i] = '-';
  say(buf + i);
}

static void die(int sig) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, 0);
  raise(sig);
}

static void on_fatal(int sig, siginfo_t* info, void* uctx) {
  if (entered) die(sig);  // the previous handler re-raised it (or this one faulted)
  entered = 1;
  uintptr_t pc = 0, sp = 0;
  const ucontext_t* uc = (const ucontext_t*)uctx;
#if defined(__x86_64__)
  pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
  sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
  pc = (uintptr_t)uc->uc_mcontext.pc;
  sp = (uintptr_t)uc->uc_mcontext.sp;
#else
  (void)uc;
#endif
  say("\ncrash_handler: signal ");
  say_int(sig);
  say(" si_code ");
  say_int(info ? info->si_code : 0);
  say(" si_addr ");
  say_hex(info ? (uintptr_t)info->si_addr : 0);
  say(" pc ");
  say_hex(pc);
  say(" sp ");
  say_hex(sp);
  say(" pid ");
  say_int(getpid());
  say("\ncrash_handler: maps\n");
  const int maps = open("/proc/self/maps", O_RDONLY);
  if (maps >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = read(maps, buf, sizeof buf)) > 0) (void)!write(out_fd, buf, (size_t)n);
    close(maps);
  }
  say("crash_handler: backtrace\n");
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, out_fd);
  say("crash_handler: end\n");
  const struct sigaction* prev = &previous[sig];
  if (prev->sa_flags & SA_SIGINFO) {
    if (prev->sa_sigaction) prev->sa_sigaction(sig, info, uctx);
  } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
    prev->sa_handler(sig);
  }
  die(sig);
}

void crash_handler_install(void) {
  static char alt[1 << 16];  // a stack of its own: a stack overflow still gets its record
  stack_t ss;
  memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  sigaltstack(&ss, 0);
  const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; ++i) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    struct sigaction old;
    sigaction(sigs[i], &sa, &old);
    if (!(old.sa_flags & SA_SIGINFO && old.sa_sigaction == on_fatal)) previous[sigs[i]] = old;
  }
}

__attribute__((constructor)) static void load(void) {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc_s now, not inside the handler
  const char* path = getenv("CRASH_HANDLER_OUT");
  const int fd = path && *path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : dup(2);
  if (fd >= 0) out_fd = fd;
  crash_handler_install();
}
