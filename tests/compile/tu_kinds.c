/* The implementation as C and as C++ (tests/test_build_cxx.sh builds it both ways): prints
   every layer kind's name by its value. C++ has no array designators, so there the layer
   table's entries go by their order; the two outputs must be the same. */
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include <stdio.h>

int main(void)
{
    int k;
    for (k = 0; k < (int)PDP__LAYER_KIND_COUNT; k++)
        printf("%d %s\n", k, pdp__layer_kind_name((pdp__layer_kind)k));
    return 0;
}
