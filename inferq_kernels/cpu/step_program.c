/* A recorded list of kernel calls run in one foreign call: the CPU decode replay's step
   (gpuworker/models/cpu_step_program.py). Each op names a kernel (a function pointer taken
   from its own library) and one of the call shapes below, the kernels' C prototypes; its
   arguments are fixed when the step is recorded, except those marked per step, read from the
   params array the caller fills before each run (the block table, the attention scratch).
   Calling the kernels from here instead of from Python saves the few microseconds of
   argument conversion and GIL traffic around each of the ~300 calls of a small model's step;
   at several threads, running the step as one team (run_team) saves each parallel kernel's
   region. */
#include <stdint.h>
#include <string.h>
#include "threads.h"

#define STEP_MAX_ARGS 18

typedef struct {
    void *fn;
    int32_t shape;
    uint32_t per_step; /* bit j: a[j] is an index into params (the value is set per run) */
    int64_t a[STEP_MAX_ARGS];
    float f[2];
} step_op;

enum {
    SHAPE_NORM,         /* (p, p, p, p, i64, i64, float) -> int: add_rms_norm */
    SHAPE_ROTARY,       /* (p, i64, i64, p, i64, i64, i64, p, p, p, p, i64) -> int */
    SHAPE_DECODE,       /* (p, i64, p, i64, p, p, p, i64, p, p, p, i64 x5, float, p) -> int: paged_decode */
    SHAPE_LINEAR,       /* (p, i64, i64, p, i64, i64, p, p, i64) -> int: the float panels' matmuls */
    SHAPE_SILU_FUSED,   /* (p, i64, i64, p, i64, i64, p, i64) -> int: gate/up with SiLU-and-mul */
    SHAPE_SILU_MUL,     /* (p, i64, i64, p, i64) -> int */
    SHAPE_QUANT_X,      /* (p, i64, int, i64, i64, p, p, p) -> void: x's int8 blocks */
    SHAPE_QUANT_LINEAR, /* (int, p, p, p, i64, i64, p, i64, p, i64, int) -> int: GGUF blocks */
    SHAPE_QUANT_ROWS,   /* (int, p, i64, i64, p, i64, p, int) -> int: rows of GGUF blocks (embedding) */
    SHAPE_ARGMAX,       /* (p, i64, i64, i64, p) -> int: greedy_argmax.c's argmax_rows */
    SHAPE_KV_STORE,     /* no kernel: rows a[7] of k (a[2], stride a[3]) and v (a[4], stride a[5])
                           to key/value cache slots (a[0], a[1]), slot numbers at a[8], a[6] bytes */
    SHAPE_GATHER,       /* no kernel: a[4] rows of a[2] bytes to a[0] from rows idx[r] of a[1], the
                           int64 idx at a[3]; -1 (nothing copied) for an index outside [0, a[5]) */
    SHAPE_COUNT
};

typedef void *P;
typedef int64_t I;

static int kv_store(const I *a) {
    const int64_t *slots = (const int64_t *)a[8];
    for (I r = 0; r < a[7]; ++r) {
        memcpy((char *)a[0] + slots[r] * a[6], (const char *)a[2] + r * a[3], (size_t)a[6]);
        memcpy((char *)a[1] + slots[r] * a[6], (const char *)a[4] + r * a[5], (size_t)a[6]);
    }
    return 0;
}

static int gather(const I *a) {
    const int64_t *idx = (const int64_t *)a[3];
    for (I r = 0; r < a[4]; ++r)
        if (idx[r] < 0 || idx[r] >= a[5]) return -1;
    for (I r = 0; r < a[4]; ++r) memcpy((char *)a[0] + r * a[2], (const char *)a[1] + idx[r] * a[2], (size_t)a[2]);
    return 0;
}

static int call(const step_op *op, const I *a) {
    switch (op->shape) {
    case SHAPE_NORM:
        return ((int (*)(P, P, P, P, I, I, float))op->fn)((P)a[0], (P)a[1], (P)a[2], (P)a[3], a[4], a[5], op->f[0]);
    case SHAPE_ROTARY:
        return ((int (*)(P, I, I, P, I, I, I, P, P, P, P, I))op->fn)(
            (P)a[0], a[1], a[2], (P)a[3], a[4], a[5], a[6], (P)a[7], (P)a[8], (P)a[9], (P)a[10], a[11]);
    case SHAPE_DECODE:
        return ((int (*)(P, I, P, I, P, P, P, I, P, P, P, I, I, I, I, I, float, P))op->fn)(
            (P)a[0], a[1], (P)a[2], a[3], (P)a[4], (P)a[5], (P)a[6], a[7], (P)a[8], (P)a[9], (P)a[10], a[11],
            a[12], a[13], a[14], a[15], op->f[0], (P)a[16]);
    case SHAPE_LINEAR:
        return ((int (*)(P, I, I, P, I, I, P, P, I))op->fn)((P)a[0], a[1], a[2], (P)a[3], a[4], a[5], (P)a[6],
                                                             (P)a[7], a[8]);
    case SHAPE_SILU_FUSED:
        return ((int (*)(P, I, I, P, I, I, P, I))op->fn)((P)a[0], a[1], a[2], (P)a[3], a[4], a[5], (P)a[6], a[7]);
    case SHAPE_SILU_MUL:
        return ((int (*)(P, I, I, P, I))op->fn)((P)a[0], a[1], a[2], (P)a[3], a[4]);
    case SHAPE_QUANT_X:
        ((void (*)(P, I, int, I, I, P, P, P))op->fn)((P)a[0], a[1], (int)a[2], a[3], a[4], (P)a[5], (P)a[6],
                                                     (P)a[7]);
        return 0;
    case SHAPE_QUANT_LINEAR:
        return ((int (*)(int, P, P, P, I, I, P, I, P, I, int))op->fn)(
            (int)a[0], (P)a[1], (P)a[2], (P)a[3], a[4], a[5], (P)a[6], a[7], (P)a[8], a[9], (int)a[10]);
    case SHAPE_QUANT_ROWS:
        return ((int (*)(int, P, I, I, P, I, P, int))op->fn)((int)a[0], (P)a[1], a[2], a[3], (P)a[4], a[5], (P)a[6],
                                                             (int)a[7]);
    case SHAPE_ARGMAX:
        return ((int (*)(P, I, I, I, P))op->fn)((P)a[0], a[1], a[2], a[3], (P)a[4]);
    case SHAPE_KV_STORE:
        return kv_store(a);
    case SHAPE_GATHER:
        return gather(a);
    }
    return -1;
}

