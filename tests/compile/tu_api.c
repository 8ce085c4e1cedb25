/* Translation unit with the API only: links against tu_impl.c. Also compiled as
   C++ (the API section must be valid C++ for users and for nvcc). */
#include <stdio.h>
#include "pdp.h"

#ifdef __cplusplus
extern "C"
#endif
int tu_impl_param_count(void);

int main(void)
{
    int n = tu_impl_param_count();
    printf("%s %d\n", pdp_version_string(), n);
    return n == 15 ? 0 : 1; /* Linear(4 -> 3): 12 weights + 3 biases */
}
