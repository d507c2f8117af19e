/* Shared by every C file in kernels/cpu: the loader inlines it in place of its #include, so
   the source hash covers it. */
/* Threads: built with -fopenmp where libgomp is there (kernels/cpu/loader.py), else one
   thread. kernel_threads(n) sets how many the next calls use (torch.get_num_threads(), set by
   the Python side when it changes); work is split so each output is computed by one thread
   in the one-thread order, so any thread count gives bit-identical results. */
#ifdef _OPENMP
#include <omp.h>
#define OMP(x) _Pragma(#x)
static int kernel_nthreads = 1;
static inline int thread_id(void) { return omp_get_thread_num(); }
#else
#define OMP(x)
static int kernel_nthreads = 1;
static inline int thread_id(void) { return 0; }
#endif
int kernel_threads(int n) {
    kernel_nthreads = n < 1 ? 1 : n;
#ifdef _OPENMP
    return kernel_nthreads;
#else
    return 1;
#endif
