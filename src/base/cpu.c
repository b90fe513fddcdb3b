/* cpu.c - instruction-set detection (CPUID + XGETBV), KWKER_ISA override, the decode kernels'
 * prefetch level (KWKER_PREFETCH) and whether the int8 ones prefetch (KWKER_PREFETCH_INT8),
 * whether the AVX2 quantized kernels use AVX-VNNI (KWKER_AVXVNNI) and the AVX-512 prompt tiles
 * AMX (KWKER_AMX, with the kernel's permission for its tile state), default thread count.
 * Any thread: detection runs once under pthread_once and the result is immutable afterwards. */
#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

/* What the CPU and OS offer, filled once by detect(). */
struct cpu_features {
    int avx2;     /* AVX2 + FMA + F16C, with YMM state saved by the OS */
    int avx512;   /* AVX-512 F/BW/VL/DQ, with ZMM/opmask state saved by the OS */
    int bf16;     /* AVX512_BF16: the attention table of 8-bit activations */
    int vnni;     /* AVX512_VNNI (noted for later kernels) */
    int avxvnni;  /* AVX-VNNI: vpdpbusd on ymm with a VEX encoding, no AVX-512 needed */
    int amx;      /* AMX-TILE + AMX-INT8 with XTILECFG / XTILEDATA enabled in XCR0 */
    int amx_bf16; /* and AMX-BF16 */
    int amd;      /* vendor AuthenticAMD or HygonGenuine (Zen cores) */
    int family;   /* CPUID family with its extended part: 0x19 Zen 3 / Zen 4, 0x1a Zen 5 */
};

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static struct cpu_features cpu;
static int isa_chosen = KWK_ISA_SCALAR;
static int prefetch_l2;
static int prefetch_forced = -1; /* KWKER_PREFETCH: 0 l1, 1 l2, -1 unset */
static double llc_bytes;         /* the last-level cache's size (0: unknown) */
static int prefetch_int8_avx512 = 1, prefetch_int8_avx2 = 1;
static int use_avxvnni;
static int use_amx;
static int use_amx_bf16; /* use_amx, AMX-BF16 and AVX512_BF16: the act8 attention on AMX */
static int use_amx_preserve; /* use_amx_bf16 and KWKER_AMX_PRESERVE=on: preserve's products */
static int use_amx_preserve_pack; /* use_amx_bf16 and not KWKER_AMX_PRESERVE=off: its packs */

/* The last-level cache the CPUs this process may run on can fill (llc.c), or where Linux does
 * not describe its caches, what the CPU (or the hypervisor) reports through glibc; 0: unknown. */
static double llc_of_process(void)
{
    int *cpus, n = kwk_affinity_cpus(&cpus);
    double bytes = n > 0 ? kwk_llc_bytes_from("/sys/devices/system/cpu", cpus, n) : 0.0;
    free(cpus);
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (bytes <= 0) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        bytes = l3 > 0 ? (double)l3 : 0.0;
    }
#endif
    return bytes;
}

/* XCR0: which register states the OS saves on context switch. Only valid when OSXSAVE is set. */
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect_features(struct cpu_features *f)
{
    unsigned a, b, c, d;
    memset(f, 0, sizeof *f);
    if (__get_cpuid(0, &a, &b, &c, &d)) {
        char vendor[13];
        memcpy(vendor, &b, 4);
        memcpy(vendor + 4, &d, 4);
        memcpy(vendor + 8, &c, 4);
        vendor[12] = 0;
        f->amd = !strcmp(vendor, "AuthenticAMD") || !strcmp(vendor, "HygonGenuine");
    }
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d))
        return;
    f->family = (a >> 8) & 0xf;
    if (f->family == 0xf)
        f->family += (a >> 20) & 0xff;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return;
    uint64_t xcr0 = xgetbv0();
    /* bits 1,2: SSE and YMM upper halves; bits 5,6,7: opmask, ZMM0-15 upper, ZMM16-31. */
    int os_ymm = (xcr0 & 0x6) == 0x6;
    int os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    int avx2 = (b >> 5) & 1;
    int avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1, avx512bw = (b >> 30) & 1,
        avx512vl = (b >> 31) & 1;
    f->vnni = (c >> 11) & 1;
    f->avx2 = avx2 && fma && f16c && os_ymm;
    f->avx512 = f->avx2 && avx512f && avx512dq && avx512bw && avx512vl && os_zmm;
    if (!f->avx512)
        f->vnni = 0;
    /* EDX bits 24, 25: AMX-TILE, AMX-INT8; XCR0 bits 17, 18: the tile config and data states */
    f->amx = f->avx512 && f->vnni && ((d >> 24) & 1) && ((d >> 25) & 1) &&
             (xcr0 & 0x60000) == 0x60000;
    f->amx_bf16 = f->amx && ((d >> 22) & 1); /* EDX bit 22 */
    unsigned a1, b1, c1, d1;
    if (f->avx2 && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) {
        f->avxvnni = (a1 >> 4) & 1;
        f->bf16 = f->avx512 && ((a1 >> 5) & 1);
    }
}

