#!/usr/bin/env python3
"""Write pdp.h from the modules in src/.

pdp.h = manual (src/manual.txt) + strict-C99 prelude + public API (the API
headers below, in order) + shared host/device math + implementation (the .c
modules below, in order, under PDP_IMPLEMENTATION) + licence.

Usage:
  python3 amalgamate.py                   write pdp.h
  python3 amalgamate.py --check           exit 1, naming the module, when pdp.h is stale
  python3 amalgamate.py --output PATH     write PATH instead of pdp.h
  python3 amalgamate.py --line-directives emit #line directives into src/ (development
                                          builds only; never for the committed pdp.h)

The output is byte-identical on every run: no timestamps, no absolute paths.
Python standard library only.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(ROOT, "src")

# The public API, in dependency order. Each is a plain C header.
API = [
    "base.h",
    "tensor.h",
    "ops.h",
    "model.h",
    "optim.h",
    "data.h",
    "checkpoint.h",
    "store.h",
    "rendezvous.h",
    "comm.h",
    "dp.h",
    "ddp.h",
    "pp.h",
    "cuda.h",
]
# Math written once for the CPU and for pdp_cuda.cu (PDP__HOSTDEV helpers).
SHARED = ["math.h"]
# The implementation, in dependency order.
IMPL = [
    "internal.h",
    "base.c",
    "threads.c",
    "tensor.c",
    "gemm.c",
    "ops.c",
    "layers.c",
    "layers_conv.c",
    "layers_table.c",
    "model.c",
    "loss.c",
    "optim.c",
    "data.c",
    "sampler.c",
    "json.c",
    "checkpoint.c",
    "trace.c",
    "store.c",
    "rendezvous.c",
    "comm_queue.c",
    "comm_local.c",
    "comm_mpi.c",
    "comm_nccl.c",
    "comm.c",
    "dp.c",
    "reducer.c",
    "ddp.c",
    "pp.c",
    "cuda_host.c",
]
EXTRA = ["manual.txt", "license.txt"]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


class Error(Exception):
    pass


def read(name):
    path = os.path.join(SRC, name)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise Error("cannot read src/%s: %s" % (name, e.strerror))


def module(name, seen, lines_out, owners, line_directives):
    """Append src/name wrapped in banners; quoted includes of src/ headers are
    inlined at first use and commented out after that."""
    def emit(text, owner):
        lines_out.append(text)
        owners.append(owner)

    emit("/* ---- begin src/%s ---- */" % name, name)
    if line_directives:
        emit('#line 1 "src/%s"' % name, name)
    for n, line in enumerate(read(name).split("\n"), 1):
        m = INCLUDE_RE.match(line)
        if m:
            inc = m.group(1)
            if not os.path.isfile(os.path.join(SRC, inc)):
                raise Error('src/%s:%d: #include "%s" does not resolve into src/' % (name, n, inc))
            if inc in seen:
                emit("/* #include \"%s\" (already above) */" % inc, name)
            else:
                seen.add(inc)
                module(inc, seen, lines_out, owners, line_directives)
                if line_directives:
                    emit('#line %d "src/%s"' % (n + 1, name), name)
            continue
        emit(line.rstrip(), name)
    while lines_out and lines_out[-1] == "":
        lines_out.pop()
        owners.pop()
    emit("/* ---- end src/%s ---- */" % name, name)
    emit("", name)


def version():
    text = read("base.h")
    parts = []
    for key in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"#define PDP_VERSION_%s (\d+)" % key, text)
        if not m:
            raise Error("src/base.h does not define PDP_VERSION_%s" % key)
        parts.append(m.group(1))
    return ".".join(parts)


PRELUDE = """\
/* Strict C99 on glibc hides POSIX (threads, clocks, sockets) unless _POSIX_C_SOURCE
   is defined before the first system header. Define it here when we still can. */
#if defined(PDP_IMPLEMENTATION) && !defined(_WIN32) && defined(__STRICT_ANSI__) && \\
    !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#  if defined(__GLIBC__)
