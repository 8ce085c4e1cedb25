#!/usr/bin/env python3
"""Write pdp.h from the modules in src/.

pdp.h = manual (src/manual.txt) + strict-C99 prelude + public API (the API
headers below, in order) + shared host/device math + implementation (the .c
modules below, in order, under PDP_IMPLEMENTATION) + licence.
With pdp.h it writes tests/pdp_internal.h, the implementation's declarations
without its function bodies, which pdp.h includes (by tests/pdp_linked.h) under
PDP__INTERNAL_API: the internal tests linked against one implementation object
(see the Makefile).

Usage:
  python3 amalgamate.py                   write pdp.h
  python3 amalgamate.py --check           exit 1 when pdp.h or tests/pdp_internal.h is stale
                                          (naming the module), when an IMPL module uses a name
                                          that a later module defines (one line each:
                                          caller:line, name, defining module), or when
                                          tools/privatize.py --check finds a static function
  python3 amalgamate.py --order           only the dependency-order check; exit 1 on a violation
  python3 amalgamate.py --output PATH     write PATH instead of pdp.h
  python3 amalgamate.py --line-directives emit #line directives into src/ (development
                                          builds only; never for the committed pdp.h)

The output is byte-identical on every run: no timestamps, no absolute paths.
Python standard library only.
"""
import functools
import os
import re
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(ROOT, "src")