int step_op_bytes(void) { return (int)sizeof(step_op); }

static int run_op(const step_op *op, const int64_t *params) {
    I a[STEP_MAX_ARGS];
    memcpy(a, op->a, sizeof a);
    for (uint32_t m = op->per_step; m; m &= m - 1) {
        const int j = __builtin_ctz(m);
        a[j] = params[op->a[j]];
    }
    return call(op, a);
}

/* A team's meeting point: each thread waits until all have arrived, spinning (a wait is a
   kernel's imbalance or a few small ops of thread 0, microseconds: far shorter than a futex
   sleep and wake), then yielding the CPU between looks, so that where more threads than CPUs
   are runnable the one it waits for gets to run. */
#define SPINS_BEFORE_YIELD 2000
typedef struct {
    _Alignas(64) int arrived;
    _Alignas(64) int phase;
    _Alignas(64) int64_t failed_at; /* the first op that failed (INT64_MAX: none), and its return */
    int failed_rc;
} team_sync;

static void team_barrier(team_sync *s, int n) {
    const int phase = __atomic_load_n(&s->phase, __ATOMIC_RELAXED);
    if (__atomic_add_fetch(&s->arrived, 1, __ATOMIC_ACQ_REL) == n) {
        __atomic_store_n(&s->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->phase, phase + 1, __ATOMIC_RELEASE);
        return;
    }
    for (long spins = 0; __atomic_load_n(&s->phase, __ATOMIC_ACQUIRE) == phase; ++spins) {
        if (spins < SPINS_BEFORE_YIELD) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            syscall(SYS_sched_yield);
        }
    }
}

/* The whole program in one parallel region: every thread walks the ops, each kernel running
   the calling thread's share (threads.h's SHARED), the ops with no kernel on thread 0, and all
   meet after each op. A failure stops every thread after the same op: after op i's meeting
   each asks whether an op up to i failed, which a thread already past it cannot change. */
static int run_team(const step_op *ops, int64_t n, const int64_t *params, int64_t *failed_at) {
    team_sync sync = {0, 0, INT64_MAX, 0};
    OMP(omp parallel num_threads(kernel_nthreads))
    {
        const int tid = thread_id(), nt = team_threads();
        for (int64_t i = 0; i < n; ++i) {
            const step_op *op = &ops[i];
            const int rc = op->fn || tid == 0 ? run_op(op, params) : 0;
            if (rc) {
                int64_t first = __atomic_load_n(&sync.failed_at, __ATOMIC_RELAXED);
                while (i < first &&
                       !__atomic_compare_exchange_n(&sync.failed_at, &first, i, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
                }
                if (i <= first) __atomic_store_n(&sync.failed_rc, rc, __ATOMIC_RELAXED);
            }
            if (nt > 1) team_barrier(&sync, nt);
            if (__atomic_load_n(&sync.failed_at, __ATOMIC_RELAXED) <= i) break;
        }
    }
    if (sync.failed_at == INT64_MAX) return 0;
    *failed_at = sync.failed_at;
    return sync.failed_rc;
}

/* Runs ops[0..n) in order: as one team where `team` (every kernel called shares its work in a
   team: the Python side checks their team_kernels[]) and more than one thread is set, else one
   op after another on the calling thread. Returns 0, or the first non-zero return (a kernel
   refusing its arguments, -1 for an unknown shape) with its op's index in *failed_at. */
int run_step_program(const step_op *ops, int64_t n, const int64_t *params, int64_t *failed_at, int team) {
    if (team && kernel_nthreads > 1) return run_team(ops, n, params, failed_at);
    for (int64_t i = 0; i < n; ++i) {
        const int rc = run_op(&ops[i], params);
        if (rc) {
            *failed_at = i;
            return rc;
        }
    }
    return 0;
}
