// Loaded into a process that may crash (LD_PRELOAD; crash_handler_install
// again after Python's faulthandler, so that this sees the fault and not
// faulthandler's re-raise): on SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT it
// writes, with async-signal-safe calls only, the signal, si_code, si_addr,
// pc, sp and /proc/self/maps, and only then tries a backtrace (a context that
// cannot be unwound may die inside it); then calls the handler it replaced
// (faulthandler: the Python stack) and takes the default action, so the exit
// status stays the signal's. Writes to the stderr the process started with
// (pytest's capture replaces fd 2 later), or to $CRASH_HANDLER_OUT.
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

static void say_num(const char* label, uintptr_t v, int hex) {  // v as hex, or as a signed decimal
  char buf[32];
  int i = sizeof buf - 1, neg = !hex && (intptr_t)v < 0;
  if (neg) v = -v;
  buf[i] = 0;
  do {
    buf[--i] = "0123456789abcdef"[v % (hex ? 16 : 10)];
    v /= hex ? 16 : 10;
  } while (v);
  if (hex) buf[--i] = 'x', buf[--i] = '0';
  if (neg) buf[--i] = '-';
  say(label);
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
  pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP], sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
  pc = (uintptr_t)uc->uc_mcontext.pc, sp = (uintptr_t)uc->uc_mcontext.sp;
#endif
  say_num("\ncrash_handler: signal ", (uintptr_t)sig, 0);
  say_num(" si_code ", (uintptr_t)(intptr_t)info->si_code, 0);
  say_num(" si_addr ", (uintptr_t)info->si_addr, 1);
  say_num(" pc ", pc, 1);
  say_num(" sp ", sp, 1);
  say_num(" pid ", (uintptr_t)getpid(), 0);
  say("\ncrash_handler: maps\n");
  const int maps = open("/proc/self/maps", O_RDONLY);
  char buf[4096];
  for (ssize_t n; maps >= 0 && (n = read(maps, buf, sizeof buf)) > 0;) (void)!write(out_fd, buf, (size_t)n);
  say("crash_handler: backtrace\n");
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), out_fd);
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
  stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
  sigaltstack(&ss, 0);
  const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; ++i) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
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
