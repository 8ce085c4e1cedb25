#!/usr/bin/env python3
"""Give pdp's private functions PDP__PRIVATE linkage (SQLite's SQLITE_PRIVATE pattern).

PDP__PRIVATE (src/internal.h) is `static` in every user's build and empty when the
implementation is compiled with PDP__TEST_LINKAGE: the tests then link one implementation
object instead of each compiling the implementation (see the Makefile). This script writes
`PDP__PRIVATE` for `static` at the start of every file-scope function declaration and
definition in src/*.c and src/internal.h, and for the file-scope tables in DATA (those the
tests read). It leaves alone: `static inline` helpers (C99 inline needs internal linkage
here; math.h's are shared with pdp_cuda.cu), other file-scope variables (a module's own state
stays static), function-local statics, comments and strings.

Usage:
  python3 tools/privatize.py           convert (idempotent: a second run changes nothing)
  python3 tools/privatize.py --check   exit 1, naming file:line and function, when a src/
                                       file has an unconverted private function, a private
                                       function whose name does not start with pdp__, a
                                       name defined as private in two modules, or a test
                                       file that defines a pdp__ name of its own
`python3 amalgamate.py --check` runs the check too. Python standard library only.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import amalgamate  # noqa: E402  (blank_comments, file_scope_statements)

SRC = os.path.join(ROOT, "src")
# file-scope tables the tests read (tests/test_layers.c checks every kind's row)
DATA = {"pdp__layer_kinds"}
NAME_BEFORE_PAREN = re.compile(r"([A-Za-z_]\w*)\s*\($")


def files():
    return ["internal.h"] + sorted(f for f in os.listdir(SRC) if f.endswith(".c"))


def classify(blank, start, end, body):
    """(kind, name) of the file-scope statement blank[start:end] that starts with `static`:
    kind 'function', 'inline', 'data' (a table in DATA) or None (left alone)."""
    stmt = blank[start:end if body is None else body]
    words = re.findall(r"[A-Za-z_]\w*", stmt.split("(")[0])
    if "inline" in words:
        return "inline", None
    # the first `(` not inside __attribute__((...)): a function's parameter list, unless `(*`
    k, depth = 0, 0
    attr = re.compile(r"__attribute__\s*\(\(")
    while k < len(stmt):
        m = attr.match(stmt, k)
        if m:
            d, k = 2, m.end()
            while k < len(stmt) and d:
                d += {"(": 1, ")": -1}.get(stmt[k], 0)
                k += 1
            continue
        c = stmt[k]
        if c in "=;[{":
            break
        if c == "(":
            rest = stmt[k + 1:].lstrip()
            m = NAME_BEFORE_PAREN.search(stmt[:k + 1])
            if rest.startswith("*") or not m:
                break
            return "function", m.group(1)
        k += 1
    m = re.search(r"([A-Za-z_]\w*)\s*(\[|=|;|$)", stmt)
    name = m.group(1) if m else None
    return ("data", name) if name in DATA else (None, name)


def realign(head, col=0):
    """head (a declaration, or a definition up to its body) with PDP__PRIVATE for static, and
    its continuation lines that were aligned with the parameter list's `(` moved along."""
    lines = head.split("\n")
    paren = lines[0].find("(")
    shift = len("PDP__PRIVATE") - len("static")
    for k in range(1, len(lines)):
        indent = len(lines[k]) - len(lines[k].lstrip(" "))
        if paren >= 0 and lines[k].strip() and indent == col + paren + 1:
            lines[k] = " " * shift + lines[k]
    return "PDP__PRIVATE" + "\n".join(lines)[len("static"):]


def convert(name):
    """(new text, [(line, kind, private name, is a definition)]) for src/name; kind:
    'converted' (was static) or 'private' (already PDP__PRIVATE)."""
    text = amalgamate.read(name)
    blank = amalgamate.blank_comments(text)
    out, pos, found = [], 0, []
    for start, end, body in amalgamate.file_scope_statements(text):
        word, off = amalgamate.storage_word(text[start:end])
        line = text.count("\n", 0, start) + 1
        if word == "PDP__PRIVATE":
            b = blank[:start + off] + "static      " + blank[start + off + len(word):]
            kind, fname = classify(b, start, end, body)
            found.append((line, "private", fname, body is not None or kind == "data"))
            continue
        if word != "static":
            continue
        kind, fname = classify(blank, start, end, body)
        if kind in ("function", "data"):
            out.append(text[pos:start + off])
            col = start + off - (text.rfind("\n", 0, start + off) + 1)
            out.append(realign(text[start + off:end if body is None else body], col))
            pos = end if body is None else body
            found.append((line, "converted", fname, body is not None or kind == "data"))
    out.append(text[pos:])
    return "".join(out), found


def test_definitions():
    """[(where, name)]: file-scope functions or variables named pdp__* that a test file defines
    itself. The tests link the implementation object, whose PDP__PRIVATE names are external
    there: a test's own pdp__x would clash with (or, static, contradict the declaration of) a
    private of the same name."""
    found = []
    tests = os.path.join(ROOT, "tests")
    for f in sorted(os.listdir(tests)):
        if not f.endswith((".c", ".h")) or f == "pdp_internal.h":
            continue
        with open(os.path.join(tests, f), encoding="utf-8") as fh:
            blank = amalgamate.blank_comments(fh.read())
        for m in re.finditer(r"^[A-Za-z_][\w \t\*]*?\b(pdp__\w+)\s*(\(|\[|=|;)", blank, re.M):
            if not m.group(0).startswith(("#", "return")):
                found.append(("tests/%s:%d" % (f, blank.count("\n", 0, m.start()) + 1),
                              m.group(1)))
    return found


def main(argv):
    check = "--check" in argv
    if any(a not in ("--check",) for a in argv):
        sys.stdout.write(__doc__)
        return 0 if argv in (["-h"], ["--help"]) else 2
    problems, owner, changed = [], {}, []
    try:
        for name in files():
            new, found = convert(name)
            for line, kind, fname, is_def in found:
                where = "src/%s:%d" % (name, line)
                if check and kind == "converted":
                    problems.append("%s: %s is static; fix: python3 tools/privatize.py"
                                    % (where, fname))
                if not (fname or "").startswith("pdp__"):
                    problems.append("%s: private %s does not start with pdp__" % (where, fname))
                first = owner.setdefault(fname, name) if is_def else name
                if first != name:
                    problems.append("%s: %s is private in src/%s too (the test object links "
                                    "both)" % (where, fname, first))
            if not check and new != amalgamate.read(name):
                with open(os.path.join(SRC, name), "w", encoding="utf-8", newline="\n") as f:
                    f.write(new)
                changed.append(name)
    except amalgamate.Error as e:
        sys.stderr.write("privatize.py: %s\n" % e)
        return 2
    for where, fname in test_definitions():
        problems.append("%s: the test defines %s; the tests link the private functions, so "
                        "pdp__ names are the library's: rename it" % (where, fname))
    for p in problems:
        sys.stderr.write("%s\n" % p)
    if changed:
        sys.stdout.write("privatize.py: converted %s\n" % ", ".join("src/" + c for c in changed))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