# The public API, in dependency order. Each is a plain C header.
API = [
    "base.h",
    "tensor.h",
    "gemm.h",
    "model.h",
    "optim.h",
    "data.h",
    "checkpoint.h",
    "store.h",
    "rendezvous.h",
    "comm.h",
    "dp.h",
    "ddp.h",
    "tp.h",
    "gpt.h",  # after data.h and tp.h: pdp_gpt_evaluate, pdp_gpt_tp_report take their types
    "zero.h",
    "trainer.h",  # after dp.h, ddp.h, zero.h: its desc holds theirs
    "pp.h",
    "cuda.h",
    "launch.h",
]
# Math written once for the CPU and for pdp_cuda.cu (PDP__HOSTDEV helpers).
SHARED = ["math.h"]
# The implementation, in dependency order (`--check` holds it to that; see check_order).
IMPL = [
    "platform.h",
    "internal.h",
    "platform.c",
    "base.c",
    "threads.c",
    "trace.c",
    "store.c",
    "cuda_host.c",
    "tensor.c",
    "gemm.c",
    "gemm_bf16.c",
    "gemm_amx.c",
    "rendezvous.c",
    "comm_queue.c",
    "comm_local.c",
    "comm_mpi.c",
    "comm_nccl.c",
    "comm.c",
    "layers.c",
    "layers_conv.c",
    "layers_gpt.c",
    "layers_tp.c",
    "layers_table.c",
    "model.c",
    "loss.c",
    "optim.c",
    "inflate.c",
    "sampler.c",
    "data.c",
    "json.c",
    "checkpoint.c",
    "dp.c",
    "reducer.c",
    "ddp.c",
    "tp.c",
    "gpt.c",
    "zero.c",
    "zero_ckpt.c",
    "trainer.c",
    "pp.c",
    "launch.c",
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


# ---- dependency order of the IMPL modules ----
#
# For every use in module M of a pdp_/pdp__ name (a function, a file-scope table or variable,
# a struct/union/enum tag or a typedef) whose definition is in module N, N must not come after
# M in IMPL: then the amalgamation compiles top to bottom, under every option, without forward
# declarations of later modules. Comments, strings and character literals are blanked first
# (newlines kept, for line numbers). At brace depth 0 a definition is: a name followed by a
# parenthesised list and `{` (a function; followed by `;` it is a prototype, which is no use
# of the name itself); `struct|union|enum NAME {`; a name followed by `[` or `=` (a table or
# variable); the name a typedef declares. Every other occurrence is a use. A name defined in
# several modules (variants under #ifdef) counts as defined in the first of them. A struct
# declared incomplete earlier (`struct X;`, `typedef struct X X;`, in the API or an earlier
# module) may be used by pointer before its definition: such uses are not reported, and
# neither is field access through such a pointer, which this scan cannot see; the compile
# tests under each option (tests/test_build.sh, make cuda) catch that.

NAME_RE = re.compile(r"\b(pdp__?[A-Za-z0-9_]*)\b")
TAG_RE = re.compile(r"(?:struct|union|enum)\s+$")


SPECIAL_RE = re.compile(r"/\*|//|[\"']")


@functools.lru_cache(maxsize=None)  # scan, file_scope_statements, declarations: the same texts
def blank_comments(text):
    out = []
    i, n = 0, len(text)
    while i < n:
        m = SPECIAL_RE.search(text, i)  # copy up to the next comment or literal in one piece
        if not m:
            out.append(text[i:])
            break
        out.append(text[i:m.start()])
        i = m.start()
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def scan(name):
    """Returns (definitions, uses, forward declarations, prototypes) of src/name: {name: line},
    [(line, name)], {name}, {name}."""
    text = blank_comments(read(name))
    # preprocessor lines keep their identifiers (a macro body's call is a use) but not their
    # braces, which may be unbalanced across #if branches
    pre = set()
    cont = False
    for k, line in enumerate(text.split("\n")):
        if cont or line.lstrip().startswith("#"):
            pre.add(k + 1)
        cont = line.rstrip().endswith("\\")
    defs, uses, fwds, decls = {}, [], set(), set()
    depth, line, stmt = 0, 1, 0  # stmt: where the current file-scope statement starts
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c in "{};" and line not in pre:
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            elif depth == 0:
                stmt = i + 1
        elif (c.isalpha() or c == "_") and (i == 0 or not (text[i - 1].isalnum() or
                                                           text[i - 1] == "_")):
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            m = NAME_RE.match(text, i)
            if not m or m.end() != j:
                i = j
                continue
            ident = m.group(1)
            k = j
            while k < n and text[k] in " \t\n":
                k += 1
            nxt = text[k] if k < n else ""
            kind = "use"
            if depth == 0 and line not in pre:
                before = text[stmt:i]
                prev = before.rstrip()[-1:]
                if TAG_RE.search(before):
                    kind = "def" if nxt == "{" else "fwd" if nxt == ";" else "use"
                elif nxt == "(" and not prev == "(":
                    # a function definition (`) {`) or a prototype (`);`) at file scope
                    d = 0
                    while k < n:
                        if text[k] == "(":
                            d += 1
                        elif text[k] == ")":
                            d -= 1
                            if d == 0:
                                break
                        k += 1
                    k += 1
                    while k < n and text[k] in " \t\n":
                        k += 1
                    kind = "def" if k < n and text[k] == "{" else "decl"
                elif before.lstrip().startswith("typedef") and (
                        nxt in ";[," or (nxt == ")" and prev == "*")):
                    # `typedef struct X X;` only names an incomplete type
                    kind = "fwd" if re.match(r"typedef\s+(struct|union)\s+\w+\s+$",
                                             before.lstrip()) else "def"
                elif nxt in "[=" and not before.lstrip().startswith("extern"):
                    kind = "def"
            if kind == "def":
                defs.setdefault(ident, line)
            elif kind == "fwd":
                fwds.add(ident)
            elif kind == "decl":
                decls.add(ident)
            elif kind == "use":
                uses.append((line, ident))
            i = j
            continue
        i += 1
    if depth != 0:
        raise Error("src/%s: unbalanced braces (depth %d at the end); check_order cannot read it"
                    % (name, depth))
    return defs, uses, fwds, decls


def check_order():
    """One message per use of a name defined by a later IMPL module (the first use per name and
    module)."""
    defined_in, fwd = {}, set()
    for name in API:
        fwd |= scan(name)[2]
    scans = []
    for idx, name in enumerate(IMPL):
        defs, uses, fwds, decls = scan(name)
        # incomplete types declared before it or in it, and the functions it declares itself:
        # a module that calls a later one says so in a prototype of its own (gemm_bf16.c's
        # hook into gemm_amx.c, which builds on it)
        scans.append((uses, fwd | fwds | decls))
        fwd |= fwds
        for f in defs:
            defined_in.setdefault(f, []).append(idx)
    problems = []
    for idx, name in enumerate(IMPL):
        seen = set()
        uses, declared = scans[idx]
        for line, f in uses:
            where = defined_in.get(f)
            if not where or min(where) <= idx or f in seen or f in declared:
                continue
            seen.add(f)
            later = IMPL[min(where)]
            problems.append("src/%s:%d: uses %s, defined in src/%s, which comes after it in IMPL"
                            % (name, line, f, later))
    return problems



# ---- file-scope statements, for tools/privatize.py and the internal declarations ----

def preprocessor_lines(text):
    """The 1-based numbers of the preprocessor lines of text (continuations included)."""
    pre, cont = set(), False
    for k, line in enumerate(text.split("\n")):
        if cont or line.lstrip().startswith("#"):
            pre.add(k + 1)
        cont = line.rstrip().endswith("\\")
    return pre


def file_scope_statements(text):
    """The file-scope statements of C source text: (start, end, body) per statement, body the
    offset of a function definition's `{` (None for any other statement). Comments, strings and
    preprocessor lines are skipped (braces on preprocessor lines do not count, as in scan)."""
    blank = blank_comments(text)
    pre = preprocessor_lines(blank)
    out = []
    depth, line, start, body = 0, 1, None, None
    i, n = 0, len(blank)
    while i < n:
        c = blank[i]
        if c == "\n":
            line += 1
            i += 1
            continue
        if line in pre:
            j = blank.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if depth == 0 and start is None:
            start, body = i, None
        if c == "{":
            if depth == 0 and blank[start:i].rstrip().endswith(")"):
                body = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and body is not None:
                out.append((start, i + 1, body))
                start = None
        elif c == ";" and depth == 0:
            out.append((start, i + 1, None))
            start = None
        i += 1
    if depth != 0 or start is not None:
        raise Error("unbalanced braces or an unterminated statement at file scope")
    return out


def storage_word(stmt):
    """(word, offset) of a file-scope statement's first word after any leading attribute
    macros (PDP__BF16_TARGET static ...): `static`, `PDP__PRIVATE`, `PDP_API`, a type, ..."""
    pos = 0
    while True:
        m = re.compile(r"\s*([A-Za-z_]\w*)").match(stmt, pos)
        if not m:
            return "", pos
        word = m.group(1)
        if (re.match(r"[A-Z][A-Z0-9_]*$", word) and word not in ("PDP__PRIVATE", "PDP_API")
                and re.match(r"\s+(static|PDP__PRIVATE)\b", stmt[m.end():])):
            pos = m.end()
            continue
        return word, m.start(1)


def first_word(stmt):
    return storage_word(stmt)[0]


def top_level_eq(blank_stmt):
    """Offset of the `=` of an initialiser in a file-scope declaration (-1 if none)."""
    depth = 0
    for k, c in enumerate(blank_stmt):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "=" and depth == 0:
            return k
    return -1


def declarations(name):
    """src/name with no function bodies, for pdp's internal tests (tests/pdp_internal.h): a
    PDP__PRIVATE function keeps its prototype, a PDP__PRIVATE table becomes an extern
    declaration; PDP_API definitions (declared by the API), and in .c modules static
    functions and variables (inline helpers, the module's own state), are left out; types,
    macros and everything in a header stay."""
    text = read(name)
    blank = blank_comments(text)
    header = name.endswith(".h")
    out, pos = [], 0
    for start, end, body in file_scope_statements(text):
        out.append(text[pos:start])
        pos = end
        word = first_word(text[start:end])
        if word == "PDP__PRIVATE":
            if body is not None:
                out.append(text[start:body].rstrip() + ";")
                continue
            eq = top_level_eq(blank[start:end])
            if eq >= 0:
                off = storage_word(text[start:end])[1]
                out.append("extern" + text[start + off + len(word):start + eq].rstrip() + ";")
                continue
            out.append(text[start:end])
        elif word == "PDP_API" and body is not None:
            out.append("/* %s */" % re.sub(r"\s+", " ", text[start:body].strip()))
        elif word == "static" and not header:
            continue
        elif body is not None and not (word == "static" and header):
            raise Error("src/%s:%d: a function defined with neither PDP__PRIVATE nor PDP_API; "
                        "fix: python3 tools/privatize.py" % (name, text.count("\n", 0, start) + 1))
        else:
            out.append(text[start:end])
    out.append(text[pos:])
    lines = []
    for line in "".join(out).split("\n"):
        m = INCLUDE_RE.match(line)
        lines.append("/* #include \"%s\" (above) */" % m.group(1) if m else line.rstrip())
    # runs of blank lines (where bodies and statics were) become one
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n") + "\n"


INTERNAL_OUT = os.path.join(ROOT, "tests", "pdp_internal.h")


def build_internal():
    """tests/pdp_internal.h: the private declarations of every IMPL module, no bodies."""
    parts = ["""\
/* pdp_internal.h - GENERATED from src/ by amalgamate.py: edit src/, then run
   `python3 amalgamate.py`. For pdp's own tests only; not part of the library.

   The implementation's declarations without its definitions: every IMPL module of
   amalgamate.py with its function bodies taken out (see declarations() there). pdp.h
   includes this file (by tests/pdp_linked.h) when PDP__INTERNAL_API is defined, after the
   public API: an internal test compiled that way reads the private structs and calls
   pdp__ functions of the one implementation object it links (tests/pdp_impl.c, compiled
   with PDP__TEST_LINKAGE, so PDP__PRIVATE functions have external linkage there). */
#ifndef PDP_INTERNAL_H_INCLUDED
#define PDP_INTERNAL_H_INCLUDED
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#endif
"""]
    for name in IMPL:
        parts.append("/* ---- src/%s ---- */\n" % name)
        parts.append(declarations(name))
        parts.append("\n")
    parts.append("""\
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif /* PDP_INTERNAL_H_INCLUDED */
""")
    return "".join(parts)


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
   is defined before the first system header. Define it here when we still can. When a
   system header came first (__GLIBC__ is defined: glibc's <features.h> has already
   chosen what to declare, and no later define changes that), say what to do, once,
   and skip the implementation: without its declarations it would add ~30 errors. */
#if defined(PDP_IMPLEMENTATION) && !defined(_WIN32) && defined(__STRICT_ANSI__) && \\
    !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#  if defined(__GLIBC__)
#    error "pdp.h: a system header came before pdp.h in the file that defines PDP_IMPLEMENTATION, and strict C (-std=c99) then hides POSIX; put #define _POSIX_C_SOURCE 200809L above that file's first #include (or pass -D_POSIX_C_SOURCE=200809L, or include pdp.h first)"
#    define PDP__NO_POSIX
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
    emit("#if defined(PDP_IMPLEMENTATION) && !defined(PDP__IMPLEMENTATION_INCLUDED) && \\")
    emit("    !defined(PDP__NO_POSIX)")
    emit("#define PDP__IMPLEMENTATION_INCLUDED\n")
    emit("/* Private helpers are static (PDP__PRIVATE); a program that uses part of the library")
    emit("   leaves some of them unused, which is not worth a warning. */")
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
    emit("/* pdp's own tests (the Makefile): the private declarations without their definitions, for")
    emit("   a test linked against the implementation compiled once with PDP__TEST_LINKAGE. */")
    emit("#if defined(PDP__INTERNAL_API) && !defined(PDP__INTERNAL_API_INCLUDED)")
    emit("#define PDP__INTERNAL_API_INCLUDED")
    emit("#ifndef PDP__TEST_LINKAGE")
    emit("#define PDP__TEST_LINKAGE")
    emit("#endif")
    emit("#include \"pdp_linked.h\" /* tests/: the generated pdp_internal.h, allocator hooks */")
    emit("#endif\n")
    emit("/*")
    for line in read("license.txt").rstrip("\n").split("\n"):
        emit(line.rstrip(), "license.txt")
    emit("*/")
    return "\n".join(lines) + "\n", owners


def main(argv):
    out = os.path.join(ROOT, "pdp.h")
    check = False
    order = False
    line_directives = False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--check":
            check = True
        elif a == "--order":
            order = True
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
    if check or order:
        try:
            problems = check_order()
        except Error as e:
            sys.stderr.write("amalgamate.py: %s\n" % e)
            return 2
        for p in problems:
            sys.stderr.write("%s\n" % p)
        if problems:
            sys.stderr.write("amalgamate.py: %d name%s used before the module that defines it; "
                             "fix: reorder IMPL in amalgamate.py, or move the definition into an "
                             "earlier module\n" % (len(problems), "" if len(problems) == 1 else "s"))
        bad_order = bool(problems)
        if order:
            sys.stdout.write("%d violation%s of the dependency order\n"
                             % (len(problems), "" if len(problems) == 1 else "s"))
            return 1 if bad_order else 0
        import subprocess
        if subprocess.call([sys.executable, os.path.join(ROOT, "tools", "privatize.py"),
                            "--check"]) != 0:
            sys.stderr.write("amalgamate.py: a private function is not PDP__PRIVATE; fix: "
                             "python3 tools/privatize.py\n")
            bad_order = True
        try:
            internal = build_internal()
            with open(INTERNAL_OUT, encoding="utf-8") as f:
                if f.read() != internal:
                    sys.stderr.write("tests/pdp_internal.h is stale; fix: python3 amalgamate.py\n")
                    bad_order = True
        except OSError:
            sys.stderr.write("tests/pdp_internal.h is missing; fix: python3 amalgamate.py\n")
            bad_order = True
        except Error as e:
            sys.stderr.write("amalgamate.py: %s\n" % e)
            bad_order = True
        try:
            with open(out, encoding="utf-8") as f:
                old = f.read()
        except OSError:
            sys.stderr.write("%s is missing; fix: python3 amalgamate.py\n" % out)
            return 1
        if old == text:
            return 1 if bad_order else 0
        new_lines, old_lines = text.split("\n"), old.split("\n")
        n = 0
        while n < min(len(new_lines), len(old_lines)) and new_lines[n] == old_lines[n]:
            n += 1
        owner = owners[min(n, len(owners) - 1)]
        sys.stderr.write("pdp.h is stale: src/%s differs (pdp.h line %d); fix: python3 amalgamate.py\n"
                         % (owner, n + 1))
        return 1
    try:
        internal = build_internal()
    except Error as e:
        sys.stderr.write("amalgamate.py: %s\n" % e)
        return 2
    targets = [(out, text)]
    if out == os.path.join(ROOT, "pdp.h"):
        targets.append((INTERNAL_OUT, internal))
    for path, content in targets:
        tmp = path + ".tmp.%d" % os.getpid()
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(content)
        os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
