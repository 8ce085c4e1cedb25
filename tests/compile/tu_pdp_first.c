/* pdp.h's implementation first, then the system headers the program wants: compiles in
   strict C99 with no define (tu_stdlib_first.c is the other order). */
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include <stdio.h>
#include <stdlib.h>

int main(void) { return puts(pdp_status_name(PDP_OK)) < 0 ? EXIT_FAILURE : EXIT_SUCCESS; }
