/* Translation unit with the implementation (two-TU and option-set builds). */
#define PDP_IMPLEMENTATION
#include "pdp.h"

int tu_impl_param_count(void);
int tu_impl_param_count(void)
{
    pdp_model *m;
    pdp_model_desc d = {0};
    int n;
    d.input_shape[0] = 4;
    if (pdp_model_create(&m, &d) != PDP_OK || pdp_model_add_linear(m, 3) != PDP_OK) return -1;
    n = (int)pdp_model_param_count(m);
    pdp_model_free(m);
    return n;
}
