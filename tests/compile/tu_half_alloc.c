/* Must NOT compile: PDP_MALLOC without PDP_FREE. (<stdlib.h> comes first, so strict C99
   needs _POSIX_C_SOURCE before it: without it pdp.h stops at that first, alone.) */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#define PDP_MALLOC(bytes) malloc(bytes)
#define PDP_IMPLEMENTATION
#include "pdp.h"
int main(void) { return 0; }
