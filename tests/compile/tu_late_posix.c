/* Must NOT compile under -std=c99 on glibc: a system header came before pdp.h,
   so _POSIX_C_SOURCE can no longer be defined; pdp.h says what to do. */
#include <stdio.h>
#define PDP_IMPLEMENTATION
#include "pdp.h"
int main(void) { return 0; }
