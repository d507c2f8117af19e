/* Shared by every C file in inferq_kernels/cpu: the loader inlines it in place of its #include, so
   the source hash covers it. */
/* Threads: built with -fopenmp where libgomp is there (inferq_kernels/cpu/loader.py), else one
   thread. kernel_threads(n) sets how many the next calls use (torch.get_num_threads(), set by
   the Python side when it changes); work is split so each output is computed by one thread
   in the one-thread order, so any thread count gives bit-identical results. */
#include <stdint.h>
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
/* Rows per row block of a blocked matmul: at most cache_rows (the activations that stay in L2),
   fewer where the output panels alone are too few to give every thread work (a narrow
   projection on a many-core server), a multiple of step (the micro-kernel's rows). Results do
   not depend on it: each output's sum runs over k in the same order whatever block holds it. */
static inline int64_t row_block(int64_t m, int64_t cache_rows, int64_t panels, int64_t step) {
    int64_t mc = cache_rows;
    if (panels > 0 && panels < kernel_nthreads) {
        const int64_t blocks = (kernel_nthreads + panels - 1) / panels;
        const int64_t per = ((m + blocks - 1) / blocks + step - 1) / step * step;
        if (per < mc) mc = per;
    }
    return mc < step ? step : mc / step * step;
}

/* Sharing a kernel's work among threads. A kernel's loop over [0, n) runs in static shares,
   each output computed by one thread. Called from Python, the kernel opens its own parallel
   region of kernel_nthreads threads, or runs on the calling thread where one thread is set or
   `when` (its OpenMP if clause) is false. Inside a step program's team (step_program.c runs a
   whole decode step in one parallel region, its threads meeting at a barrier after each kernel)
   every team thread calls the kernel and runs its own share, opening no region. On a 2-core
   Zen 4 a libgomp region of two threads cost ~2.6 us to open and close (a barrier in it ~0.75,
   a spin barrier of our own ~0.15), and even a region of one thread or with a false if clause
   ~0.4: a batch-1 step's small kernels opened ~300 of those. Kernels that share this way are
   listed in their file's team_kernels[] (read by inferq_kernels/cpu/loader.py): a step program
   runs as a team only where every kernel it calls is listed. */
#ifdef _OPENMP
static inline int in_team(void) { return omp_in_parallel(); }
static inline int team_thread(void) { return omp_get_thread_num(); }
static inline int team_threads(void) { return omp_get_num_threads(); }
#else
static inline int in_team(void) { return 0; }
static inline int team_thread(void) { return 0; }
static inline int team_threads(void) { return 1; }
#endif
/* [*lo, *hi): thread t of nt's contiguous share of [0, n) */
static inline void share_of(int64_t n, int t, int nt, int64_t *lo, int64_t *hi) {
    const int64_t q = n / nt, r = n % nt;
    *lo = t * q + (t < r ? t : r);
    *hi = *lo + q + (t < r);
}
/* The statements after `when` run on each thread's share [lo, hi) of [0, n), tid the thread's
   number (for its scratch); with `when` false, once on [0, n) (thread 0 in a team). */
#define SHARED(n, when, ...)                                                                     \
    do {                                                                                         \
        const int64_t shared_n_ = (n);                                                           \
        if (in_team()) {                                                                         \
            const int tid = team_thread();                                                       \
            int64_t lo = 0, hi = tid ? 0 : shared_n_;                                            \
            if (when) share_of(shared_n_, tid, team_threads(), &lo, &hi);                        \
            if (lo < hi) { __VA_ARGS__ }                                                         \
        } else if (kernel_nthreads < 2 || !(when)) {                                             \
            const int tid = 0;                                                                   \
            const int64_t lo = 0, hi = shared_n_;                                                \
            (void)tid;                                                                           \
            if (lo < hi) { __VA_ARGS__ }                                                         \
        } else {                                                                                 \
            OMP(omp parallel num_threads(kernel_nthreads))                                       \
            {                                                                                    \
                const int tid = team_thread();                                                   \
                int64_t lo, hi;                                                                  \
                share_of(shared_n_, tid, team_threads(), &lo, &hi);                              \
                if (lo < hi) { __VA_ARGS__ }                                                     \
            }                                                                                    \
        }                                                                                        \
    } while (0)
