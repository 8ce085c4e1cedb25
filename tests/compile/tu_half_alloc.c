/* Must NOT compile: PDP_MALLOC without PDP_FREE. */
#include <stdlib.h>
#define PDP_MALLOC(bytes) malloc(bytes)
#define PDP_IMPLEMENTATION
#include "pdp.h"
int main(void) { return 0; }
