// LD_PRELOAD'ed into a process that may crash: on SIGSEGV, SIGBUS, SIGILL,
// SIGFPE or SIGABRT it writes the native stack to stderr (each frame as
// "object(symbol+offset) [address]", which addr2line resolves), then lets
// the signal kill the process as it would have. Tool-free: the GPU machine
// has no gdb. bench/crash_probe.py builds and uses it.
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void say(const char* s) { (void)!write(2, s, strlen(s)); }

static void on_fatal(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  say("segv_backtrace: native stack at signal ");
  say(sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGILL ? "SIGILL"
      : sig == SIGFPE ? "SIGFPE" : "SIGABRT");
  say("\n");
  backtrace_symbols_fd(frames, n, 2);
  say("segv_backtrace: end\n");
  signal(sig, SIG_DFL);  // the default action: the process dies of it, as before
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc_s now, not inside the handler
  // A stack of its own, so that a stack overflow still gets its frames written.
  static char alt[1 << 16];
  stack_t ss;
  memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  sigaltstack(&ss, 0);
  const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; ++i) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER | SA_ONSTACK;
    sigaction(sigs[i], &sa, 0);
  }
}