#    error "pdp.h: define _POSIX_C_SOURCE 200809L before your first #include (or pass -D_POSIX_C_SOURCE=200809L) in the file that defines PDP_IMPLEMENTATION"
#  else
#    define _POSIX_C_SOURCE 200809L
#  endif
#endif
"""


def build(line_directives=False):
    for name in API + SHARED + IMPL + EXTRA:
        read(name)  # every listed file must exist
    listed = set(API + SHARED + IMPL + EXTRA)
    for f in sorted(os.listdir(SRC)):
        if f not in listed:
            raise Error("src/%s is not listed in amalgamate.py" % f)

    lines, owners = [], []

    def emit(text, owner="(generator)"):
        for line in text.split("\n"):
            lines.append(line)
            owners.append(owner)

    manual = read("manual.txt").rstrip("\n")
    emit("/* pdp.h - v%s - embeddable C training library - MIT (see end of file)" % version())
    emit("   GENERATED from src/ by amalgamate.py: edit src/, then run `python3 amalgamate.py`.")
    emit("")
    for line in manual.split("\n"):
        emit(("   " + line).rstrip(), "manual.txt")
    emit("*/")
    emit(PRELUDE)
    emit("#ifndef PDP_H_INCLUDED\n#define PDP_H_INCLUDED\n")
    emit("#ifdef __cplusplus\nextern \"C\" {\n#endif\n")
    seen = set()
    for name in API:
        seen.add(name)
        module(name, seen, lines, owners, line_directives)
    emit("#ifdef __cplusplus\n}\n#endif\n")
    emit("#endif /* PDP_H_INCLUDED */\n")
    emit("#ifndef PDP__MATH_INCLUDED\n#define PDP__MATH_INCLUDED\n")
    for name in SHARED:
        seen.add(name)
        module(name, seen, lines, owners, line_directives)
    emit("#endif /* PDP__MATH_INCLUDED */\n")
    emit("#if defined(PDP_IMPLEMENTATION) && !defined(PDP__IMPLEMENTATION_INCLUDED)")
    emit("#define PDP__IMPLEMENTATION_INCLUDED\n")
    emit("/* Private helpers are static; a program that uses part of the library leaves")
    emit("   some of them unused, which is not worth a warning. */")
    emit("#if defined(__GNUC__) || defined(__clang__)")
    emit("#pragma GCC diagnostic push")
    emit("#pragma GCC diagnostic ignored \"-Wunused-function\"")
    emit("#endif\n")
    for name in IMPL:
        if name not in seen:
            seen.add(name)
            module(name, seen, lines, owners, line_directives)
    emit("#if defined(__GNUC__) || defined(__clang__)")
    emit("#pragma GCC diagnostic pop")
    emit("#endif")
    emit("#endif /* PDP_IMPLEMENTATION */\n")
    emit("/*")
    for line in read("license.txt").rstrip("\n").split("\n"):
        emit(line.rstrip(), "license.txt")
    emit("*/")
    return "\n".join(lines) + "\n", owners


def main(argv):
    out = os.path.join(ROOT, "pdp.h")
    check = False
    line_directives = False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--check":
            check = True
        elif a == "--line-directives":
            line_directives = True
        elif a == "--output":
            if not args:
                sys.stderr.write("amalgamate.py: --output needs a path\n")
                return 2
            out = args.pop(0)
        elif a in ("-h", "--help"):
            sys.stdout.write(__doc__)
            return 0
        else:
            sys.stderr.write("amalgamate.py: unknown option %s (see --help)\n" % a)
            return 2
    try:
        text, owners = build(line_directives)
    except Error as e:
        sys.stderr.write("amalgamate.py: %s\n" % e)
        return 2
    if check:
        try:
            with open(out, encoding="utf-8") as f:
                old = f.read()
        except OSError:
            sys.stderr.write("%s is missing; fix: python3 amalgamate.py\n" % out)
            return 1
        if old == text:
            return 0
        new_lines, old_lines = text.split("\n"), old.split("\n")
        n = 0
        while n < min(len(new_lines), len(old_lines)) and new_lines[n] == old_lines[n]:
            n += 1
        owner = owners[min(n, len(owners) - 1)]
        sys.stderr.write("pdp.h is stale: src/%s differs (pdp.h line %d); fix: python3 amalgamate.py\n"
                         % (owner, n + 1))
        return 1
    tmp = out + ".tmp.%d" % os.getpid()
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
