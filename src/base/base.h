/* base.h - errors, memory, files: the small helpers every module uses. Any thread. */
#ifndef KWK_BASE_H
#define KWK_BASE_H

#include <stddef.h>
#include <stdint.h>

#include "kwker.h"

#define KWK_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KWK_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KWK_MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define KWK_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KWK_PRINTF(f, a)
#endif

/* Fill err (which may be NULL) with code and a formatted message; returns code so callers can
 * write `return kwk_err_set(err, KWK_EFORMAT, "%s: ...", path);`. pos is set to -1. */
int kwk_err_set(struct kwk_err *err, int code, const char *fmt, ...) KWK_PRINTF(3, 4);
/* Same, with a byte position (parsers). */
int kwk_err_set_pos(struct kwk_err *err, int code, int64_t pos, const char *fmt, ...)
    KWK_PRINTF(4, 5);
void kwk_err_clear(struct kwk_err *err);

/* Overflow-checked size arithmetic: return 0 and store the result, or -1 on overflow. */
static inline int kwk_mul_size(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* The value of an ASCII hex digit, or -1. */
static inline int kwk_hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static inline int kwk_add_size(size_t a, size_t b, size_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* Allocation goes through these so tests can fail the Nth allocation (kwk_alloc_fail_after). */
void *kwk_malloc(size_t n);
void *kwk_calloc(size_t count, size_t size);
void *kwk_realloc(void *p, size_t n);
void kwk_free(void *p);
char *kwk_strdup(const char *s);
/* Memory for kernels: aligned to 64 bytes, freed with kwk_free_aligned. */
void *kwk_malloc_aligned(size_t n);
void kwk_free_aligned(void *p);
/* Ask for small pages on the whole pages inside [p, p + n) of a kwk_malloc_aligned buffer that
 * fills gradually (a KV cache): with huge pages its first touch anywhere in 2 MiB makes all of
 * them resident. Advice only. */
void kwk_mem_small_pages(void *p, size_t n);
/* Test hook: make the nth allocation from now fail (n >= 1), or never (n = 0). Not thread-safe. */
void kwk_alloc_fail_after(long n);

/* Which file, as it was when opened: fstat's device, inode, size and times (nanoseconds since
 * the epoch). Any write through the file system changes ctime, so two equal ids taken a while
 * apart name the same bytes (kwk_file_id_settled says how long a while is). All zero: unknown. */
struct kwk_file_id {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns;
};

/* A read-only memory map of a whole file. */
struct kwk_map {
    const uint8_t *data;
    size_t size;
    struct kwk_file_id id; /* of the file mapped (from the descriptor that mapped it) */
};

/* Map path read-only. Returns 0 or a negative code with err naming the path. An empty file maps
 * to data=NULL, size=0 (returned as success; callers decide if that is an error). */
int kwk_map_file(struct kwk_map *m, const char *path, struct kwk_err *err);
/* Whether id's times are at least a second before now: a write in the same tick of the kernel's
 * coarse clock as the last one leaves ctime unchanged, so only an id older than that can stand
 * for the file's bytes (git's "racily clean" rule). 0 for an unknown id. */
int kwk_file_id_settled(const struct kwk_file_id *id);
void kwk_unmap(struct kwk_map *m);
/* Drop the mapping's pages from this process's resident memory (they are read from the file
 * again if touched): for checkpoints whose matrices were repacked and are no longer read. */
void kwk_map_release(const struct kwk_map *m);
/* Back a mapping of path read on every token with 2 MiB pages where the kernel and file system
 * allow it, reading the file in (and, when the page cache holds it in small pages, evicting and
 * reading it again: hugemap.c says when and why; KWKER_HUGE_PAGES=0 leaves the page cache
 * alone). Always reads the mapping in. Returns 1 when at least half of it is now on huge pages,
 * else 0. Advice: the contents never change, and failure leaves the mapping as it was. */
int kwk_map_huge(const struct kwk_map *m, const char *path);

/* Read a whole file into a NUL-terminated heap buffer of at most limit bytes. */
int kwk_read_file(const char *path, size_t limit, char **out, size_t *n, struct kwk_err *err);

int kwk_file_exists(const char *path);
int kwk_dir_exists(const char *path);
/* Join dir and name into out[cap]; KWK_ELIMIT when it does not fit. */
int kwk_path_join(char *out, size_t cap, const char *dir, const char *name);

/* bf16 / f16 to f32 (exact widening). */
static inline float kwk_bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
float kwk_f16_to_f32(uint16_t h);

/* Logging to stderr, level from KWKER_LOG=error|warn|info|debug (default warn). Thread-safe. */
enum { KWK_LOG_ERROR = 0, KWK_LOG_WARN = 1, KWK_LOG_INFO = 2, KWK_LOG_DEBUG = 3 };
void kwk_log(int level, const char *fmt, ...) KWK_PRINTF(2, 3);

/* A switch from the environment: the index of name's value in words[n]; -1 when it is unset or
 * empty, and (with a warning that names the choices) when it is none of them. */
int kwk_env_word(const char *name, const char *const *words, int n);

/* Monotonic seconds. */
double kwk_time_s(void);

/* Where decode kernels' software prefetches of the next weights go: 1 for L2 (PREFETCHT1), 0
 * for L1 (PREFETCHT0). Which is faster depends on the core, measured per vendor (cpu.c);
 * KWKER_PREFETCH=l1|l2 overrides. Detected once; any thread. */
int kwk_cpu_prefetch_l2(void);

/* The same choice for a model whose generated token reads `bytes` of weights: L2 where the CPU's
 * default says so, and also where they are more than the last-level cache holds (they stream
 * from DRAM: an Intel Xeon with a 300 MiB L3 generated 2-3.5% faster so on SmolLM2-1.7B and
 * Qwen2.5-0.5B, and 5% slower so on SmolLM2-135M, whose weights its L3 holds; session 34);
 * KWKER_PREFETCH=l1|l2 overrides both. Any thread. */
int kwk_cpu_prefetch_l2_for(double bytes);

/* Whether `bytes` are more than the last-level cache holds (kwk_cpu_llc_bytes); 0 where its
 * size is unknown. Any thread. */
int kwk_cpu_past_llc(double bytes);

/* Bytes of last-level cache the CPUs this process may run on can fill: each instance of the
 * highest-level cache among them once, as Linux describes them (kwk_llc_bytes_from on
 * /sys/devices/system/cpu), else sysconf(_SC_LEVEL3_CACHE_SIZE); 0 where neither says.
 * Detected once; any thread. */
double kwk_cpu_llc_bytes(void);

/* llc.c. Bytes of a cache's size as sysfs writes it ("32768K", "1M", "512", a newline after):
 * -1 for anything else. */
long long kwk_cache_size_parse(const char *s);
/* The sum of the sizes of the distinct instances (by the first CPU of their shared_cpu_list) of
 * the highest-level data or unified cache of cpus[0..n_cpus) under root (a tree laid out as
 * /sys/devices/system/cpu: cpuN/cache/indexI/{level,type,size,shared_cpu_list}); CPUs whose
 * last level differs from the first one's are left out. 0 when none is described. */
double kwk_llc_bytes_from(const char *root, const int *cpus, int n_cpus);
/* Marks mark[c] = 1 for every CPU c < n_mark of a Linux CPU list ("0-3,8,10-11", a newline
 * after or not): 0, or -1 (nothing marked) where s is not such a list. */
int kwk_cpu_list_mark(const char *s, unsigned char *mark, int n_mark);
/* The CPUs this process may run on (sched_getaffinity, sized for any number of CPUs), ascending,
 * into a malloc'd *cpus: their count, or -1 (*cpus NULL) where it cannot tell. */
int kwk_affinity_cpus(int **cpus);

/* Whether the int8 decode tiles of an ISA's kernels (KWK_ISA_AVX2 or KWK_ISA_AVX512) prefetch
 * at all: not AVX-512's on AMD Zen 5 and later, where the hardware prefetcher alone reads
 * faster (cpu.c). KWKER_PREFETCH_INT8=on|off overrides for both. Detected once; any thread. */
int kwk_cpu_prefetch_int8(int isa);

/* Whether the AVX2 quantized matmul uses AVX-VNNI (vpdpbusd on ymm registers; the same sums as
 * maddubs + madd, in a quarter of the instructions): the CPU has it and KWKER_AVXVNNI is not
 * "off" (on|off; "on" where the CPU lacks it is warned about and ignored). Detected once; any
 * thread. */
int kwk_cpu_avxvnni(void);

/* Whether the AVX-512 prompt tiles of the quantized matmul use AMX (Intel Xeon since Sapphire
 * Rapids: the tile multiply, the same integer sums as vpdpbusd): the CPU has AMX-TILE and
 * AMX-INT8, the OS granted the tile state, kwk_isa() chose AVX-512 and KWKER_AMX is not "off"
 * (on|off). Detected once; any thread. */
int kwk_cpu_amx(void);

/* Whether the attention of 8-bit-activation decoders runs its bf16 products on AMX
 * (kwk_attn_amx_bf16): kwk_cpu_amx(), the CPU has AMX-BF16 and AVX512_BF16. KWKER_AMX=off
 * declines it too. Detected once; any thread. */
int kwk_cpu_amx_bf16(void);

/* Whether the AVX-512 table multiplies row-major bf16 matrices (preserve reading a checkpoint
 * in place) on AMX-BF16 (amx_bf16.c: exact products, summed in the tile unit's order):
 * kwk_cpu_amx_bf16() and KWKER_AMX_PRESERVE=on (on|off; unset, only packs take AMX:
 * kwk_cpu_amx_preserve_pack; "on" where it cannot be is warned about and ignored). Detected
 * once; any thread. */
int kwk_cpu_amx_preserve(void);

/* Whether preserve packs bf16 matrices in AMX tile order (KWK_W_BF16T, kernels/bf16t.h) for the
 * AVX-512 table where it packs (a pack cache): kwk_cpu_amx_bf16() and KWKER_AMX_PRESERVE not
 * "off" (the default). Detected once; any thread. */
int kwk_cpu_amx_preserve_pack(void);

/* Whether the CPU has AVX512_BF16 (vdpbf16ps) and AVX-512 is usable (not whether kwk_isa()
 * chose it). Detected once; any thread. */
int kwk_cpu_bf16(void);

#endif
