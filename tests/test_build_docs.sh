#!/bin/sh
# The manual (src/manual.txt, pdp.h's top comment) against the code, so that it cannot rot:
# - its sections come in the order STYLE.md gives them (OPTION VALUES beside OPTIONS, the
#   reading map after DISTRIBUTED);
# - WHERE TO READ: every pdp_/pdp__ function it names is defined in the src/ file named
#   before it on its line ("zero.c: pdp__zero_reduce, ..."); a miss says where it is now;
# - every pdp_/PDP_ name anywhere in the manual exists in src/;
# - DISTRIBUTED's snippets (its indented lines, one snippet per block) compile, each as the
#   body of a function over the quick start's CHECK and a few declared variables;
# - neither the manual nor the README quotes a speed (it holds for one CPU only).
# Plain sh, awk and gcc: no Python needed.
. "$(dirname "$0")/build_checks.sh"
M=src/manual.txt

# ---- the sections and their order ----
want="QUICK START|A GPT|BUILD|OPTIONS (define before including)|OPTION VALUES|MEMORY|ERRORS|PRECISION|\
THREADS AND DETERMINISM|DEVICES AND CUDA|CHECKPOINTS|DISTRIBUTED|WHERE TO READ|NON-GOALS|\
VERSION HISTORY"
# a section is a line followed by a line of '=' as long as it
awk 'prev != "" && /^=+$/ && length($0) == length(prev) { printf "%s%s", sep, prev; sep = "|" }
     { prev = $0 }' "$M" > "$B/sections"
check manual_sections_in_order sh -c "
    if [ \"\$(cat '$B/sections')\" = '$want' ]; then exit 0; fi
    echo 'want: $want'; echo 'have:' \"\$(cat '$B/sections')\"; exit 1"

# ---- WHERE TO READ: file: names ----
# pairs "file name", one per line, for every name in the section, with the file named last
awk '/^WHERE TO READ$/ { on = 1; next }
     on && /^=+$/ { next }
     on && /^[A-Z][A-Z -]+$/ { exit }
     on {
         line = $0
         while (match(line, /[a-z_0-9]+\.(c|h|cu):|pdp__?[A-Za-z0-9_]+/)) {
             tok = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
             if (tok ~ /:$/) file = substr(tok, 1, length(tok) - 1)
             else if (file != "") print file, tok
         }
     }' "$M" > "$B/where.pairs"
# defined: a line at column 0 (not a comment or a prototype) with "name(" in it, or #define
defined_in() { # file name
    awk -v n="$2" '
        /^[ \t\/*#}]/ && !/^#[ \t]*define/ { next }
        { s = $0
          while ((i = index(s, n)) > 0) {
              before = i > 1 ? substr(s, i - 1, 1) : ""
              after = substr(s, i + length(n), 1)
              if (before !~ /[A-Za-z0-9_]/ && (after == "(" || (s ~ /^#/ && after ~ /[ (]/))) {
                  if (s !~ /;[ \t]*$/ || s ~ /^#/) found = 1
              }
              s = substr(s, i + length(n))
          } }
        END { exit found ? 0 : 1 }' "$1"
}
where_check() {
    [ -s "$B/where.pairs" ] || { echo "no WHERE TO READ section (or no file: name lines in it)"; return 1; }
    wbad=0
    while read -r wfile wname; do
        wf=src/$wfile; [ "$wfile" = pdp_cuda.cu ] && wf=pdp_cuda.cu
        if [ ! -f "$wf" ]; then echo "WHERE TO READ names $wfile, which is not in src/"; wbad=1; continue; fi
        if ! defined_in "$wf" "$wname"; then
            now=""
            for wg in src/*.c src/*.h pdp_cuda.cu; do defined_in "$wg" "$wname" && now="$now $wg"; done
            echo "WHERE TO READ: $wname is not defined in $wf (defined in:${now:- nowhere})"
            wbad=1
        fi
    done < "$B/where.pairs"
    echo "$(wc -l < "$B/where.pairs") names checked"
    return $wbad
}
check manual_where_to_read_names_are_defined_where_it_says where_check

# ---- every pdp_/PDP_ name in the manual exists in src/ ----
names_check() {
    wbad=0
    for wn in $(grep -oE '\b(pdp|PDP)_[A-Za-z0-9_]*[A-Za-z0-9]' "$M" | sort -u); do
        grep -qw "$wn" src/*.h src/*.c pdp_cuda.cu || { echo "the manual names $wn: not in src/"; wbad=1; }
    done
    return $wbad
}
check manual_names_exist names_check

# ---- no speed figures in the manual or the README: they hold for one CPU (CHANGELOG.md and
# make bench keep them, with the CPU named) ----
speed_check() {
    ! grep -nE 'samples/s|[0-9.]+x (the )?(fp32|bf16|PyTorch|autocast)|times (pdp|their|the fp32)|percent of (their|the) fp32' "$M" README.md
}
check manual_and_readme_carry_no_speed_figures speed_check

# ---- DISTRIBUTED's snippets compile ----
awk 'BEGIN { print "#include \"pdp.h\""; print "#include <stdio.h>"; print "#include <string.h>"
             print "#define CHECK(call) do { if ((call) != PDP_OK) { puts(pdp_last_error()); return 1; } } while (0)"
             print "#define VARS pdp_local_group *g = NULL; pdp_comm *comm = NULL, *tp_comm = NULL, *dp_comm = NULL; \\"
             print "    pdp_model *m = NULL; pdp_optim *opt = NULL; pdp_dp *dp = NULL; pdp_ddp *ddp = NULL; \\"
             print "    pdp_zero *z = NULL; pdp_pp *pp = NULL; pdp_work *w = NULL; pdp_tensor x; \\"
             print "    const int32_t *y = NULL; float loss = 0, buf[8] = {0}; int rank = 0"
             print "#define USE (void)g; (void)comm; (void)tp_comm; (void)dp_comm; (void)m; (void)opt; \\"
             print "    (void)dp; (void)ddp; (void)z; (void)pp; (void)w; (void)x; (void)y; (void)loss; \\"
             print "    (void)buf; (void)rank" }
     /^DISTRIBUTED$/ { on = 1; next }
     on && /^[A-Z][A-Z -]+$/ { exit }
     on && /^    / { if (!in_block) { k++; printf "static int snippet_%d(void)\n{\n    VARS;\n    memset(&x, 0, sizeof x);\n", k; in_block = 1 }
                     print; next }
     on && in_block { print "    USE;\n    return 0;\n}"; in_block = 0 }
     END { if (in_block) print "    USE;\n    return 0;\n}"
           printf "int main(void)\n{\n    int bad = 0;\n"
           for (i = 1; i <= k; i++) printf "    (void)snippet_%d;\n", i
           print "    return bad;\n}" }' "$M" > "$B/snippets.c"
snippets_check() {
    wk=$(grep -c '^static int snippet_' "$B/snippets.c")
    [ "$wk" -ge 7 ] || { echo "DISTRIBUTED has $wk snippets; want one per subsection (7)"; return 1; }
    gcc $STRICT -fsyntax-only "$B/snippets.c"
}
check manual_distributed_snippets_compile snippets_check

summary
