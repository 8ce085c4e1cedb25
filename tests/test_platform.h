/* test_platform.h - the POSIX calls the tests make that Windows lacks or names otherwise,
   for the tests built by make cross-test's Windows part (MinGW-w64, run under Wine). For
   tests/ only; the library's own calls go through src/platform.h.

   On Windows: setenv and unsetenv (_putenv_s: the C runtime's getenv, the library's
   included, sees the change), mkdir(path, mode) (_mkdir: the mode has no meaning there),
   sleep; <windows.h>'s empty IN and OUT undefined. Everywhere: test_temp_dir makes a new private directory "<stem>.XXXXXX" under
   $TMPDIR or /tmp (mkdtemp) or, on Windows, "<stem>.<pid>.<n>" under %TEMP%; test_cpu_count is the
   number of online processors (sysconf, GetSystemInfo); test_temp_file creates a new
   file "<stem>.XXXXXX" the same way and opens it for reading and writing (mkstemp;
   _open with O_EXCL on Windows), giving the descriptor or -1; test_remove_tree removes a
   directory and all in it (rm -rf, rmdir /s /q). On POSIX this header adds no names but
   those three and TEST_NULL_DEVICE, the path of the null device ("/dev/null", "NUL"): include it after the system headers and pdp.h (which brings
   <windows.h> on Windows). */
#ifndef PDP_TEST_PLATFORM_H
#define PDP_TEST_PLATFORM_H
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#ifdef _WIN32
#include <direct.h>
#include <io.h>
#include <process.h>
#include <windows.h>
#undef IN  /* <windows.h>'s annotations, empty: the tests name sizes IN and OUT */
#undef OUT

static inline int setenv(const char *name, const char *value, int overwrite)
{
    if (!overwrite && getenv(name)) return 0;
    return _putenv_s(name, value) == 0 ? 0 : -1;
}

static inline int unsetenv(const char *name)
{
    return _putenv_s(name, "") == 0 ? 0 : -1; /* an empty value removes the variable */
}

#define TEST_NULL_DEVICE "NUL"
#define mkdir(path, mode) ((void)(mode), _mkdir(path))
#define sleep(seconds) (Sleep((DWORD)(seconds) * 1000u), 0u)

static inline int test_temp_dir(char *out, size_t cap, const char *stem)
{
    const char *t = getenv("TEMP");
    int k;
    for (k = 0; k < 1000; k++) {
        if ((size_t)snprintf(out, cap, "%s\\%s.%lu.%d", t && *t ? t : ".", stem,
                             (unsigned long)GetCurrentProcessId(), k) >= cap)
            return -1;
        if (_mkdir(out) == 0) return 0;
        if (errno != EEXIST) return -1;
    }
    return -1;
}

static inline int test_temp_file(char *out, size_t cap, const char *stem)
{
    const char *t = getenv("TEMP");
    int k, fd;
    for (k = 0; k < 1000; k++) {
        if ((size_t)snprintf(out, cap, "%s\\%s.%lu.%d", t && *t ? t : ".", stem,
                             (unsigned long)GetCurrentProcessId(), k) >= cap)
            return -1;
        fd = _open(out, _O_CREAT | _O_EXCL | _O_RDWR | _O_BINARY, _S_IREAD | _S_IWRITE);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

static inline int test_remove_tree(const char *dir)
{
    char cmd[1024];
    if ((size_t)snprintf(cmd, sizeof cmd, "rmdir /s /q \"%s\"", dir) >= sizeof cmd) return -1;
    return system(cmd);
}

static inline long test_cpu_count(void)
{
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return (long)si.dwNumberOfProcessors;
}
#else
#include <unistd.h>

#define TEST_NULL_DEVICE "/dev/null"

static inline int test_temp_dir(char *out, size_t cap, const char *stem)
{
    const char *t = getenv("TMPDIR");
    if ((size_t)snprintf(out, cap, "%s/%s.XXXXXX", t && *t ? t : "/tmp", stem) >= cap) return -1;
    return mkdtemp(out) ? 0 : -1;
}

static inline int test_temp_file(char *out, size_t cap, const char *stem)
{
    const char *t = getenv("TMPDIR");
    if ((size_t)snprintf(out, cap, "%s/%s.XXXXXX", t && *t ? t : "/tmp", stem) >= cap) return -1;
    return mkstemp(out);
}

static inline int test_remove_tree(const char *dir)
{
    char cmd[1024];
    if ((size_t)snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir) >= sizeof cmd) return -1;
    return system(cmd);
}

static inline long test_cpu_count(void) { return sysconf(_SC_NPROCESSORS_ONLN); }
#endif
#endif /* PDP_TEST_PLATFORM_H */
