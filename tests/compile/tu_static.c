/* PDP_STATIC: every public symbol is static, so the library can be embedded in
   two translation units of one program without clashes. */
#define PDP_STATIC
#define PDP_IMPLEMENTATION
#include "pdp.h"

#ifndef TU_NAME
#define TU_NAME tu_static_a
#endif
int TU_NAME(void);
int TU_NAME(void) { return pdp_status_name(PDP_ERR_SHAPE)[4] == 'E'; }
#ifdef TU_MAIN
int tu_static_b(void);
int main(void) { return TU_NAME() && tu_static_b() ? 0 : 1; }
#endif