/* The statements run for each i of [0, n), items dealt round robin (schedule(static, 1)). */
#define SHARED_EACH(i, n, ...)                                                                   \
    do {                                                                                         \
        const int64_t each_n_ = (n);                                                             \
        if (in_team()) {                                                                         \
            const int tid = team_thread(), each_step_ = team_threads();                          \
            for (int64_t i = tid; i < each_n_; i += each_step_) { __VA_ARGS__ }                  \
        } else if (kernel_nthreads < 2) {                                                        \
            const int tid = 0;                                                                   \
            (void)tid;                                                                           \
            for (int64_t i = 0; i < each_n_; ++i) { __VA_ARGS__ }                                \
        } else {                                                                                 \
            OMP(omp parallel for schedule(static, 1) num_threads(kernel_nthreads))               \
            for (int64_t i = 0; i < each_n_; ++i) {                                              \
                const int tid = team_thread();                                                   \
                (void)tid;                                                                       \
                __VA_ARGS__                                                                      \
            }                                                                                    \
        }                                                                                        \
    } while (0)
int kernel_threads(int n) {
    kernel_nthreads = n < 1 ? 1 : n;
#ifdef _OPENMP
    return kernel_nthreads;
#else
    return 1;
#endif
}

/* Pinning (inferq_kernels/cpu/binding.py): OpenMP thread i of the calling thread's team of n is held
   to cpus[i], as vLLM's VLLM_CPU_OMP_THREADS_BIND does. libgomp keeps one pool per calling
   thread and torch loads the same libgomp, so torch's own parallel regions of n threads run on
   these pinned threads too. Raw syscalls: no _GNU_SOURCE needed before the system headers. */
#include <unistd.h>
#include <sys/syscall.h>
long syscall(long number, ...); /* unistd.h hides it under -std=c11 (no _DEFAULT_SOURCE) */
#define BIND_MASK_WORDS 16 /* 1,024 CPUs */
static int pin_self(int cpu) {
    unsigned long mask[BIND_MASK_WORDS] = {0};
    if (cpu < 0 || cpu >= 64 * BIND_MASK_WORDS) return 0;
    mask[cpu / 64] |= 1UL << (cpu % 64);
    return syscall(SYS_sched_setaffinity, 0, sizeof mask, mask) == 0;
}
/* The one CPU the calling thread may run on, or -1 where it may run on several. */
static int pinned_cpu(void) {
    unsigned long mask[BIND_MASK_WORDS] = {0};
    if (syscall(SYS_sched_getaffinity, 0, sizeof mask, mask) < 0) return -1;
    int found = -1;
    for (int w = 0; w < BIND_MASK_WORDS; ++w)
        for (int b = 0; b < 64; ++b)
            if (mask[w] >> b & 1UL) {
                if (found >= 0) return -1;
                found = 64 * w + b;
            }
    return found;
}
/* Returns how many threads were pinned (n where every call succeeded). */
int bind_threads(const int *cpus, int n) {
    int ok = 0;
#ifdef _OPENMP
    OMP(omp parallel num_threads(n) reduction(+ : ok))
    ok += omp_get_num_threads() == n ? pin_self(cpus[omp_get_thread_num()]) : 0;
#else
    ok = n == 1 ? pin_self(cpus[0]) : 0;
#endif
    return ok;
}
/* Lets each thread of the calling thread's team of n run on any of cpus[0..ncpus) again. */
int release_threads(const int *cpus, int ncpus, int n) {
    unsigned long mask[BIND_MASK_WORDS] = {0};
    for (int i = 0; i < ncpus; ++i)
        if (cpus[i] >= 0 && cpus[i] < 64 * BIND_MASK_WORDS) mask[cpus[i] / 64] |= 1UL << (cpus[i] % 64);
    int ok = 0;
    OMP(omp parallel num_threads(n) reduction(+ : ok))
    ok += syscall(SYS_sched_setaffinity, 0, sizeof mask, mask) == 0;
    return ok;
}
/* out[i]: the CPU team thread i of n is pinned to (-1: not pinned to one), for the tests. */
void thread_cpus(int *out, int n) {
#ifdef _OPENMP
    OMP(omp parallel num_threads(n))
    if (omp_get_thread_num() < n) out[omp_get_thread_num()] = pinned_cpu();
#else
    for (int i = 0; i < n; ++i) out[i] = i == 0 ? pinned_cpu() : -1;
#endif
}
