/* child_process.h - the tests' child processes: this binary again, in a mode its main()
   reads from argv[1], on POSIX and on Windows. For tests/ only.

   child_spawn starts it with argv (argv[0] its name): fork + exec on POSIX (under a
   user-mode emulator the kernel cannot run the binary itself: $PDP_TEST_EXEC names the
   emulator, make cross-test sets qemu-aarch64, which then runs the path /proc/self/exe
   reads as), CreateProcess on Windows. child_wait reaps it and gives its exit status (-1
   for a signal); child_wait_until does the same unless `seconds` pass first (then 0, the
   child left running; else 1); child_kill kills it (SIGKILL, TerminateProcess) and reaps
   it; child_nap sleeps a moment; child_pause sleeps until the process is killed (a child that
   stands for a live process). pdp.h comes first (<windows.h> on Windows). */
#ifndef PDP_TEST_CHILD_PROCESS_H
#define PDP_TEST_CHILD_PROCESS_H
#include <stdio.h>
#include <stdlib.h>
#ifdef _WIN32
typedef struct child {
    HANDLE h;
    long pid;
} child;

static inline int child_spawn(child *c, char *const argv[])
{
    char self[MAX_PATH], cmd[4096];
    size_t n;
    int i;
    STARTUPINFOA si;
    PROCESS_INFORMATION pi;
    if (!GetModuleFileNameA(NULL, self, sizeof self)) return -1;
    n = (size_t)snprintf(cmd, sizeof cmd, "\"%s\"", self);
    for (i = 1; argv[i] && n < sizeof cmd; i++)
        n += (size_t)snprintf(cmd + n, sizeof cmd - n, " \"%s\"", argv[i]);
    memset(&si, 0, sizeof si);
    si.cb = sizeof si;
    if (n >= sizeof cmd || !CreateProcessA(self, cmd, NULL, NULL, FALSE, 0, NULL, NULL, &si, &pi))
        return -1;
    CloseHandle(pi.hThread);
    c->h = pi.hProcess;
    c->pid = (long)pi.dwProcessId;
    return 0;
}

static inline int child_wait(child *c)
{
    DWORD code = 1;
    WaitForSingleObject(c->h, INFINITE);
    GetExitCodeProcess(c->h, &code);
    CloseHandle(c->h);
    return (int)code;
}

static inline int child_wait_until(child *c, double seconds, int *code)
{
    DWORD ms = seconds <= 0 ? 0 : (DWORD)(seconds * 1000.0);
    if (WaitForSingleObject(c->h, ms) != WAIT_OBJECT_0) return 0;
    *code = child_wait(c);
    return 1;
}

static inline void child_kill(child *c)
{
    TerminateProcess(c->h, 137);
    (void)child_wait(c);
}

static inline void child_nap(void) { Sleep(1); }

static inline void child_pause(void) { Sleep(INFINITE); }
#else
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
typedef struct child {
    pid_t pid_;
    long pid;
} child;

static inline void exec_self(char *const argv[])
{
    const char *emu = getenv("PDP_TEST_EXEC");
    char self[4096], *args[8];
    ssize_t len;
    int i;
    if (!emu || !*emu) {
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) _exit(127);
    self[len] = '\0';
    args[0] = (char *)emu;
    args[1] = self;
    for (i = 1; argv[i] && i < 7; i++) args[i + 1] = argv[i];
    args[i + 1] = NULL;
    execvp(emu, args);
    _exit(127);
}

static inline int child_spawn(child *c, char *const argv[])
{
    fflush(stdout);
    fflush(stderr);
    c->pid_ = fork();
    if (c->pid_ < 0) return -1;
    if (c->pid_ == 0) exec_self(argv);
    c->pid = (long)c->pid_;
    return 0;
}

static inline int child_wait(child *c)
{
    int status = -1;
    if (waitpid(c->pid_, &status, 0) != c->pid_) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline void child_nap(void);

static inline int child_wait_until(child *c, double seconds, int *code)
{
    int status = -1, k;
    for (k = 0; k <= (int)(seconds * 1e4); k++) { /* 0.1 ms naps */
        pid_t w = waitpid(c->pid_, &status, WNOHANG);
        if (w == c->pid_) {
            *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            return 1;
        }
        if (w < 0) {
            *code = -1;
            return 1;
        }
        child_nap();
    }
    return 0;
}

static inline void child_kill(child *c)
{
    kill(c->pid_, SIGKILL);
    (void)child_wait(c);
}

static inline void child_nap(void)
{
    struct timespec pause_ = {0, 100000}; /* 0.1 ms */
    nanosleep(&pause_, NULL);
}

static inline void child_pause(void) { pause(); }
#endif
#endif /* PDP_TEST_CHILD_PROCESS_H */
