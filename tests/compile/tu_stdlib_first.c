/* A system header before pdp.h, as a program that defines PDP_MALLOC writes it. Under
   -std=c99 on glibc it must stop with ONE error that says what to do (POSIX is hidden
   once <features.h> has run); with -D_POSIX_C_SOURCE=200809L, in C++ or in GNU mode it
   compiles. tu_kinds.c is the other order. */
#include <stdlib.h>
#define PDP_MALLOC(size) malloc(size)
#define PDP_FREE(p) free(p)
#define PDP_IMPLEMENTATION
#include "pdp.h"

int main(void) { return pdp_status_name(PDP_OK)[0] == 'P' ? 0 : 1; }
