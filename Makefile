# pdp: `make test` is the test command. Everything builds into build/.
#
#   make test       every test binary (strict C99, -Werror), then the examples in short mode
#   make sanitize   the same tests under ASan + UBSan
#   make tsan       the threaded tests under ThreadSanitizer
#   make bench      benchmarks (ratios against peers measured in the same run)
#   make demo       train the Fashion-MNIST MLP (examples/train_mnist.c)
#   make cuda       pdp_cuda.cu and the examples with nvcc (compile and link only)

CC      ?= cc
OPT     ?= -O2 -march=native
WARN     = -std=c99 -Wall -Wextra -pedantic -Werror
CFLAGS  ?=
CPPFLAGS = -I. -Itests
LDLIBS   = -lm -lpthread
B        = build

TEST_SRC = $(sort $(wildcard tests/test_*.c))
TESTS    = $(patsubst tests/%.c,$(B)/%,$(TEST_SRC))
TEST_SH  = $(sort $(wildcard tests/test_*.sh))
EXAMPLES = $(patsubst examples/%.c,$(B)/%,$(sort $(wildcard examples/*.c)))
BENCHES  = $(patsubst bench/%.c,$(B)/bench_%,$(sort $(wildcard bench/*.c)))
SRCS     = $(wildcard src/*) amalgamate.py

.PHONY: all test sanitize tsan bench demo cuda examples clean
all: $(TESTS) $(EXAMPLES)

pdp.h: $(SRCS)
	python3 amalgamate.py

$(B):
	mkdir -p $(B)

$(B)/test_%: tests/test_%.c pdp.h tests/pdp_test.h | $(B)
	$(CC) $(WARN) $(OPT) $(CFLAGS) $(CPPFLAGS) $< -o $@ $(LDLIBS) $(EXTRA_LIBS_$*)

$(B)/%: examples/%.c pdp.h | $(B)
	$(CC) $(WARN) $(OPT) $(CFLAGS) $(CPPFLAGS) $< -o $@ $(LDLIBS)

$(B)/bench_%: bench/%.c pdp.h | $(B)
	$(CC) $(WARN) $(OPT) $(CFLAGS) $(CPPFLAGS) $< -o $@ $(LDLIBS) $(BENCH_LIBS_$*)

examples: $(EXAMPLES)

test: $(TESTS) $(EXAMPLES)
	@B=$(B) sh tests/run_all.sh $(TESTS) $(TEST_SH) -- $(EXAMPLES)

sanitize:
	$(MAKE) B=build/asan OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" test

tsan:
	$(MAKE) B=build/tsan OPT="-O1 -g -fsanitize=thread" TSAN=1 test

bench: $(BENCHES)
	@for b in $(BENCHES); do echo "== $$b"; ./$$b || exit 1; done

demo: $(B)/train_mnist
	./$(B)/train_mnist

clean:
	rm -rf build
