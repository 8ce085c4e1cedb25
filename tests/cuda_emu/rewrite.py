"""rewrite.py SRC DST: pdp_cuda.cu -> C++ that g++ compiles against tests/cuda_emu/include.

Each launch `kernel<<<grid, block, smem, stream>>>(` becomes
`PDP_EMU_LAUNCH(kernel, grid, block, smem, stream)(`. Newlines are kept and a #line
directive names the source, so __LINE__ and compiler messages point at pdp_cuda.cu."""
import re
import sys

LAUNCH = re.compile(r"\b([A-Za-z_]\w*)\s*<<<(.*?)>>>(\s*)\(", re.S)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    out, n = LAUNCH.subn(lambda m: "PDP_EMU_LAUNCH(%s, %s)%s(" % m.groups(), text)
    if n == 0 or "<<<" in out or ">>>" in out:
        sys.exit("rewrite.py: %s: %d launches rewritten, a <<< or >>> is left" % (src, n))
    with open(dst, "w") as f:
        f.write('#line 1 "%s"\n' % src + out)


if __name__ == "__main__":
    main()