/* Linux keeps AMX's 8 KiB tile state out of every process until it asks (since 5.16): without
 * the permission the first tile instruction is a SIGILL. Asked once for the whole process. */
static int amx_permitted(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

static void detect(void)
{
    detect_features(&cpu);
    int best = cpu.avx512 ? KWK_ISA_AVX512 : cpu.avx2 ? KWK_ISA_AVX2 : KWK_ISA_SCALAR;
    int isa = best;
    static const char *const on_off[] = {"on", "off"};
    static const char *const isas[] = {"scalar", "avx2", "avx512"}; /* enum kwk_isa */
    int want = kwk_env_word("KWKER_ISA", isas, 3);
    if (want > best)
        kwk_log(KWK_LOG_WARN, "KWKER_ISA=%s is not supported here; using %s", isas[want],
                kwk_isa_name(best));
    else if (want >= 0)
        isa = want;
    isa_chosen = isa;
    /* Decode tiles prefetch the weights they read a few hundred bytes later. On Zen 4 (an AMD
     * EPYC VM, session 10) asking for them in L2 rather than L1 made generation 30-38% faster
     * (SmolLM2-135M / 360M, int4 and balanced, interleaved runs): L1 prefetches of four
     * streams crowd its 32 KiB. On an Intel Xeon (Sapphire Rapids class, session 8) L2 measured
     * 2-9% slower (interleaved processes, a noisy host), so other vendors keep L1 by default; a
     * model larger than the last-level cache goes to L2 everywhere (kwk_cpu_prefetch_l2_for:
     * 2-3.5% faster token by token on a later Xeon, session 34). */
    prefetch_l2 = cpu.amd;
    int pf = kwk_env_word("KWKER_PREFETCH", (const char *const[]){"l1", "l2"}, 2);
    if (pf >= 0)
        prefetch_l2 = prefetch_forced = pf;
    llc_bytes = llc_of_process();
    /* Zen 5 (family 1Ah, full-width AVX-512 datapaths): with the AVX-512 int8 decode tile's
     * prefetches off (two requests a line it loads: its blocks' group 4 ahead and the next
     * tile's), the hardware prefetcher alone, a balanced token took 7-22% less time at 8-bit
     * activations (one dot product per 64 bytes of weights) and 0-3% at 16-bit; int4 and int6
     * tiles took up to 19% more without theirs, the AVX2 int8 tile 32-46% more (session 20,
     * token by token, docs/benchmarks.md). Later AMD families are assumed alike until measured. */
    if (cpu.amd && cpu.family >= 0x1a)
        prefetch_int8_avx512 = 0;
    int p8 = kwk_env_word("KWKER_PREFETCH_INT8", on_off, 2);
    if (p8 >= 0)
        prefetch_int8_avx512 = prefetch_int8_avx2 = p8 == 0;
    /* AVX-VNNI does the AVX2 kernels' int8 dot products in one instruction instead of four, to
     * the same sums; KWKER_AVXVNNI=off keeps maddubs (what an AVX2-only CPU runs). */
    use_avxvnni = cpu.avxvnni;
    int vn = kwk_env_word("KWKER_AVXVNNI", on_off, 2);
    if (vn == 1)
        use_avxvnni = 0;
    else if (vn == 0 && !cpu.avxvnni)
        kwk_log(KWK_LOG_WARN, "KWKER_AVXVNNI=on: this CPU has no AVX-VNNI; ignored");
    /* AMX's tile multiply takes the AVX-512 prompt tiles' integer dot products (the same
     * integers, so the same numbers); KWKER_AMX=off keeps them on vpdpbusd. Only when the
     * AVX-512 table is chosen: KWKER_ISA=avx2 or scalar runs what those CPUs run. */
    int am = kwk_env_word("KWKER_AMX", on_off, 2);
    if (am == 0 && !cpu.amx)
        kwk_log(KWK_LOG_WARN, "KWKER_AMX=on: this CPU (or OS) has no AMX-INT8; ignored");
    if (cpu.amx && am != 1 && isa == KWK_ISA_AVX512) {
        use_amx = amx_permitted();
        if (!use_amx)
            kwk_log(KWK_LOG_WARN, "AMX: the kernel refused the tile state (arch_prctl); "
                                  "prompts run on AVX-512 VNNI");
    }
    use_amx_bf16 = use_amx && cpu.amx_bf16 && cpu.bf16;
    /* Preserve's bf16 products on AMX-BF16: every product still exact, but their sums in the
     * tile unit's order (not the FMA chains of the vector tables). Packed in tile order
     * (bf16t.h, amx_bf16t.c) prompts run 2-3x as fast and a generated token about as fast as
     * on the vector tables, so that is the default where preserve packs (a pack cache).
     * Row-major in place (amx_bf16.c) a generated token is 3-27% slower (docs/benchmarks.md,
     * sessions 28-31): asked for with KWKER_AMX_PRESERVE=on; =off keeps both off. */
    int ap = kwk_env_word("KWKER_AMX_PRESERVE", on_off, 2);
    use_amx_preserve = ap == 0 && use_amx_bf16;
    use_amx_preserve_pack = ap != 1 && use_amx_bf16;
    if (ap == 0 && !use_amx_bf16)
        kwk_log(KWK_LOG_WARN, "KWKER_AMX_PRESERVE=on: no AMX-BF16 in use here (CPU, OS, "
                              "KWKER_ISA or KWKER_AMX); ignored");
    kwk_log(KWK_LOG_INFO,
            "kernels: %s (cpu: avx2=%d avxvnni=%d avx512=%d bf16=%d vnni=%d amx=%d amd=%d "
            "family=%#x), prefetch to %s, int8 decode prefetch: avx512 %s, avx2 %s, avx2 dot "
            "products: %s, prompt tiles: %s, bf16 attention: %s, preserve products: %s",
            kwk_isa_name(isa), cpu.avx2, cpu.avxvnni, cpu.avx512, cpu.bf16, cpu.vnni, cpu.amx,
            cpu.amd, cpu.family, prefetch_l2 ? "L2" : "L1", prefetch_int8_avx512 ? "on" : "off",
            prefetch_int8_avx2 ? "on" : "off", use_avxvnni ? "avx-vnni" : "maddubs",
            use_amx ? "amx" : "vector",
            use_amx_bf16                          ? "amx"
            : isa == KWK_ISA_AVX512 && cpu.bf16 ? "vector"
                                                : "none",
            use_amx_preserve ? "amx" : use_amx_preserve_pack ? "amx-packed" : "vector");
}

int kwk_isa(void)
{
    pthread_once(&isa_once, detect);
    return isa_chosen;
}

int kwk_cpu_prefetch_l2(void)
{
    pthread_once(&isa_once, detect);
    return prefetch_l2;
}

int kwk_cpu_prefetch_l2_for(double bytes)
{
    pthread_once(&isa_once, detect);
    if (prefetch_forced >= 0)
        return prefetch_forced;
    return prefetch_l2 || kwk_cpu_past_llc(bytes);
}

int kwk_cpu_past_llc(double bytes)
{
    pthread_once(&isa_once, detect);
    return llc_bytes > 0 && bytes > llc_bytes;
}

double kwk_cpu_llc_bytes(void)
{
    pthread_once(&isa_once, detect);
    return llc_bytes;
}

int kwk_cpu_prefetch_int8(int isa)
{
    pthread_once(&isa_once, detect);
    return isa == KWK_ISA_AVX512 ? prefetch_int8_avx512 : prefetch_int8_avx2;
}

int kwk_cpu_avxvnni(void)
{
    pthread_once(&isa_once, detect);
    return use_avxvnni;
}

int kwk_cpu_amx(void)
{
    pthread_once(&isa_once, detect);
    return use_amx;
}

int kwk_cpu_amx_bf16(void)
{
    pthread_once(&isa_once, detect);
    return use_amx_bf16;
}

int kwk_cpu_amx_preserve(void)
{
    pthread_once(&isa_once, detect);
    return use_amx_preserve;
}

int kwk_cpu_amx_preserve_pack(void)
{
    pthread_once(&isa_once, detect);
    return use_amx_preserve_pack;
}

int kwk_cpu_bf16(void)
{
    pthread_once(&isa_once, detect);
    return cpu.bf16;
}

const char *kwk_isa_name(int isa)
{
    switch (isa) {
    case KWK_ISA_SCALAR: return "scalar";
    case KWK_ISA_AVX2: return "avx2";
    case KWK_ISA_AVX512: return "avx512";
    default: return "unknown";
    }
}

int kwk_default_threads(void)
{
    int *cpus, n = kwk_affinity_cpus(&cpus); /* any number of CPUs, not cpu_set_t's 1024 */
    free(cpus);
    if (n < 1) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    return n;
}
