/* Intel AMX tile setup, shared by linear_avx512.c and paged_prefill_amx.c (the loader inlines
   it): every kernel there uses 16-row x 64-byte tiles. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

/* Linux hands out AMX state only to a process that asks (ARCH_REQ_XCOMP_PERM, XTILEDATA):
   0 where it did (the grant is for the whole process). */
int amx_enable(void) { return syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 0 : -1; }

/* Tile state is per thread: each loads this before its first tile instruction. */
static void amx_configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 8; ++i) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
}
